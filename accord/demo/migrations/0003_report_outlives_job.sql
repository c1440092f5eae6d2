-- A report is domain data: it outlives its job's history. accord removes a finished job (and
-- its key, effects and result manifest) once its retention has passed (accord's 0023,
-- jobs.prune); the report then keeps its object key, receipt and generation, and its job id
-- becomes NULL instead of blocking the pruner (a RESTRICT reference would stop retention for
-- every job after it: jobs.errors.PruneBlocked names such a constraint).
--
-- The index serves that foreign key: removing a job looks up the reports naming it, and
-- without an index each removed job would read the whole table.
ALTER TABLE demo.reports ALTER COLUMN job_id DROP NOT NULL;
ALTER TABLE demo.reports DROP CONSTRAINT reports_job_id_fkey;
ALTER TABLE demo.reports ADD CONSTRAINT reports_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES jobs.jobs (job_id) ON DELETE SET NULL;
CREATE INDEX reports_job_idx ON demo.reports (job_id);
