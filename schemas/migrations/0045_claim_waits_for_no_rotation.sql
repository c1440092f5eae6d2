-- 0045 A claim in flight during an epoch rotation kept its lease. The claim read the tenant row
-- without a lock and the rotation's drain updates only the jobs it sees running, so a job
-- whose claim had not committed yet passed the drain by: the claim then committed a full lease
-- under the old epoch, and its holder's fence (which reads the tenant row unlocked too) passed
-- until the rotation committed, so a publish or an effect begun in that window committed after
-- it. The claim now takes the tenant row FOR SHARE (SKIP LOCKED): a rotation waits for claims
-- in flight, and claims during a rotation skip the tenant.

CREATE OR REPLACE FUNCTION jobs.claim(p_workflow text, p_owner text, p_lease_s double precision, p_limit integer) RETURNS TABLE(job_id bigint, tenant text, workflow text, operation_id text, owner text, attempt_id uuid, generation bigint, epoch bigint, lease_expires_at timestamp with time zone, payload jsonb, trace jsonb, attempt_trace jsonb, attempts integer, last_error text, created_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
BEGIN
    -- PL/pgSQL, not SQL: a SQL function's statement is planned again on every call.
    RETURN QUERY
    WITH registered AS (
        SELECT w.effects_enabled FROM jobs.workflows w
        WHERE w.workflow = p_workflow AND w.owner = p_owner
        FOR KEY SHARE
    ), picked AS (
        SELECT j.job_id, t.epoch
        FROM jobs.jobs j JOIN jobs.tenants t ON t.tenant = j.tenant
        WHERE j.workflow = p_workflow AND j.state = 'queued' AND j.run_after <= now()
          -- the index's range: thawed tenants' jobs only (0037); the join decides
          AND NOT j.tenant_frozen AND NOT t.frozen
          AND EXISTS (SELECT 1 FROM registered)
          -- refused for effects_disabled: it waits for effects, no attempt spent meanwhile
          AND (j.last_error IS DISTINCT FROM 'effects_disabled'
               OR (SELECT r.effects_enabled FROM registered r))
          AND NOT EXISTS (
              SELECT 1 FROM jobs.effects e
              WHERE e.job_id = j.job_id
                AND (e.state IN ('pending', 'unknown')
                     OR (e.state = 'succeeded'
                         AND j.resumed_generation IS DISTINCT FROM j.generation)))
        ORDER BY j.run_after, j.job_id
        LIMIT p_limit
        -- The tenant row shared: a rotation's update of it waits for this claim to commit,
        -- and its drain then sees the job running (it drains only what it sees); a claim
        -- during a rotation skips the tenant. Without it a lease claimed in flight kept its
        -- old epoch past the rotation, and its holder could write until the rotation committed.
        FOR NO KEY UPDATE OF j SKIP LOCKED
        FOR SHARE OF t SKIP LOCKED
    )
    UPDATE jobs.jobs j
    SET state = 'running', owner = p_owner, attempt_id = gen_random_uuid(),
        generation = j.generation + 1, epoch = picked.epoch, attempts = j.attempts + 1,
        lease_expires_at = now() + make_interval(secs => p_lease_s), updated_at = now()
    FROM picked
    -- The redundant ANY lets the primary key find the picked rows (a hash join would scan
    -- the whole table per claim); picked, a locking CTE, runs exactly once.
    WHERE j.job_id = ANY (ARRAY(SELECT picked.job_id FROM picked)) AND j.job_id = picked.job_id
    RETURNING j.job_id, j.tenant, j.workflow, j.operation_id, j.owner, j.attempt_id,
              j.generation, j.epoch, j.lease_expires_at, j.payload,
              -- the attempt's context (0036): what Store.attempt_context read after
              j.trace, j.attempt_trace, j.attempts, j.last_error, j.created_at;
END $$;
