-- 0060 Old work of a restored tenant runs again only through a person, unknown jobs
-- included, and two advances at once are told apart (a review of restore authority).
--   * jobs.authority_hold holds the tenant's `unknown` jobs too. Left `unknown`, a job whose
--     effect was resolved after the epoch's advance (an unattended `accord reconcile`: a
--     receipt, or "never seen") was resumed or queued with no person looking, and what its
--     lost history had done after the restore's point (an effect begun, a publish) ran
--     again. Held, resolving its effect leaves it held, and a person's release decides.
--     Such a job keeps its last error (why it was unknown), as a parked job keeps
--     effects_disabled. At the upgrade, the `unknown` jobs of a tenant whose restore is open
--     are held, counted in it, and so are those of a tenant whose restore was advanced
--     already that were claimed before the advance.
--   * jobs.repair_release_hold fails a job its handler gave up for good (final_failure,
--     0055) with nothing unresolved, instead of queueing it.
--   * jobs.authority_lock reads whether a restore is open after it holds the tenant's row,
--     in a statement of its own: an advance that waited for another one's commit saw the
--     restore still open (the snapshot before the wait), appended a new epoch to the
--     ledger and was refused by the database (no_restore), and the ledger, now ahead,
--     froze the tenant again at the next check. It is refused now before the ledger.
CREATE OR REPLACE FUNCTION jobs.authority_hold(p_tenant text, p_ledger_epoch bigint, p_ledger_frozen boolean DEFAULT false) RETURNS TABLE(restore_id bigint, tenant text, db_epoch bigint, ledger_epoch bigint, held_jobs integer, newly_detected boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
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
    -- Unknown jobs too (0060): resolved after the advance, an unattended reconcile would
    -- have queued or resumed them; they keep their last error (why they were unknown).
    WITH h AS (
        UPDATE jobs.jobs j
        SET state = 'held', generation = j.generation + 1, lease_expires_at = NULL,
            -- why an unknown job was given up, and a parked job's effects_disabled (its
            -- claim's eligibility reads it), are kept
            last_error = CASE WHEN j.state = 'unknown' OR j.last_error = 'effects_disabled'
                              THEN j.last_error ELSE 'restore_detected' END,
            updated_at = now()
        -- spelled as ORs: each state's partial index (queued, running, attention) serves it
        WHERE j.tenant = p_tenant
          AND (j.state = 'queued' OR j.state = 'running' OR j.state = 'unknown')
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

CREATE OR REPLACE FUNCTION jobs.authority_lock(p_tenant text) RETURNS TABLE(epoch bigint, frozen boolean, open_restore boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    t jobs.tenants%ROWTYPE;
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    SELECT * INTO t FROM jobs.tenants x WHERE x.tenant = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'jobs.authority_lock: tenant % has no row', p_tenant
            USING ERRCODE = 'no_data_found';
    END IF;
    -- A new statement, hence a snapshot taken after the lock (READ COMMITTED: each statement
    -- its own): a restore another advance resolved while this one waited reads resolved.
    RETURN QUERY SELECT t.epoch, t.frozen,
                        EXISTS (SELECT 1 FROM jobs.authority_restores r
                                WHERE r.tenant = p_tenant AND r.resolved_at IS NULL);
END $$;

CREATE OR REPLACE FUNCTION jobs.repair_release_hold(p_job_id bigint, p_who text, p_evidence text) RETURNS TABLE(status text, job_state text, audit_id bigint)
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
            WHEN j.state <> 'held' THEN 'not_held'
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
    SET state = CASE WHEN x.final_failure AND NOT jobs.unresolved_effects(x.job_id)
                          THEN 'failed'  -- given up for good (0055): never run again
                     WHEN jobs.blocking_effects(x.job_id) THEN 'unknown'
                     ELSE 'queued' END,
        generation = x.generation + 1, run_after = now(), updated_at = now()
    WHERE x.job_id = p_job_id RETURNING x.state INTO j.state;
    RETURN QUERY SELECT NULL::text, j.state,
        jobs.repair_audit_row('release_hold', p_who, j.tenant, p_job_id, NULL, NULL, j.state,
                              p_evidence, '{}'::jsonb);
END $$;

-- At the upgrade: the unknown jobs of a tenant whose restore is open (counted in it), and
-- those of a tenant whose restore was already advanced that were claimed before its advance
-- (an epoch below the one it advanced to: old work; nothing is claimed while one is open).
WITH h AS (
    UPDATE jobs.jobs j
    SET state = 'held', generation = j.generation + 1, updated_at = now()
    WHERE j.state = 'unknown'
      AND (EXISTS (SELECT 1 FROM jobs.authority_restores r
                   WHERE r.tenant = j.tenant AND r.resolved_at IS NULL)
           OR j.epoch < (SELECT max(r.resolved_epoch) FROM jobs.authority_restores r
                         WHERE r.tenant = j.tenant))
    RETURNING j.tenant
)
UPDATE jobs.authority_restores r SET held_jobs = r.held_jobs + c.n
FROM (SELECT tenant, count(*)::integer AS n FROM h GROUP BY tenant) c
WHERE r.tenant = c.tenant AND r.resolved_at IS NULL;
