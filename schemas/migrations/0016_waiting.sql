-- 0016 waiting: why each unfinished job waits, owned by the jobs module next to jobs.claim.
--
-- `claimable` is jobs.claim's own eligibility, spelled once more here beside it: queued, due,
-- its tenant not frozen, its class registered, and no effect that blocks a rerun (pending or
-- unknown; succeeded unless the job was resumed for this generation). A test holds the two
-- to agreement: for a seeded mix, the next claim takes exactly the rows this view calls
-- claimable (tests/integration/jobs/test_waiting.py). `reason` is the first typed reason
-- that explains the wait (NULL: running normally); `accord status` groups it.
-- Worker presence is derived from live leases: "no_live_worker" means no running job of
-- the class holds an unexpired lease.
CREATE VIEW jobs.waiting AS
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
     AND NOT unresolved_effect AND NOT succeeded_effect) AS claimable,
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

COMMENT ON VIEW jobs.waiting IS
    'Why each unfinished job waits; claimable = jobs.claim''s eligibility (kept in agreement by test)';
GRANT SELECT ON jobs.waiting TO accord_worker, accord_repair;
