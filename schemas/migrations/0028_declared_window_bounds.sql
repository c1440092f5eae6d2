-- 0028 the declared window bounds every process of a consumer. Two processes of one consumer
-- may run with different windows (a rolling deploy that changes it), and the last declaration
-- stands (0027). Until now each process admitted and pruned by its own window alone: one with
-- a shorter window pruned inbox rows that one with a longer window still admitted events for,
-- and that event then came back as new. Now a process admits no event older than the lesser
-- of its own window and the declared one (consumers/sql.py RESERVE, RESERVE_MANY), and prunes
-- no inbox row younger than the greater of its own horizon and the declared one
-- (PRUNE_INBOX): whatever any process admits, every process keeps. The consumer role reads
-- the declared windows for it (not who declared them).
GRANT SELECT (consumer, replay_window_s, margin_s) ON consumers.replay_windows TO accord_consumer;
