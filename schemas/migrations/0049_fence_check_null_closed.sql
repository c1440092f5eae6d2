-- 0049 The fence fails closed on a NULL argument. jobs.fence_check compared tenant, workflow,
-- operation id and generation with `<>`, which is NULL (not true) for a NULL argument, so a
-- CASE branch was skipped: a caller passing NULL for them was fenced by owner, attempt and
-- epoch alone (the attempt id still had to match: hardening, not a hole found in use). Every
-- comparison is now IS DISTINCT FROM, and the tenant's epoch too (a NULL tenant row cannot
-- pass either). The set-based fences (jobs.succeed, jobs.succeed_many) compare with `=` in
-- their WHERE and already fail closed.

CREATE OR REPLACE FUNCTION jobs.fence_check(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    j jobs.jobs%ROWTYPE;
    t jobs.tenants%ROWTYPE;
BEGIN
    SELECT * INTO j FROM jobs.jobs WHERE job_id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    -- A new statement, hence a snapshot taken after the lock (see the header).
    SELECT * INTO t FROM jobs.tenants WHERE tenant = j.tenant;
    RETURN CASE
        WHEN j.tenant IS DISTINCT FROM p_tenant THEN 'tenant'
        WHEN j.workflow IS DISTINCT FROM p_workflow
          OR j.operation_id IS DISTINCT FROM p_operation_id THEN 'operation'
        WHEN j.generation IS DISTINCT FROM p_generation THEN 'generation'
        WHEN j.owner IS DISTINCT FROM p_owner THEN 'owner'
        WHEN j.attempt_id IS DISTINCT FROM p_attempt_id THEN 'attempt'
        WHEN j.state <> 'running' THEN 'state'
        WHEN j.epoch IS DISTINCT FROM p_epoch OR t.epoch IS DISTINCT FROM p_epoch THEN 'epoch'
        WHEN t.frozen IS NOT FALSE THEN 'frozen'
        -- clock_timestamp(), not now(): a publish transaction may outlive its lease.
        WHEN j.lease_expires_at <= clock_timestamp() THEN 'lease_expired'
    END;
END $$;
