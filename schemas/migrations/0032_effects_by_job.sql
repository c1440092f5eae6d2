-- 0032 Unresolved effects by job. Every write-back that asks for one job's pending or unknown
-- effects (finish_effect's update, succeed's and claim's NOT EXISTS, unresolved_effects) had
-- effects_unresolved_idx (begun_at, 0006) as its only index matching `state IN (pending,
-- unknown)`: with statistics taken while few effects were unresolved, the planner reads that
-- index in age order and filters on the job, so each call read every unresolved effect of
-- every job. Measured (bench/job_calls_bench's database, 5,000 unknown effects awaiting
-- reconciliation): finish_effect 2,330 µs of server CPU instead of 280, a publish 2,390
-- instead of 360, growing with the backlog during the very incident that made it. The same
-- predicate led by job_id gives those lookups the job's own few rows whatever the backlog;
-- effects_unresolved_idx stays for the scans by age (reconcile, status).
-- The build reads jobs.effects once and holds writes to it meanwhile; only unresolved
-- effects are indexed.
CREATE INDEX effects_job_unresolved_idx ON jobs.effects (job_id)
    WHERE state IN ('pending', 'unknown');
