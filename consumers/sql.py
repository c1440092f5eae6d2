"""SQL owned by the consumers package. Values only as $n parameters; never SQL built from values."""

# Reserve an operation and log its delivery as 'new' in one round trip. The too-old verdict
# uses the statement's clock, so a row pruned by retention can never come back as new, and the
# lesser of this process's window ($9) and its consumer's declared one (migration 0028): what
# any process of the consumer admits, every process keeps (PRUNE_INBOX keeps the greater of
# the two horizons). LEAST skips a NULL: with no declaration, the process's own. Nothing
# older than the declaration's admit_from is admitted either (0046: since a raise of the
# window, what lay past the old one may be pruned). An event dated more than $13 s ahead of
# the statement's clock (the prune margin) is refused too: its inbox row and its job's key
# would not outlive its redeliveries.
RESERVE = """
WITH verdict AS (
    SELECT $8::timestamptz < statement_timestamp() - make_interval(secs => w.s)
               OR coalesce($8::timestamptz < w.admit_from, false) AS too_old,
           $8::timestamptz > statement_timestamp() + make_interval(secs => $13::float8)
               AS too_new,
           w.s AS window_s
    FROM (SELECT LEAST($9::float8, d.window_s) AS s, d.admit_from
          FROM (SELECT) AS one
          LEFT JOIN consumers.replay_horizons d ON d.consumer = $2) AS w
), reserved AS (
    INSERT INTO consumers.inbox
        (tenant, consumer, operation_id, event_id, digest, event_type, version, occurred_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8 FROM verdict
    WHERE NOT verdict.too_old AND NOT verdict.too_new
    ON CONFLICT DO NOTHING
    RETURNING 1
), delivered AS (
    INSERT INTO consumers.deliveries
        (tenant, consumer, operation_id, event_id, publish_id, redelivered, delivery_count,
         outcome)
    SELECT $1, $2, $3, $4, $10, $11, $12, 'new' FROM reserved
)
SELECT EXISTS (SELECT 1 FROM reserved) AS fresh, verdict.too_old, verdict.too_new,
       verdict.window_s
FROM verdict
"""

# Reserve a batch of operations in one round trip; returns the ordinals newly reserved (the
# first arrival of each). Rows are inserted in key order so concurrent batches lock alike. The
# window admitted is RESERVE's: the lesser of the process's ($12) and the declared one, from
# the declaration's admit_from at the earliest, and no event dated more than $13 s ahead.
RESERVE_MANY = """
WITH incoming AS (
    SELECT * FROM unnest(
        $1::text[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::int[],
        $7::timestamptz[], $8::text[], $9::bool[], $10::int[]
    ) WITH ORDINALITY AS t(tenant, operation_id, event_id, digest, event_type, version,
                          occurred_at, publish_id, redelivered, delivery_count, n)
), admitted AS (
    SELECT * FROM incoming
    -- One read of the declaration (GREATEST and LEAST skip a NULL: none, or no admit_from).
    WHERE occurred_at >= (
        SELECT GREATEST(statement_timestamp() - make_interval(secs => LEAST($12::float8,
                                                                             d.window_s)),
                        d.admit_from)
        FROM (SELECT) AS one LEFT JOIN consumers.replay_horizons d ON d.consumer = $11)
      AND occurred_at <= statement_timestamp() + make_interval(secs => $13::float8)
), reserved AS (
    INSERT INTO consumers.inbox
        (tenant, consumer, operation_id, event_id, digest, event_type, version, occurred_at)
    SELECT tenant, $11, operation_id, event_id, digest, event_type, version, occurred_at
    FROM admitted
    ORDER BY tenant, operation_id, n
    ON CONFLICT DO NOTHING
    RETURNING tenant, operation_id, event_id, digest
), first_arrival AS (
    -- The copy whose row went in: admitted by the window, with the digest stored (a copy
    -- refused by the window, or with other content, is judged by reserve afterwards).
    SELECT min(i.n) AS n
    FROM reserved AS r
    JOIN admitted AS i USING (tenant, operation_id, event_id, digest)
    GROUP BY r.tenant, r.operation_id
), delivered AS (
    INSERT INTO consumers.deliveries
        (tenant, consumer, operation_id, event_id, publish_id, redelivered, delivery_count,
         outcome)
    SELECT i.tenant, $11, i.operation_id, i.event_id, i.publish_id, i.redelivered,
           i.delivery_count, 'new'
    FROM first_arrival AS f JOIN incoming AS i USING (n)
)
SELECT n FROM first_arrival
"""

# The inbox rows that collide with an incoming event: its operation, or its event id.
# Two lookups (one per unique index) rather than an OR that would scan the consumer's rows.
COLLISIONS = """
SELECT operation_id, event_id, digest
FROM consumers.inbox
WHERE tenant = $1 AND consumer = $2 AND operation_id = $3
UNION
SELECT operation_id, event_id, digest
FROM consumers.inbox
WHERE tenant = $1 AND consumer = $2 AND event_id = $4
"""

# Log one delivery's identity and inbox outcome (duplicates, and conflicts with poison).
RECORD_DELIVERY = """
INSERT INTO consumers.deliveries
    (tenant, consumer, operation_id, event_id, publish_id, redelivered, delivery_count, outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
"""

# Each consumer's declared replay window, prune margin and effective horizon (0028), with how
# long ago it declared them (accord status).
REPLAY_WINDOWS = """
SELECT w.consumer, w.replay_window_s, w.margin_s, h.horizon_s,
       EXTRACT(EPOCH FROM now() - w.declared_at)::float8 AS declared_age_s
FROM consumers.replay_windows w JOIN consumers.replay_horizons h USING (consumer)
ORDER BY w.consumer
"""

# Declare consumer $1's replay window $2 and prune margin $3 (consumers.declare_window,
# migration 0027): jobs.prune and consumers.prune_poison never go inside the horizon.
DECLARE_WINDOW = "SELECT consumers.declare_window($1, $2, $3)"

# Delete one bounded batch of consumer $3's inbox rows past the retention horizon (oldest
# first): the greater of this process's ($1) and the consumer's effective one (0028: the
# declared one, or the longer one a lowering declaration replaced, while it lasts), so that a
# process of the consumer with a longer window never finds its rows gone. Another consumer's
# rows are its own pruner's, by its own window.
PRUNE_INBOX = """
WITH doomed AS (
    SELECT ctid FROM consumers.inbox
    WHERE consumer = $3
      AND GREATEST(first_seen_at, occurred_at) < now() - make_interval(secs => GREATEST(
          $1::float8,
          (SELECT h.horizon_s FROM consumers.replay_horizons h WHERE h.consumer = $3)))
    ORDER BY GREATEST(first_seen_at, occurred_at)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM consumers.inbox AS i USING doomed WHERE i.ctid = doomed.ctid
"""

# Delete one bounded batch of consumer $3's delivery log rows past the retention horizon
# (oldest first): the greater of this process's horizon ($1) and its consumer's effective
# one, as PRUNE_INBOX (before, the process's own: a process with a shorter window trimmed
# the log, and the conflicts counted in it, that the consumer's declaration still kept).
PRUNE_DELIVERIES = """
WITH doomed AS (
    SELECT id FROM consumers.deliveries
    WHERE consumer = $3
      AND received_at < now() - make_interval(secs => GREATEST(
          $1::float8,
          (SELECT h.horizon_s FROM consumers.replay_horizons h WHERE h.consumer = $3)))
    ORDER BY received_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM consumers.deliveries AS d USING doomed WHERE d.id = doomed.id
"""

# Record one poisoned message: typed reason, identifiers, header summary, body size and hash,
# move id; its id and whether it was written. One record per decision (0057): a redelivered
# message this consumer already recorded in the same life (publish id, body hash, message
# id, move id) had its reject lost after that record's commit: nothing is written.
RECORD_POISON = """
SELECT poison_id, written FROM consumers.record_poison(
    $1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14, $15, $16)
"""

# Inbox decisions received at or after $1, by consumer, tenant and outcome (new, duplicate =
# a healthy retry, conflict). The consumers found by a loose scan of deliveries_received_idx
# (one probe each), then each one's range from $1 on the same index: the rows in the window,
# never the retained rest (0040).
DELIVERY_COUNTS = """
WITH RECURSIVE consumers_seen AS (
    (SELECT d.consumer FROM consumers.deliveries d ORDER BY d.consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT d.consumer FROM consumers.deliveries d
            WHERE d.consumer > c.consumer ORDER BY d.consumer LIMIT 1)
    FROM consumers_seen c WHERE c.consumer IS NOT NULL
)
SELECT c.consumer, x.tenant, x.outcome, x.deliveries
FROM consumers_seen c
CROSS JOIN LATERAL (
    SELECT d.tenant, d.outcome, count(*)::bigint AS deliveries
    FROM consumers.deliveries d
    WHERE d.consumer = c.consumer AND d.received_at >= $1
    GROUP BY d.tenant, d.outcome
) x
ORDER BY 1, 2, 3
"""

# Conflicts among all retained deliveries, through deliveries_conflict_idx (conflicts only).
CONFLICT_COUNT = """
SELECT count(*)::bigint FROM consumers.deliveries WHERE outcome = 'conflict'
"""

# Poison records by consumer and typed reason.
POISON_COUNTS = """
SELECT consumer, reason, count(*)::bigint AS messages,
       EXTRACT(EPOCH FROM now() - min(created_at))::float8 AS oldest_age_s
FROM consumers.poison
GROUP BY consumer, reason
ORDER BY consumer, reason
"""

# First in every transaction of a projection's consumer: projection $1's rebuild guard, shared,
# if free (false: a rebuild holds it, or waits for it). `accord replay --rebuild` takes the
# same key exclusively (accord.ops.sql.REBUILD_GUARD) for its snapshot and its reset, so each
# of this consumer's transactions commits either before the snapshot (its event is read and
# applied again) or after the reset (its rows stay). Not waited for in the statement: a
# rebuild's first batch may outlast any statement timeout, and the wait is no message's fault.
PROJECTION_GUARD = "SELECT pg_try_advisory_xact_lock_shared(1633903460, hashtext($1))"

# The delivery's process-span context for this transaction only (read by jobs.submit: 0018).
SET_TRACE = "SELECT set_config('accord.trace', $1, true)"

# Delete one bounded batch of at most $3 of consumer $1's poison records older than $2 seconds
# (oldest first; consumers.prune_poison, the consumer role's only way to remove one); the count.
PRUNE_POISON = "SELECT consumers.prune_poison($1, $2, $3)"

# The oldest enqueue time every consumer still admits, by the strictest of window $1 and
# each consumer's declared one, less a margin for a release's publish, and the latest
# admit_from (consumers.admit_floor, 0056; NULL: nothing to go by).
ADMIT_FLOOR = "SELECT consumers.admit_floor($1::float8)"
