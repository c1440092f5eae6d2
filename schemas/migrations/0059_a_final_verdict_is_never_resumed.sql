-- 0059 A job its handler gave up for good is never resumed (a review's finding on 0055).
-- 0055 marked the jobs already `unknown` that the runner had given up for a handler defect
-- (final_failure), and made the resolution that leaves such a job nothing unresolved fail
-- it. A job among them whose effects were all resolved before 0055 (by `accord repair
-- resolve-effect` to succeeded, which waits for a person's resume) met no resolution after
-- it: it stayed `unknown` for ever, `accord jobs show` offered a resume, and
-- jobs.repair_resume queued it, running again what its handler had given up on.
--   * Such jobs (unknown, final_failure, nothing unresolved) are failed now, as the
--     resolution after 0055 would have made them.
--   * jobs.repair_resume refuses a job with final_failure (`final_failure`), whatever comes.
UPDATE jobs.jobs j SET state = 'failed', updated_at = now()
WHERE j.state = 'unknown' AND j.final_failure AND NOT jobs.unresolved_effects(j.job_id);

CREATE OR REPLACE FUNCTION jobs.repair_resume(p_job_id bigint, p_who text, p_evidence text) RETURNS TABLE(status text, job_state text, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    j jobs.jobs%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
BEGIN
    IF v_refusal IS NULL THEN
        SELECT * INTO j FROM jobs.jobs x WHERE x.job_id = p_job_id FOR UPDATE;
        v_refusal := CASE
            WHEN j.job_id IS NULL THEN 'missing'
            WHEN j.state = 'running' THEN 'running'
            WHEN j.state <> 'unknown' THEN 'not_resumable'
            -- its handler gave it up without a retry (0055): never run again
            WHEN j.final_failure THEN 'final_failure'
            WHEN jobs.unresolved_effects(p_job_id) THEN 'effects_unresolved'
            WHEN EXISTS (SELECT 1 FROM jobs.authority_restores r
                         WHERE r.tenant = j.tenant AND r.resolved_at IS NULL)
                THEN 'restore_unresolved'
        END;
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, j.state, NULL::bigint;
        RETURN;
    END IF;
    UPDATE jobs.jobs x
    SET state = 'queued', generation = x.generation + 1, resumed_generation = x.generation + 1,
        run_after = now(), updated_at = now()
    WHERE x.job_id = p_job_id;
    RETURN QUERY SELECT NULL::text, 'queued'::text,
        jobs.repair_audit_row(
            'resume', p_who, j.tenant, p_job_id, NULL, NULL, 'queued', p_evidence,
            jsonb_build_object(
                'from', j.state, 'generation', j.generation + 1, 'attempts', j.attempts,
                'last_error', j.last_error,
                'succeeded_effects', (SELECT coalesce(jsonb_agg(jsonb_build_array(
                                                 e.effect_key, e.seq, e.receipt)
                                             ORDER BY e.effect_key, e.seq), '[]'::jsonb)
                                      FROM jobs.effects e
                                      WHERE e.job_id = p_job_id AND e.state = 'succeeded')));
END $$;
