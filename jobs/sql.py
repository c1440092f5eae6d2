"""SQL owned by the jobs module. Values only as $n parameters.

The fenced paths call the jobs PL/pgSQL functions (jobs/schema.sql) so that the isolationtester
specs in tests/isolation run the very statements the store runs. Fence parameters are always
the eight lease fields in ``Lease.fence_args()`` order ($1..$8).
"""

# Submit one operation idempotently (tenant row upserted); returns the job and its digest.
SUBMIT = "SELECT job_id, created, state, digest FROM jobs.submit($1, $2, $3, $4, $5::jsonb, $6)"

# Claim up to $4 due jobs of workflow $1 for registered owner $2 with a lease of $3 seconds.
# Each claimed job with its attempt context (0036): its stored trace contexts, its attempts
# (this claim included), how its previous attempt ended and when it was submitted, for the
# attempt span and the submit-to-finish histogram (Lease.context).
CLAIM = (
    "SELECT job_id, tenant, workflow, operation_id, owner, attempt_id, generation, epoch,"
    " lease_expires_at, payload, trace, attempt_trace, attempts, last_error, created_at"
    " FROM jobs.claim($1, $2, $3, $4)"
)

# The fence: lock the job row; NULL while the lease holds, else the failing field.
FENCE = "SELECT jobs.fence($1, $2, $3, $4, $5, $6, $7, $8)"

# Renew the caller's unexpired lease by $9 seconds from the database clock.
RENEW = "SELECT status, lease_expires_at FROM jobs.renew($1, $2, $3, $4, $5, $6, $7, $8, $9)"

# The publish's (second) fence and the transition to succeeded, one fenced UPDATE
# (jobs.succeed in jobs/schema.sql).
SUCCEED = "SELECT jobs.succeed($1, $2, $3, $4, $5, $6, $7, $8)"

# The same transition, then (only if it passed) the manifest row naming result object $9
# (content digest $10): one round trip (jobs.succeed_with_result, migration 0024).
SUCCEED_WITH_RESULT = "SELECT jobs.succeed_with_result($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"

# Either transition as a publish callback's last statement on a connection the worker keeps
# between jobs: the same status, then the session reset the pool would otherwise run in its
# own round trip when the connection goes back (jobs.clean_session, migration 0025).
SUCCEED_CLEAN = f"{SUCCEED}, jobs.clean_session()"
SUCCEED_WITH_RESULT_CLEAN = f"{SUCCEED_WITH_RESULT}, jobs.clean_session()"

# Publish a batch of leases without callbacks (arrays of the eight fence fields); the ids done.
SUCCEED_MANY = (
    "SELECT job_id FROM jobs.succeed_many($1::bigint[], $2::text[], $3::text[], $4::text[],"
    " $5::text[], $6::uuid[], $7::bigint[], $8::bigint[]) AS job_id"
)

# The fenced manifest row naming result object $9 (content digest $10) for the lease's job.
RECORD_RESULT = "SELECT jobs.record_result($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"

# Give the job up (fenced): error $9, retry $10, backoff base $11 and cap $12 seconds.
FAIL = "SELECT status, state FROM jobs.fail($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"

# Record effect $9 pending with intent digest $10 before dispatch (fenced); or, for a key that
# succeeded in an earlier attempt (a resumed job), its recorded seq and receipt ('recorded').
BEGIN_EFFECT = (
    "SELECT status, seq, recorded_digest, receipt"
    " FROM jobs.begin_effect($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
)

# Record the outcome $10 (receipt $11) of effect $9's pending record (fenced).
FINISH_EFFECT = "SELECT jobs.finish_effect($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"

# Return up to $1 abandoned running jobs to queued/poison/unknown (backoff base $2, cap $3).
RESCUE = "SELECT job_id, tenant, state, generation FROM jobs.rescue($1, $2, $3)"

# Cancel queued or running job $1 with reason $2.
CANCEL = "SELECT changed, state, generation, unresolved FROM jobs.cancel($1, $2)"

# Advance tenant $1's authority epoch; returns the new epoch.
ROTATE_EPOCH = "SELECT jobs.rotate_epoch($1)"

# Freeze ($2 = true) or thaw tenant $1's authority; returns its epoch.
SET_FROZEN = "SELECT jobs.set_frozen($1, $2)"

# The tenant's authority row.
TENANT = "SELECT tenant, epoch, frozen FROM jobs.tenants WHERE tenant = $1"

# One job, for operators.
JOB = (
    "SELECT job_id, tenant, workflow, operation_id, state, generation, attempts, max_attempts,"
    " last_error, resumed_generation FROM jobs.jobs WHERE job_id = $1"
)

# Every effect record of one job, in begin order.
EFFECTS = (
    "SELECT job_id, effect_key, seq, intent_digest, state, receipt, attempt_id, generation"
    " FROM jobs.effects WHERE job_id = $1 ORDER BY effect_key, seq"
)

# The registration of workflow $1 (no lock).
REGISTRATION = "SELECT workflow, owner, effects_enabled FROM jobs.workflows WHERE workflow = $1"

# The registration of workflow $1, locked against claims (they hold it FOR KEY SHARE).
REGISTRATION_FOR_UPDATE = (
    "SELECT workflow, owner, effects_enabled FROM jobs.workflows WHERE workflow = $1 FOR UPDATE"
)

# Register workflow $1 to owner $2 with effects $3 if no one has registered it yet.
REGISTER = (
    "INSERT INTO jobs.workflows (workflow, owner, effects_enabled) VALUES ($1, $2, $3)"
    " ON CONFLICT (workflow) DO NOTHING"
)

# Set workflow $1's owner $2 and effects flag $3 (caller holds the row lock).
UPDATE_REGISTRATION = (
    "UPDATE jobs.workflows SET owner = $2, effects_enabled = $3, updated_at = now()"
    " WHERE workflow = $1"
)

# Audit one registration act ($1 action, $2 workflow, $3 owner, $4 effects, $5/$6 what it
# was before, $7 who); returns the audit id. Same transaction as the act.
AUDIT_REGISTRATION = (
    "INSERT INTO jobs.registration_audit (action, workflow, owner, effects_enabled,"
    " previous_owner, previous_effects_enabled, who) VALUES ($1, $2, $3, $4, $5, $6, $7)"
    " RETURNING audit_id"
)

# The registration audit of workflow $1, oldest first.
REGISTRATION_AUDIT = (
    "SELECT audit_id, at, action, workflow, owner, effects_enabled, previous_owner,"
    " previous_effects_enabled, who, db_user FROM jobs.registration_audit"
    " WHERE workflow = $1 ORDER BY audit_id"
)

# Open work of workflow $1 by state (states with none left out): anything but a finished job
# keeps its owner. One part per live-work index (claimable, running, attention), so the count
# reads the live jobs, never the finished history kept for the retention, while the caller
# holds the class's registration row (and so its claims).
OPEN_WORK = (
    "SELECT 'queued' AS state, count(*) AS n FROM jobs.jobs"
    " WHERE workflow = $1 AND state = 'queued' HAVING count(*) > 0"
    " UNION ALL SELECT 'running', count(*) FROM jobs.jobs"
    " WHERE workflow = $1 AND state = 'running' HAVING count(*) > 0"
    " UNION ALL SELECT state, count(*) FROM jobs.jobs"
    " WHERE workflow = $1 AND state IN ('unknown', 'held') GROUP BY state"
)

# Revoke the running leases of workflow $1 (an owner transfer): rescue returns the work.
REVOKE_LEASES = (
    "UPDATE jobs.jobs SET lease_expires_at = least(lease_expires_at, clock_timestamp()),"
    " updated_at = now() WHERE workflow = $1 AND state = 'running'"
)

# Health: the database clock and the number of registered workflow classes (read-only).
PROBE = "SELECT now() AS database_now, (SELECT count(*) FROM jobs.workflows) AS workflows"

# -- operators' views (jobs.views): identifiers, states, counts and reasons, never payloads ----

# Jobs newest first, optionally of state $1, tenant $2 and workflow class $3, at most $4.
JOB_LIST = """
SELECT job_id, tenant, workflow, operation_id, state, attempts, max_attempts, generation,
       updated_at, last_error
FROM jobs.jobs
WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR tenant = $2)
  AND ($3::text IS NULL OR workflow = $3)
ORDER BY job_id DESC
LIMIT $4
"""

# One job's every field but its payload and digest, with its class's registration.
JOB_DETAIL = """
SELECT j.job_id, j.tenant, j.workflow, j.operation_id, j.state, j.generation, j.attempts,
       j.max_attempts, j.last_error, j.owner, j.attempt_id, j.epoch, j.lease_expires_at,
       j.run_after, j.created_at, j.updated_at, j.resumed_generation, j.unresolved_effects,
       j.final_failure, w.owner AS class_owner, w.effects_enabled
FROM jobs.jobs j
LEFT JOIN jobs.workflows w ON w.workflow = j.workflow
WHERE j.job_id = $1
"""

# Why job $1 waits (jobs.waiting; NULL: it does not wait), and whether a claim would take it.
JOB_WAITING = "SELECT reason, claimable FROM jobs.waiting WHERE job_id = $1"

# Every effect record of job $1 in begin order, with its escalation and the repair that
# resolved it (jobs.repair_audit: who, evidence), if any.
JOB_EFFECTS = """
SELECT e.effect_key, e.seq, e.state, e.receipt, e.intent_digest, e.attempt_id, e.generation,
       e.begun_at, e.finished_at, x.escalated_at,
       EXTRACT(EPOCH FROM now() - e.begun_at)::float8 AS age_s,
       a.audit_id AS resolved_audit, a.who AS resolved_by, a.evidence AS resolved_evidence,
       q.quiet_since, EXTRACT(EPOCH FROM now() - q.quiet_since)::float8 AS quiet_s
FROM jobs.effects e
LEFT JOIN jobs.effect_escalations x
    ON x.job_id = e.job_id AND x.effect_key = e.effect_key AND x.seq = e.seq
-- an unresolved one's quiet_since (0058): since when nothing of the job can be sending it
LEFT JOIN jobs.reconciliation q
    ON q.job_id = e.job_id AND q.effect_key = e.effect_key AND q.seq = e.seq
LEFT JOIN LATERAL (
    SELECT r.audit_id, r.who, r.evidence FROM jobs.repair_audit r
    WHERE r.job_id = e.job_id AND r.effect_key = e.effect_key AND r.seq = e.seq
    ORDER BY r.audit_id DESC LIMIT 1
) a ON true
WHERE e.job_id = $1
ORDER BY e.begun_at, e.effect_key, e.seq
"""

# The stored trace context of each job $1 (the span that submitted it), for the spans only.
JOB_TRACES = (
    "SELECT job_id, trace, attempt_trace, last_error FROM jobs.jobs"
    " WHERE job_id = ANY($1::bigint[])"
)

# The stored trace context of effect ($2 key, $3 seq) of job $1: the span that ran it.
EFFECT_TRACE = (
    "SELECT trace FROM jobs.effect_traces WHERE job_id = $1 AND effect_key = $2 AND seq = $3"
)

# Keep the trace context $5 of attempt $2 of job $1 (no key), or of its effect $3 seq $4;
# only the attempt holding the job writes (tracing only; jobs.note_trace, jobs/schema.sql;
# it holds the job FOR KEY SHARE, so the pruner never leaves its trace behind, 0063).
NOTE_TRACE = "SELECT jobs.note_trace($1, $2, $3, $4, $5::jsonb)"

# -- retention (jobs.retention; jobs.prune in jobs/schema.sql) -------------------------------

# Remove one batch of at most $3 finished, resolved jobs older than $1 seconds and than the key
# horizon (0063; with their key, effects, traces, escalations and result manifest) and of
# repair audit rows older than $2.
PRUNE = (
    "SELECT jobs_pruned, effects_pruned, results_pruned, audit_pruned, tombstones_pruned"
    " FROM jobs.prune($1, $2, $3)"
)
