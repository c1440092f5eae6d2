-- 0058 A provider's "never seen" is trusted only once the attempt that began the effect can
-- no longer be sending (a review's finding). Reconcile measured its settle window from the
-- effect's begin: an effect begun 90 s before its job was rescued (a lease cut by a class
-- transfer or an epoch rotation, or a long call whose worker lost the database) was resolved
-- failed_before_dispatch at once on "never seen", the job queued and the effect dispatched
-- again, while the first attempt's request, still on its way, could land after the lookup.
--   * jobs.reconciliation gains quiet_since: the latest of the effect's begin, its recorded
--     finish (the call ended) and, for a job no longer running, the job's last change (its
--     rescue, cancel or failure: after it nothing renews the lease, and a worker cut off
--     from the database stops at its own lease end, within one lease of it). Reconcile's
--     settle window runs from there; `accord reconcile` refuses a configured settle shorter
--     than the job lease (an explicit --settle-s is the operator's word).
CREATE OR REPLACE VIEW jobs.reconciliation AS
    SELECT e.tenant, e.job_id, j.workflow, j.operation_id, j.state AS job_state, e.effect_key,
           e.seq, e.intent_digest, e.state, e.receipt, e.attempt_id, e.generation, e.begun_at,
           x.escalated_at,
           greatest(e.begun_at, e.finished_at,
                    CASE WHEN j.state <> 'running' THEN j.updated_at END) AS quiet_since
    FROM jobs.effects e
    JOIN jobs.jobs j ON j.job_id = e.job_id
    LEFT JOIN jobs.effect_escalations x
        ON x.job_id = e.job_id AND x.effect_key = e.effect_key AND x.seq = e.seq
    WHERE e.state = 'unknown' OR (e.state = 'pending' AND j.state <> 'running');

COMMENT ON COLUMN jobs.reconciliation.quiet_since IS 'Since when the attempt that began the effect can send no more: its begin, its recorded finish, or its job''s last change once not running, whichever is latest; reconcile trusts a "never seen" only settle_s after it (0058)';
