-- 0020 finished jobs by when they finished: `accord status --since` counts the jobs that
-- reached a terminal state within its window; without this index that count reads every
-- finished job ever retained.
CREATE INDEX jobs_finished_idx ON jobs.jobs (updated_at)
    WHERE state IN ('succeeded', 'failed', 'poison', 'canceled');
