-- 0022 effects disabled means waiting: a job whose begin_effect was refused because its
-- class is registered with effects disabled is not claimed again (spending an attempt each
-- time, until poison) while effects stay disabled; it waits, `accord status` says
-- effects_disabled, and `accord register --effects enabled` makes it claimable again.
-- jobs.claim and jobs.waiting's `claimable` change together (tests/integration/jobs/
-- test_waiting.py holds them to agreement).
CREATE OR REPLACE FUNCTION jobs.claim(p_workflow text, p_owner text, p_lease_s double precision, p_limit integer) RETURNS TABLE(job_id bigint, tenant text, workflow text, operation_id text, owner text, attempt_id uuid, generation bigint, epoch bigint, lease_expires_at timestamp with time zone, payload jsonb)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
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
          AND NOT t.frozen
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
        FOR NO KEY UPDATE OF j SKIP LOCKED
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
              j.generation, j.epoch, j.lease_expires_at, j.payload;
END $$;

CREATE OR REPLACE VIEW jobs.waiting AS
WITH live AS (
    SELECT workflow, count(*) AS leases FROM jobs.jobs
    WHERE state = 'running' AND lease_expires_at > now()
    GROUP BY workflow
), unresolved AS (
    SELECT DISTINCT e.job_id FROM jobs.effects e WHERE e.state IN ('pending', 'unknown')
), classified AS (
    SELECT j.job_id, j.state, j.tenant, j.workflow, j.created_at,
        j.resumed_generation IS DISTINCT FROM j.generation
            AND EXISTS (SELECT 1 FROM jobs.effects e
                        WHERE e.job_id = j.job_id AND e.state = 'succeeded') AS succeeded_effect,
        u.job_id IS NOT NULL AS unresolved_effect,
        w.workflow IS NOT NULL AS registered,
        w.effects_enabled, t.frozen, t.epoch AS tenant_epoch, j.epoch, j.lease_expires_at,
        j.run_after, j.last_error, l.leases
    FROM jobs.jobs j
    JOIN jobs.tenants t ON t.tenant = j.tenant
    LEFT JOIN jobs.workflows w ON w.workflow = j.workflow
    LEFT JOIN live l ON l.workflow = j.workflow
    LEFT JOIN unresolved u ON u.job_id = j.job_id
    -- Finished work waits only when an effect outcome is still unknown (e.g. canceled).
    WHERE j.state IN ('queued', 'held', 'unknown', 'running')
       OR (j.state IN ('canceled', 'failed', 'poison') AND u.job_id IS NOT NULL)
)
SELECT job_id, state, tenant, workflow, created_at,
    (state = 'queued' AND run_after <= now() AND NOT frozen AND registered
     AND NOT unresolved_effect AND NOT succeeded_effect
     AND (last_error IS DISTINCT FROM 'effects_disabled' OR effects_enabled)) AS claimable,
    CASE
        WHEN state = 'held' THEN 'held'
        -- unknown with every effect outcome known (one succeeded): only a repair resumes it
        WHEN state = 'unknown' AND NOT unresolved_effect THEN 'awaiting_resume'
        WHEN state = 'unknown' THEN 'unresolved_effect'
        WHEN state IN ('canceled', 'failed', 'poison') THEN 'unresolved_effect'
        WHEN state = 'running' AND epoch IS DISTINCT FROM tenant_epoch THEN 'epoch_rotated'
        WHEN state = 'running' AND lease_expires_at <= now() THEN 'lease_expired'
        WHEN state = 'running' AND frozen THEN 'tenant_frozen'
        WHEN state = 'running' THEN NULL
        WHEN NOT registered THEN 'unregistered_workflow'
        WHEN frozen THEN 'tenant_frozen'
        WHEN unresolved_effect THEN 'unresolved_effect'
        WHEN succeeded_effect THEN 'blocked_by_effect'
        WHEN NOT effects_enabled AND last_error = 'effects_disabled' THEN 'effects_disabled'
        WHEN run_after > now() THEN 'backoff'
        WHEN leases IS NULL THEN 'no_live_worker'
        ELSE 'workers_busy'
    END AS reason
FROM classified;
