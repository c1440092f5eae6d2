-- 0038 A job refused because its class's effects are disabled costs no claim of its class.
-- jobs.begin_effect refuses with effects_disabled until `accord register --effects enabled`;
-- the worker then fails the job with that reason and a retry, and it went back to queued due
-- after a short backoff. The claim refuses such a job while the class stays disabled, but only
-- after its scan of jobs_claimable_idx read it: every claim of a class that keeps running its
-- jobs without effects (the default registration) walked every refused one (0037's shape, by
-- class rather than by tenant).
--
-- Now jobs.fail parks it: run_after = 'infinity', past every claim's range (`run_after <=
-- now()`), and a trigger on jobs.workflows brings the class's parked jobs back (run_after =
-- now()) when its effects are enabled, and parks them again if they are disabled first. The claim still refuses an effects_disabled job of a
-- disabled class itself: run_after decides what a claim reads, never what it may take.
--
-- An enabling that missed a job parked meanwhile would leave it out of every claim for good,
-- so the two are ordered on the class's row: jobs.fail reads effects_enabled under FOR SHARE,
-- which the registration's UPDATE (FOR NO KEY UPDATE) waits for; the trigger's UPDATE, a
-- statement of its own, then sees the parked job. A fail after it waits for its commit and
-- reads "enabled", and does not park.

CREATE OR REPLACE FUNCTION jobs.fail(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_error text, p_retry boolean, p_backoff_base_s double precision, p_backoff_max_s double precision) RETURNS TABLE(status text, state text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_reason text;
    v_state text;
    v_park boolean := false;
BEGIN
    v_reason := jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                                 p_attempt_id, p_generation, p_epoch);
    IF v_reason IS NOT NULL THEN
        RETURN QUERY SELECT v_reason, NULL::text;
        RETURN;
    END IF;
    IF p_retry AND p_error = 'effects_disabled' THEN
        -- The lock an enabling waits for (0038): parked here, the trigger then sees it.
        SELECT NOT w.effects_enabled INTO v_park
        FROM jobs.workflows w WHERE w.workflow = p_workflow FOR SHARE;
    END IF;
    -- jobs.fence_check holds this row and found it running under this lease.
    UPDATE jobs.jobs j
    SET state = jobs.next_state(j.job_id, j.attempts, j.max_attempts, p_retry),
        lease_expires_at = NULL, last_error = p_error, updated_at = now(),
        run_after = CASE WHEN v_park THEN 'infinity'::timestamptz
                         ELSE now() + jobs.backoff(j.attempts, p_backoff_base_s, p_backoff_max_s)
                    END
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
    RETURNING j.state INTO v_state;
    RETURN QUERY SELECT CASE WHEN v_state IS NULL THEN 'row_count' END, v_state;
END $$;

-- The class's refused jobs follow its flag: parked while its effects are disabled, due again
-- when they are enabled (and parked again if they are disabled before a claim took them).
-- Found through jobs_claimable_idx (both values of tenant_frozen, then run_after), never
-- among the class's finished jobs.
CREATE FUNCTION jobs.workflow_effects_sync() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    IF NEW.effects_enabled THEN
        UPDATE jobs.jobs j SET run_after = now(), updated_at = now()
        WHERE j.workflow = NEW.workflow AND j.state = 'queued'
          AND j.tenant_frozen = ANY (ARRAY[false, true])
          AND j.run_after = 'infinity'::timestamptz
          AND j.last_error = 'effects_disabled';
    ELSE
        UPDATE jobs.jobs j SET run_after = 'infinity'::timestamptz, updated_at = now()
        WHERE j.workflow = NEW.workflow AND j.state = 'queued'
          AND j.tenant_frozen = ANY (ARRAY[false, true])
          AND j.run_after < 'infinity'::timestamptz
          AND j.last_error = 'effects_disabled';
    END IF;
    RETURN NULL;
END $$;

REVOKE ALL ON FUNCTION jobs.workflow_effects_sync() FROM PUBLIC;

CREATE TRIGGER workflows_effects_sync AFTER UPDATE OF effects_enabled ON jobs.workflows
    FOR EACH ROW WHEN (OLD.effects_enabled IS DISTINCT FROM NEW.effects_enabled)
    EXECUTE FUNCTION jobs.workflow_effects_sync();

-- The jobs refused before this migration: parked where their class is still disabled.
UPDATE jobs.jobs j SET run_after = 'infinity'::timestamptz
FROM jobs.workflows w
WHERE w.workflow = j.workflow AND NOT w.effects_enabled
  AND j.state = 'queued' AND j.last_error = 'effects_disabled';
