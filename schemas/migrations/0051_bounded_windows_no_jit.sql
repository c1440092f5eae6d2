-- 0051 Bounded replay windows; no JIT in the jobs functions that disable sequential scans
-- (a review of retention).
-- * consumers.replay_windows took any finite window: one process declaring 1e12 s made every
--   reserve of that consumer fail (22008, timestamp out of range: poisoned as
--   data_exception), its inbox prune fail, and jobs.prune refuse every worker's retention.
--   A window and its margin are now at most 100 years (schemas.settings.MAX_DURATION_S, as
--   the settings and Consumer say), and a promise a lowering declaration keeps (the horizon
--   it replaced, until when) at most two: declared before, such a window is brought to a
--   century with its promises (left as it was, the next declaration lowered from it and
--   promised its horizon until the year 33715).
-- * The functions that SET enable_seqscan = off have plans costed past jit_above_cost by
--   the disabled scans' penalty: jobs.prune compiled its plans on every call (about 170 ms
--   against 1 ms without, on an empty database), with its batch's row locks held.
UPDATE consumers.replay_windows
SET replay_window_s = LEAST(replay_window_s, 3153600000), margin_s = LEAST(margin_s, 3153600000)
WHERE replay_window_s > 3153600000 OR margin_s > 3153600000;

UPDATE consumers.replay_promises
SET horizon_s = 6307200000, until = LEAST(until, now() + interval '6307200000 seconds')
WHERE horizon_s > 6307200000;

ALTER TABLE consumers.replay_windows
    ADD CONSTRAINT replay_windows_bounded
    CHECK (replay_window_s <= 3153600000 AND margin_s <= 3153600000);

ALTER TABLE consumers.replay_promises
    ADD CONSTRAINT replay_promises_bounded CHECK (horizon_s <= 6307200000);

ALTER FUNCTION jobs.prune(double precision, double precision, integer) SET jit = off;
ALTER FUNCTION jobs.claim(text, text, double precision, integer) SET jit = off;
ALTER FUNCTION jobs.authority_hold(text, bigint, boolean) SET jit = off;
ALTER FUNCTION jobs.succeed_many(bigint[], text[], text[], text[], text[], uuid[], bigint[], bigint[]) SET jit = off;
ALTER FUNCTION jobs.tenant_frozen_sync() SET jit = off;
ALTER FUNCTION jobs.workflow_effects_sync() SET jit = off;
