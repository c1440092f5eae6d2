-- 0035 jobs.waiting reads the work that waits, not the history kept. Its jobs were chosen by
-- an OR over states that no index serves, so each read of the view (every status snapshot,
-- hence every /metrics scrape of every process, and `accord jobs show`) read jobs.jobs whole:
-- 31 ms with 200,000 finished jobs kept (docs/bench-log.md, 2026-12-04). The same rows now
-- come from one branch per index: queued and running jobs by the claim's and the rescue's,
-- held and unknown ones by jobs_attention_idx (0034), finished ones with an unresolved effect
-- from those effects. What the view says of each job is unchanged.
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
    -- Each branch by an index (0034, 0035): never the finished history kept beside them.
    FROM (SELECT * FROM jobs.jobs WHERE state = 'queued'
          UNION ALL SELECT * FROM jobs.jobs WHERE state = 'running'
          UNION ALL SELECT * FROM jobs.jobs WHERE state IN ('held', 'unknown')
          UNION ALL SELECT f.* FROM unresolved uf JOIN jobs.jobs f ON f.job_id = uf.job_id
                    WHERE f.state IN ('canceled', 'failed', 'poison')) j
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
