-- 0055 A handler's final verdict outlives an unresolved effect (a left-alone defect of the
-- repair path). A job given up without a retry (fail(retry=False): the runner's handler
-- defects, EffectUndeclared and the like, or a caller of Store.fail) while one of its
-- effects was unresolved became `unknown`, as it must; but once that effect was resolved,
-- jobs.repair_resolve_effect queued the job again (failed_before_dispatch) or `accord
-- reconcile` resumed it (succeeded): the job ran again, dispatching again what its handler
-- had given up on, a permanent failure retried as a transient one. jobs.jobs.final_failure
-- keeps the verdict; a resolution that leaves such a job nothing unresolved fails it.
ALTER TABLE jobs.jobs ADD COLUMN final_failure boolean NOT NULL DEFAULT false;

-- The jobs already unknown that the runner gave up without a retry: its handler defects
-- (jobs.runner.worker.HANDLER_DEFECTS, by the typed reason each stores as the last error). A
-- caller of Store.fail with retry=False and another reason cannot be told from a retry here:
-- such a job keeps the old way (queued or resumed once resolved).
UPDATE jobs.jobs SET final_failure = true
WHERE state = 'unknown'
  AND last_error IN ('effect_undeclared', 'idempotency_key_mismatch', 'effect_intent_invalid',
                     'effect_conflict', 'result_mismatch', 'object_key');

COMMENT ON COLUMN jobs.jobs.final_failure IS 'The last attempt gave the job up without a retry (jobs.fail with p_retry false): once no effect of it is unresolved it is failed, never queued or resumed (0055)';

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
        final_failure = NOT p_retry,
        lease_expires_at = NULL, last_error = p_error, updated_at = now(),
        run_after = CASE WHEN v_park THEN 'infinity'::timestamptz
                         ELSE now() + jobs.backoff(j.attempts, p_backoff_base_s, p_backoff_max_s)
                    END
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
    RETURNING j.state INTO v_state;
    RETURN QUERY SELECT CASE WHEN v_state IS NULL THEN 'row_count' END, v_state;
END $$;

CREATE OR REPLACE FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text, p_seq integer) RETURNS TABLE(status text, seq integer, job_state text, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    j jobs.jobs%ROWTYPE;
    e jobs.effects%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
    v_audit bigint;
BEGIN
    IF v_refusal IS NULL AND p_outcome NOT IN ('succeeded', 'failed_before_dispatch') THEN
        v_refusal := 'invalid_outcome';
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, NULL::integer, NULL::text, NULL::bigint;
        RETURN;
    END IF;
    SELECT * INTO j FROM jobs.jobs x WHERE x.job_id = p_job_id FOR UPDATE;
    IF NOT FOUND OR j.state = 'running' THEN
        RETURN QUERY SELECT CASE WHEN j.job_id IS NULL THEN 'missing' ELSE 'running' END,
                            NULL::integer, j.state, NULL::bigint;
        RETURN;
    END IF;
    SELECT * INTO e FROM jobs.effects x WHERE x.job_id = p_job_id AND x.effect_key = p_key
    ORDER BY x.seq DESC LIMIT 1 FOR UPDATE;
    IF NOT FOUND OR e.state NOT IN ('pending', 'unknown')
       OR (p_seq IS NOT NULL AND e.seq <> p_seq) THEN
        RETURN QUERY SELECT CASE WHEN e.job_id IS NULL THEN 'missing_effect'
                                 WHEN p_seq IS NOT NULL AND e.seq <> p_seq THEN 'seq_moved'
                                 ELSE 'not_unresolved' END, e.seq, j.state, NULL::bigint;
        RETURN;
    END IF;
    PERFORM set_config('accord.repair_effect',
                       jsonb_build_array(e.job_id, e.effect_key, e.seq)::text, true);
    UPDATE jobs.effects x SET state = p_outcome, receipt = coalesce(p_receipt, x.receipt),
                              finished_at = now()
    WHERE x.job_id = e.job_id AND x.effect_key = e.effect_key AND x.seq = e.seq;
    PERFORM set_config('accord.repair_effect', '', true);
    IF j.state = 'unknown' AND j.final_failure THEN
        -- Given up without a retry (0055): with nothing unresolved left it is failed, as
        -- jobs.fail would have made it had the outcomes been known then; never run again.
        IF NOT jobs.unresolved_effects(p_job_id) THEN
            UPDATE jobs.jobs x SET state = 'failed', updated_at = now()
            WHERE x.job_id = p_job_id RETURNING x.state INTO j.state;
        END IF;
    -- An unknown job with nothing left forbidding a rerun is queued again, unless its
    -- tenant's restore is open: then it stays unknown, for a person to resume after.
    ELSIF j.state = 'unknown' AND NOT jobs.blocking_effects(p_job_id)
       AND NOT EXISTS (SELECT 1 FROM jobs.authority_restores r
                       WHERE r.tenant = j.tenant AND r.resolved_at IS NULL) THEN
        UPDATE jobs.jobs x SET state = 'queued', generation = x.generation + 1,
                               run_after = now(), updated_at = now()
        WHERE x.job_id = p_job_id RETURNING x.state INTO j.state;
    END IF;
    v_audit := jobs.repair_audit_row('resolve_effect', p_who, j.tenant, p_job_id, p_key, e.seq,
                                     p_outcome, p_evidence,
                                     jsonb_build_object('from', e.state, 'receipt', p_receipt,
                                                        'job_state', j.state));
    RETURN QUERY SELECT NULL::text, e.seq, j.state, v_audit;
END $$;
