"""SQL of authority, restore detection, repair and reconciliation. Values only as $n parameters.

The checked operations are the jobs.repair_* functions (current definitions: jobs/schema.sql);
the roles that may call each are granted there (accord_worker, accord_repair).
"""

# Lock tenant $1's authority row (created if missing) until the transaction ends.
AUTHORITY_LOCK = "SELECT epoch, frozen, open_restore FROM jobs.authority_lock($1)"

# Set tenant $1's epoch to $2 (must advance) and its restriction to $3; NULL or a refusal.
AUTHORITY_SET = "SELECT jobs.authority_set($1, $2, $3)"

# Every tenant's authority row, with the highest epoch a check saw in the ledger (0052).
TENANTS = "SELECT tenant, epoch, frozen, ledger_epoch FROM jobs.tenants ORDER BY tenant"

# The highest epoch a check saw in the ledger for tenant $1 (0052), or NULL.
LEDGER_EPOCH = "SELECT ledger_epoch FROM jobs.tenants WHERE tenant = $1"

# Record ledger epochs $2 of tenants $1 that a check found or wrote (only ever raised).
LEDGER_SEEN = "SELECT jobs.ledger_seen($1::text[], $2::bigint[])"

# If tenant $1's epoch is behind ledger epoch $2: freeze it, hold its work, record it.
AUTHORITY_HOLD = (
    "SELECT restore_id, tenant, db_epoch, ledger_epoch, held_jobs, newly_detected"
    " FROM jobs.authority_hold($1, $2, $3)"
)

# Open restore detections (unresolved), oldest first.
OPEN_RESTORES = (
    "SELECT restore_id, tenant, db_epoch, ledger_epoch, held_jobs, false AS newly_detected"
    " FROM jobs.authority_restores WHERE resolved_at IS NULL ORDER BY restore_id"
)

# Resolve effect $2 of job $1 to outcome $3 (receipt $4) as principal $5 with evidence $6,
# refused unless its latest record is seq $7 (NULL: whichever is latest).
RESOLVE_EFFECT = (
    "SELECT status, seq, job_state, audit_id"
    " FROM jobs.repair_resolve_effect($1, $2, $3, $4, $5, $6, $7)"
)

# Release held job $1 as principal $2 with evidence $3.
RELEASE_HOLD = "SELECT status, job_state, audit_id FROM jobs.repair_release_hold($1, $2, $3)"

# Requeue poison job $1 as principal $2 with evidence $3.
REQUEUE_POISON = "SELECT status, job_state, audit_id FROM jobs.repair_requeue_poison($1, $2, $3)"

# Resume unknown job $1 (every effect outcome known) as principal $2 with evidence $3.
RESUME = "SELECT status, job_state, audit_id FROM jobs.repair_resume($1, $2, $3)"

# Acknowledge journal evidence note $1 (jobs.journal_evidence, 0054) as principal $2 with
# evidence $3: the worker's journal may then drop that begin.
ACKNOWLEDGE_EVIDENCE = (
    "SELECT status, job_id, audit_id FROM jobs.repair_acknowledge_evidence($1, $2, $3)"
)

# Advance tenant $1's epoch to $2, past ledger epoch $3, as principal $4 with evidence $5.
ADVANCE_EPOCH = (
    "SELECT status, epoch, audit_id FROM jobs.repair_advance_epoch($1, $2, $3, $4, $5, $6)"
)

# Escalate up to $2 unresolved effects begun more than $1 seconds ago.
ESCALATE = "SELECT job_id, effect_key, seq, tenant, age_s FROM jobs.repair_escalate($1, $2)"

# Up to $1 effects needing reconciliation, the longest quiet first, with their age in seconds
# and the seconds since their job's attempts could last have sent (quiet_since, 0058).
RECONCILIATION = (
    "SELECT tenant, job_id, workflow, operation_id, job_state, effect_key, seq, intent_digest,"
    " state, receipt, attempt_id, generation, begun_at, escalated_at,"
    " extract(epoch FROM now() - begun_at)::double precision AS age_s,"
    " extract(epoch FROM now() - quiet_since)::double precision AS quiet_s"
    " FROM jobs.reconciliation ORDER BY quiet_since, begun_at LIMIT $1"
)

# The audit rows of job $1, oldest first.
AUDIT_FOR_JOB = (
    "SELECT audit_id, at, action, who, db_user, db_role, tenant, job_id, effect_key, seq,"
    " outcome, evidence, detail FROM jobs.repair_audit WHERE job_id = $1 ORDER BY audit_id"
)

# The audit rows of tenant $1, oldest first.
AUDIT_FOR_TENANT = (
    "SELECT audit_id, at, action, who, db_user, db_role, tenant, job_id, effect_key, seq,"
    " outcome, evidence, detail FROM jobs.repair_audit WHERE tenant = $1 ORDER BY audit_id"
)

# -- the PostgreSQL ledger (a separate database, never the one it guards) ----------------

# Create the ledger schema, its append-only table and guard (idempotent).
LEDGER_ENSURE = """
CREATE SCHEMA IF NOT EXISTS accord_ledger;
CREATE TABLE IF NOT EXISTS accord_ledger.records (
    seq      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant   text        NOT NULL CHECK (tenant <> ''),
    epoch    bigint      NOT NULL CHECK (epoch >= 1),
    frozen   boolean     NOT NULL,
    why      text        NOT NULL,
    at       timestamptz NOT NULL,
    who      text,
    evidence text
);
CREATE OR REPLACE FUNCTION accord_ledger.append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the authority ledger is append-only'
        USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE OR REPLACE TRIGGER records_append_only BEFORE UPDATE OR DELETE ON accord_ledger.records
    FOR EACH ROW EXECUTE FUNCTION accord_ledger.append_only();
CREATE OR REPLACE TRIGGER records_not_truncated BEFORE TRUNCATE ON accord_ledger.records
    FOR EACH STATEMENT EXECUTE FUNCTION accord_ledger.append_only();
"""

# The ledger's records after seq $1, in append order, each beside how many records the ledger
# holds and the record at seq $1 (one row with NULL fields when none is after $1): one
# statement, one snapshot, so a reader that kept what it read can tell a record committed
# late below seq $1 (identity values are taken in insert order, not commit order), or a
# ledger whose seqs were reused (restored, truncated), from none.
LEDGER_READ_AFTER = """
WITH n AS (SELECT count(*) AS total FROM accord_ledger.records),
     m AS (SELECT tenant AS mark_tenant, epoch AS mark_epoch, at AS mark_at
           FROM accord_ledger.records WHERE seq = $1)
SELECT n.total, m.mark_tenant, m.mark_epoch, m.mark_at,
       r.seq, r.tenant, r.epoch, r.frozen, r.why, r.at, r.who, r.evidence
FROM n LEFT JOIN m ON true LEFT JOIN LATERAL (
    SELECT * FROM accord_ledger.records WHERE seq > $1
) r ON true
ORDER BY r.seq
"""

# Append one ledger record.
LEDGER_APPEND = (
    "INSERT INTO accord_ledger.records (tenant, epoch, frozen, why, at, who, evidence)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7)"
)
