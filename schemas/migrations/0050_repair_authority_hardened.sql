-- 0050 Repair authority, hardened (a review of authority and repair).
-- * jobs.authority_hold recorded the ledger's restriction of an open detection from each call
--   at the same ledger epoch or later: a call at the same epoch with p_ledger_frozen false
--   (callable by the worker and the repair role) cleared it, and the repair advance then
--   lifted a restriction the ledger still held. The ledger changes a restriction only with
--   an epoch: at the same epoch a recorded restriction now stays. NULL arguments are refused.
-- * jobs.repair_advance_epoch with a NULL ledger epoch skipped the behind_detection check
--   (NULL < n is NULL) and greatest() ignored it: an advance below the detected ledger epoch
--   resolved the restore. Each NULL is now a refusal, and the new epoch must pass the
--   detected ledger epoch too.
-- * jobs.repair_resolve_effect resolved the key's latest record, whatever it was by then:
--   reconcile asked the provider about seq 1, the job began seq 2 meanwhile, and seq 2 (a
--   request in flight) was resolved failed_before_dispatch with seq 1's answer. It takes the
--   seq the evidence is about (p_seq; NULL: the latest, as before) and refuses another
--   (seq_moved). The six-argument form stays (the effects guard names it) and calls it.

CREATE OR REPLACE FUNCTION jobs.authority_hold(p_tenant text, p_ledger_epoch bigint, p_ledger_frozen boolean DEFAULT false) RETURNS TABLE(restore_id bigint, tenant text, db_epoch bigint, ledger_epoch bigint, held_jobs integer, newly_detected boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    t jobs.tenants%ROWTYPE;
    v_held integer;
BEGIN
    INSERT INTO jobs.tenants AS x (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    -- Waits for a rotation holding the row (its ledger intent may be ahead until it commits).
    SELECT * INTO t FROM jobs.tenants x WHERE x.tenant = p_tenant FOR UPDATE;
    IF p_ledger_epoch IS NULL OR p_ledger_frozen IS NULL THEN
        RAISE EXCEPTION 'authority_hold needs the ledger epoch and restriction'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF t.epoch >= p_ledger_epoch THEN
        RETURN;
    END IF;
    UPDATE jobs.tenants x SET frozen = true, updated_at = now() WHERE x.tenant = p_tenant;
    WITH h AS (
        UPDATE jobs.jobs j
        SET state = 'held', generation = j.generation + 1, lease_expires_at = NULL,
            last_error = 'restore_detected', updated_at = now()
        WHERE j.tenant = p_tenant AND (j.state = 'queued' OR j.state = 'running')
        RETURNING 1
    ) SELECT count(*) INTO v_held FROM h;
    -- The ledger's restriction at its highest epoch: what the repair's advance must keep.
    RETURN QUERY
        INSERT INTO jobs.authority_restores AS r (tenant, db_epoch, ledger_epoch, ledger_frozen,
                                                  held_jobs, detected_by)
        VALUES (p_tenant, t.epoch, p_ledger_epoch, p_ledger_frozen, v_held, session_user)
        ON CONFLICT (tenant) WHERE resolved_at IS NULL DO UPDATE
        SET held_jobs = r.held_jobs + excluded.held_jobs,
            -- A later ledger epoch says what the restriction is now; at the same epoch a
            -- restriction, once recorded, stays (the ledger changes it only with an epoch).
            ledger_frozen = CASE WHEN excluded.ledger_epoch > r.ledger_epoch
                                 THEN excluded.ledger_frozen
                                 WHEN excluded.ledger_epoch = r.ledger_epoch
                                 THEN r.ledger_frozen OR excluded.ledger_frozen
                                 ELSE r.ledger_frozen END,
            ledger_epoch = greatest(r.ledger_epoch, excluded.ledger_epoch),
            last_seen_at = now()
        RETURNING r.restore_id, r.tenant, r.db_epoch, r.ledger_epoch, r.held_jobs,
                  (r.detected_at = r.last_seen_at);
END $$;

CREATE OR REPLACE FUNCTION jobs.repair_advance_epoch(p_tenant text, p_new_epoch bigint, p_ledger_epoch bigint, p_frozen boolean, p_who text, p_evidence text) RETURNS TABLE(status text, epoch bigint, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    t jobs.tenants%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
    v_detected bigint;
    v_restricted boolean;
    v_audit bigint;
BEGIN
    IF v_refusal IS NULL THEN
        SELECT * INTO t FROM jobs.tenants x WHERE x.tenant = p_tenant FOR UPDATE;
        -- The ledger epoch the open restore recorded: the caller's may not be below it.
        SELECT max(r.ledger_epoch), bool_or(r.ledger_frozen) INTO v_detected, v_restricted
        FROM jobs.authority_restores r WHERE r.tenant = p_tenant AND r.resolved_at IS NULL;
        v_refusal := CASE
            WHEN t.tenant IS NULL THEN 'missing'
            WHEN v_detected IS NULL THEN 'no_restore'
            WHEN p_ledger_epoch IS NULL OR p_ledger_epoch < v_detected THEN 'behind_detection'
            WHEN p_frozen IS NULL OR (v_restricted AND NOT p_frozen) THEN 'keeps_restriction'
            WHEN p_new_epoch IS NULL
              OR p_new_epoch <= greatest(t.epoch, p_ledger_epoch, v_detected) THEN 'not_past_ledger'
        END;
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, t.epoch, NULL::bigint;
        RETURN;
    END IF;
    UPDATE jobs.tenants x SET epoch = p_new_epoch, frozen = p_frozen, updated_at = now()
    WHERE x.tenant = p_tenant;
    PERFORM jobs.drain_fences(p_tenant);
    v_audit := jobs.repair_audit_row(
        'advance_epoch', p_who, p_tenant, NULL, NULL, NULL, p_new_epoch::text, p_evidence,
        jsonb_build_object('from_epoch', t.epoch, 'ledger_epoch', p_ledger_epoch,
                           'was_frozen', t.frozen, 'frozen', p_frozen));
    UPDATE jobs.authority_restores r
    SET resolved_at = now(), resolved_epoch = p_new_epoch, resolved_audit = v_audit
    WHERE r.tenant = p_tenant AND r.resolved_at IS NULL;
    RETURN QUERY SELECT NULL::text, p_new_epoch, v_audit;
END $$;

CREATE FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text, p_seq integer) RETURNS TABLE(status text, seq integer, job_state text, audit_id bigint)
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
    -- An unknown job with nothing left forbidding a rerun is queued again, unless its
    -- tenant's restore is open: then it stays unknown, for a person to resume after.
    IF j.state = 'unknown' AND NOT jobs.blocking_effects(p_job_id)
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

-- jobs.effects_guard lets an unknown record be resolved only by the owner of the six-argument
-- form: the seven-argument form, which now does the update, is given the same owner.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION jobs.repair_resolve_effect(bigint, text, text, text, text, text, integer) OWNER TO %I',
        (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p
         WHERE p.oid = 'jobs.repair_resolve_effect(bigint,text,text,text,text,text)'::regprocedure));
END $$;

REVOKE ALL ON FUNCTION jobs.repair_resolve_effect(bigint, text, text, text, text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.repair_resolve_effect(bigint, text, text, text, text, text, integer) TO accord_repair;

CREATE OR REPLACE FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text) RETURNS TABLE(status text, seq integer, job_state text, audit_id bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT * FROM jobs.repair_resolve_effect(p_job_id, p_key, p_outcome, p_receipt, p_who,
                                             p_evidence, NULL::integer)
$$;
