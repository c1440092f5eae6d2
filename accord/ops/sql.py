"""SQL of the operational view: named, read-only statements (replay's ledger writes last).

Every status statement runs inside one REPEATABLE READ read-only transaction
(``accord.ops.status.collect_status``), so ``now()`` is one instant and all figures come from
one snapshot. Ages are seconds since a job was created (``created_at``), an effect was begun,
a row was enqueued or a poison record was written; identifiers, states, typed reasons and
revisions only, never payload columns.
"""

# The snapshot's instant (the transaction's now()).
NOW = "SELECT now() AS now"

# Jobs by (state, tenant, workflow) for the states in $1: count, oldest age, attempts, and how
# many were last returned by rescue (rescue writes last_error = lease_expired | epoch_rotated).
JOB_GROUPS = """
SELECT j.state, j.tenant, j.workflow,
       count(*)::bigint AS jobs,
       EXTRACT(EPOCH FROM now() - min(j.created_at))::float8 AS oldest_age_s,
       COALESCE(sum(j.attempts), 0)::bigint AS attempts,
       count(*) FILTER (WHERE j.last_error IN ('lease_expired', 'epoch_rotated'))::bigint
           AS rescued
FROM (SELECT * FROM jobs.jobs WHERE state = 'queued'
      UNION ALL SELECT * FROM jobs.jobs WHERE state = 'running'
      UNION ALL SELECT * FROM jobs.jobs
                WHERE state IN ('poison', 'unknown', 'canceled', 'held')) j
WHERE j.state = ANY ($1::text[])
GROUP BY j.state, j.tenant, j.workflow
ORDER BY j.state, j.tenant, j.workflow
"""  # Each branch matches one partial index's predicate (jobs_claimable_idx,
# jobs_running_idx, jobs_attention_idx: 0034), so the snapshot never reads finished history.

# Jobs that reached a terminal state in $1 at or after $2, by (state, tenant, workflow): count,
# the age of the newest, and the newest $4 job ids of the states in $3 (a job's last update is
# the moment it finished: nothing updates a finished job but a repair that reopens it).
FINISHED = """
SELECT j.state, j.tenant, j.workflow, count(*)::bigint AS jobs,
       EXTRACT(EPOCH FROM now() - max(j.updated_at))::float8 AS last_age_s,
       (array_agg(j.job_id ORDER BY j.job_id DESC)
            FILTER (WHERE j.state = ANY ($3::text[])))[1:$4] AS example_ids
FROM jobs.jobs j
WHERE j.state = ANY ($1::text[]) AND j.updated_at >= $2
GROUP BY j.state, j.tenant, j.workflow
ORDER BY j.state, j.tenant, j.workflow
"""

# Why waiting work waits, by (reason, state, tenant, workflow): the jobs module's own view
# (jobs.waiting, next to jobs.claim) says why each job waits; this only groups it. The oldest
# $2 job ids of each group whose reason is in $1 (a person must act) come along.
WAITING = """
SELECT reason, state, tenant, workflow, count(*)::bigint AS jobs,
       EXTRACT(EPOCH FROM now() - min(created_at))::float8 AS oldest_age_s,
       (array_agg(job_id ORDER BY job_id) FILTER (WHERE reason = ANY ($1::text[])))[1:$2]
           AS example_ids
FROM jobs.waiting
WHERE reason IS NOT NULL
GROUP BY reason, state, tenant, workflow
ORDER BY reason, state, tenant, workflow
"""

# Effects whose outcome is not known (states in $1), by tenant, workflow, effect and job state,
# with how many of them were escalated (jobs.effect_escalations, jobs/schema.sql).
UNRESOLVED_EFFECTS = """
SELECT e.tenant, j.workflow, e.state AS effect_state, j.state AS job_state,
       count(*)::bigint AS effects, count(x.job_id)::bigint AS escalated,
       EXTRACT(EPOCH FROM now() - min(e.begun_at))::float8 AS oldest_age_s
FROM jobs.effects e
JOIN jobs.jobs j ON j.job_id = e.job_id
LEFT JOIN jobs.effect_escalations x
    ON x.job_id = e.job_id AND x.effect_key = e.effect_key AND x.seq = e.seq
WHERE e.state = ANY ($1::text[])
GROUP BY e.tenant, j.workflow, e.state, j.state
ORDER BY e.tenant, j.workflow, e.state, j.state
"""

# Jobs whose count of unresolved effects (jobs.jobs.unresolved_effects, kept by a trigger since
# jobs/schema.sql) disagrees with their effect records in states $1: only something that bypassed
# the trigger (disabled triggers, a data-only restore) leaves one. The records decide.
MISCOUNTED_EFFECTS = """
SELECT j.job_id, j.tenant, j.state, j.unresolved_effects AS counted,
       coalesce(e.recorded, 0)::integer AS recorded
FROM jobs.jobs j
LEFT JOIN (SELECT job_id, count(*) AS recorded FROM jobs.effects
           WHERE state = ANY ($1::text[]) GROUP BY job_id) e ON e.job_id = j.job_id
WHERE j.unresolved_effects <> coalesce(e.recorded, 0)
ORDER BY j.job_id
"""

# Jobs and operation keys (jobs.operations, the idempotency key: jobs/schema.sql) that do
# not name each other: a job without its key row, or a key row without its job. Foreign keys
# both ways make either impossible unless something bypassed them (disabled triggers, a
# data-only restore of a dump taken before 0011). A job without its key could be submitted
# again as a second job; a key without its job makes its resubmits fail.
KEY_MISMATCHES = """
SELECT coalesce(j.job_id, o.job_id) AS job_id, coalesce(j.tenant, o.tenant) AS tenant,
       coalesce(j.workflow, o.workflow) AS workflow,
       coalesce(j.operation_id, o.operation_id) AS operation_id,
       CASE WHEN o.job_id IS NULL THEN 'job_without_key' ELSE 'key_without_job' END AS problem
FROM jobs.jobs j
FULL JOIN jobs.operations o ON o.job_id = j.job_id AND o.tenant = j.tenant
                           AND o.workflow = j.workflow AND o.operation_id = j.operation_id
WHERE j.job_id IS NULL OR o.job_id IS NULL
ORDER BY 1, 5
"""

# Queued jobs outside every claim's range for good, by cause. tenant_frozen: flagged frozen
# (jobs.jobs.tenant_frozen, 0037) under a tenant that is not frozen; a trigger on
# jobs.tenants keeps the flag. effects_parked: parked for effects_disabled (run_after =
# 'infinity', 0038) in a class whose effects are enabled; a trigger on jobs.workflows brings
# them back. Only a bypassed trigger (disabled triggers, a data-only restore, a hand-written
# UPDATE) leaves one. By jobs_tenant_frozen_idx and jobs_claimable_idx: each reads only the
# jobs it lists.
STRANDED = """
SELECT j.job_id, j.tenant, j.workflow, j.state, 'tenant_frozen' AS cause
FROM jobs.jobs j JOIN jobs.tenants t ON t.tenant = j.tenant
WHERE j.tenant_frozen AND NOT t.frozen
UNION ALL
SELECT j.job_id, j.tenant, j.workflow, j.state, 'effects_parked'
FROM jobs.workflows w JOIN jobs.jobs j ON j.workflow = w.workflow
WHERE w.effects_enabled AND j.state = 'queued' AND j.tenant_frozen = ANY (ARRAY[false, true])
  AND j.run_after = 'infinity'
ORDER BY 1
"""

# Begins a worker's journal holds that the database has no record of, not yet acknowledged
# (0054: a restore's evidence), oldest first.
JOURNAL_EVIDENCE = """
SELECT evidence_id, tenant, job_id, effect_key, seq, runner_id, idempotency_key,
       EXTRACT(EPOCH FROM now() - found_at)::float8 AS age_s
FROM jobs.journal_evidence WHERE acknowledged_at IS NULL ORDER BY evidence_id
"""

# Each tenant's authority: epoch, frozen, and an open restore detection (the ledger's epoch the
# database is behind; jobs.authority_restores, jobs/schema.sql). Held counts come from JOB_GROUPS.
TENANTS = """
SELECT t.tenant, t.epoch, t.frozen, r.ledger_epoch AS restore_ledger_epoch
FROM jobs.tenants t
LEFT JOIN jobs.authority_restores r ON r.tenant = t.tenant AND r.resolved_at IS NULL
ORDER BY t.tenant
"""

# Registered workflow classes with their live leases and the age of the newest claim/renewal.
WORKFLOWS = """
SELECT w.workflow, w.owner, w.effects_enabled,
       count(j.job_id) FILTER (WHERE j.lease_expires_at > now())::bigint AS live_leases,
       EXTRACT(EPOCH FROM now() - max(j.updated_at))::float8 AS last_lease_activity_s
FROM jobs.workflows w
LEFT JOIN jobs.jobs j ON j.workflow = w.workflow AND j.state = 'running'
GROUP BY w.workflow, w.owner, w.effects_enabled
ORDER BY w.workflow
"""

# The relay's figures (relay.sql.FIGURES, HELD_BY_REASON) and the consumers' (consumers.sql
# DELIVERY_COUNTS, POISON_COUNTS) are their modules' own; status reads them through
# accord.relay.outbox.figures / held_by_reason and accord.consumers.inbox.delivery_counts /
# accord.consumers.poison.poison_counts.

# Replay refusals ever recorded, by workflow and typed reason: a counter, kept by a trigger
# that the ledger's retention leaves alone (0041).
REPLAY_REFUSALS = """
SELECT workflow, reason, refusals
FROM ops.replay_refusal_totals
ORDER BY workflow, reason
"""

# -- replay ---------------------------------------------------------------------------------

# The database clock minus $1 seconds: a --since duration.
AGO = "SELECT now() - make_interval(secs => $1::float8)"

# The start of the retention window ($1 = relay_retention_s) as the first statement of the
# replay's snapshot: clock_timestamp() is read after the snapshot was taken, so every prune
# that snapshot misses (published_at < its own now() - $1) removed only rows older than it.
# And a --since given as a duration ($2 s; NULL: a timestamp was given) by the same reading:
# read earlier, "7d" with a 7-day retention fell a few microseconds before the window.
WINDOW = """
SELECT c - make_interval(secs => $1::float8) AS retained_from,
       c - make_interval(secs => $2::float8) AS since
FROM (SELECT clock_timestamp() AS c) AS reading
"""

# The latest enqueue time of an event the relay pruned (migration 0044), or NULL: none.
PRUNED_THROUGH = "SELECT through FROM relay.pruned"

# A rebuild's hold on projection $1 (the consumers' PROJECTION_GUARD key, exclusively), taken
# before its snapshot and released when its reset commits: waits for the projection consumer's
# transactions in flight, and makes its next ones wait.
REBUILD_GUARD = "SELECT pg_advisory_xact_lock(1633903460, hashtext($1))"

# The oldest retained event (committed and not held: delivered or still to be) of the
# versioned types in $1 and the tenants in $2 (empty: every tenant): its enqueue time.
OLDEST_RETAINED = """
SELECT min(enqueued_at) FROM relay.outbox
WHERE state <> 'held' AND (type || '.v' || version::text) = ANY ($1::text[])
  AND (cardinality($2::text[]) = 0 OR tenant = ANY ($2::text[]))
"""

# Tenants other than those in $2 with retained events of the versioned types in $1 (a few,
# to name them): a rebuild applying only $2's events would empty the rows theirs made. A
# rebuild runs only while the relay has pruned nothing, so the outbox holds every such event
# (the live consumer's inbox does not: it is pruned after the inbox's own window).
OTHER_TENANTS = """
SELECT DISTINCT tenant FROM relay.outbox
WHERE state <> 'held' AND (type || '.v' || version::text) = ANY ($1::text[])
  AND tenant <> ALL ($2::text[])
ORDER BY tenant LIMIT 5
"""

# Retained events of the versioned types in $2, of the tenants in $3 (empty: every tenant),
# enqueued at or after $1, in outbox order (read in one snapshot through a cursor): published,
# and pending too (a consumer may apply an event before the relay settles its row; the live
# consumer absorbs a later delivery: handlers are idempotent); not held (the relay gave up).
RETAINED_EVENTS = """
SELECT id, event_id, tenant, operation_id, type, version, authority_epoch, body, occurred_at
FROM relay.outbox
WHERE state <> 'held' AND enqueued_at >= $1
  AND (type || '.v' || version::text) = ANY ($2::text[])
  AND (cardinality($3::text[]) = 0 OR tenant = ANY ($3::text[]))
ORDER BY id
"""

# Switch this transaction to the projection principal (reverted at commit or rollback).
SET_PROJECTION_ROLE = "SET LOCAL ROLE accord_projection"

# Back to the connecting (owner) role for the rest of this transaction (the ledger writes).
LEAVE_PROJECTION_ROLE = "SET LOCAL ROLE NONE"

# Who this transaction runs as now (a handler must not have left the projection principal).
CURRENT_ROLE = "SELECT current_user::text"

# One batch of the replay ledger's retention ($1 seconds, at most $2 rows): (runs, refusals).
PRUNE_REPLAY = "SELECT runs, refusals FROM ops.prune_replay($1, $2)"

# Open a replay run; returns its id.
START_RUN = "INSERT INTO ops.replay_runs (workflow, since) VALUES ($1, $2) RETURNING run_id"

# A replay's hold on its run $1 while it runs (a session advisory lock: it outlives the
# batches' transactions and ends with the connection): ops.prune_replay keeps a run whose
# lock is held (ops.replay_running, migration 0053). RELEASE_RUN when it finishes.
HOLD_RUN = "SELECT pg_advisory_lock(1919250030, ($1::bigint & 2147483647)::int)"
RELEASE_RUN = "SELECT pg_advisory_unlock(1919250030, ($1::bigint & 2147483647)::int)"

# Close replay run $1 with its counts.
FINISH_RUN = """
UPDATE ops.replay_runs
SET finished_at = now(), events = $2, applied = $3, refused = $4, skipped = $5
WHERE run_id = $1
"""

# Record one refused event of run $1 (identifiers, typed reason, SQLSTATE, server message).
RECORD_REFUSAL = """
INSERT INTO ops.replay_refusals
    (run_id, workflow, tenant, operation_id, event_id, event_type, outbox_id, reason, sqlstate,
     message)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
"""

# -- the demo projection --------------------------------------------------------------------
