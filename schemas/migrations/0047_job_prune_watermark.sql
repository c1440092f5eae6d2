-- 0047 How far job retention went, kept: jobs.pruned holds the highest job id jobs.prune ever
-- removed. A worker's start asks the database about each effect its journal says was begun;
-- a begin whose job is gone was taken as resolved when the journal held that job's publish
-- (retention removes only resolved jobs), and as a restore's evidence otherwise. Both were
-- wrong: after a restore to before the begin the publish in the journal made the start drop
-- the only evidence of a dispatched call, and a job that failed (no publish) and was pruned
-- while the worker was down was reported and carried at every start, for ever. A job gone at
-- or below jobs.pruned was pruned (its effects resolved when it went: a job with an effect
-- can leave no other way, jobs.effects_guard); one gone above it, or one whose row holds no
-- record of that begin, is evidence.

CREATE TABLE jobs.pruned (
    one boolean DEFAULT true NOT NULL,
    through_job_id bigint NOT NULL,
    CONSTRAINT pruned_one_check CHECK (one),
    CONSTRAINT pruned_pkey PRIMARY KEY (one)
);

COMMENT ON TABLE jobs.pruned IS 'The highest job id jobs.prune removed: a journaled begin of a job gone at or below it was resolved (0047)';

GRANT SELECT ON TABLE jobs.pruned TO accord_worker;
GRANT SELECT ON TABLE jobs.pruned TO accord_repair;

CREATE OR REPLACE FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) RETURNS TABLE(jobs_pruned integer, effects_pruned integer, results_pruned integer, audit_pruned integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz;
    v_ids bigint[];
    v_jobs integer := 0;
    v_effects integer := 0;
    v_results integer := 0;
    v_audit integer := 0;
    v_rows integer;
    v_consumer text;
    v_horizon double precision;
    v_refs text;
    v_deferred text;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'jobs.prune: a batch holds 1 to 10000 jobs, not %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity')
       OR p_audit_retention_s IS NULL OR NOT (p_audit_retention_s >= p_retention_s
                                              AND p_audit_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'jobs.prune: retention % s and audit retention % s (at least as long)',
            p_retention_s, p_audit_retention_s USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The replay horizon (0027): a job's operation key outlives every redelivery that a
    -- consumer may still admit, whichever process asks for the batch.
    SELECT h.consumer, h.horizon_s INTO v_consumer, v_horizon FROM consumers.replay_horizon(NULL) h;
    IF p_retention_s < v_horizon THEN
        RAISE EXCEPTION 'jobs.prune: retention % s is shorter than the replay horizon of consumer % (% s)',
            p_retention_s, v_consumer, v_horizon
            USING ERRCODE = 'AR001',
                  DETAIL = json_build_object('consumer', v_consumer, 'horizon_s', v_horizon)::text,
                  HINT = 'a redelivery could outlive its job: set the retention to at least the horizon';
    END IF;
    v_cutoff := now() - make_interval(secs => p_retention_s);
    -- Step 1: lock one batch of candidates, oldest first; a row another transaction holds
    -- (a submit returning it, a stale fence, a repair) is skipped, never waited on.
    SELECT array_agg(c.job_id) INTO v_ids FROM (
        SELECT j.job_id FROM jobs.jobs j
        WHERE j.state IN ('succeeded', 'failed', 'canceled') AND j.unresolved_effects = 0
          AND j.updated_at < v_cutoff
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id
                            AND (e.state IN ('pending', 'unknown') OR e.finished_at >= v_cutoff))
        ORDER BY j.updated_at
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED
    ) c;
    IF v_ids IS NOT NULL THEN
        -- Step 2: a new snapshot, taken while we hold the locks (as jobs.rescue does): keep
        -- only the candidates that are still finished, old and resolved. Nothing can change
        -- them from here on: every writer of a job or its effects locks the job row first.
        -- The candidates by primary key, the rest tested on each (0033): spelled as one IS
        -- TRUE, the conditions no longer match jobs_prunable_idx's predicate, which a plan
        -- made under quiet statistics would otherwise read whole for each batch; OFFSET 0
        -- keeps the effects test a lookup per candidate, not a join over every effect.
        SELECT array_agg(j.job_id) INTO v_ids FROM jobs.jobs j
        WHERE j.job_id = ANY (v_ids)
          AND (j.state IN ('succeeded', 'failed', 'canceled') AND j.unresolved_effects = 0
               AND j.updated_at < v_cutoff) IS TRUE
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id
                            AND (e.state IN ('pending', 'unknown') OR e.finished_at >= v_cutoff)
                          OFFSET 0);
    END IF;
    PERFORM set_config('accord.prune', 'jobs', true);
    IF v_ids IS NOT NULL THEN
        -- Children first; the job before its key (jobs_operation_fkey is immediate, the key's
        -- own reference to the job is deferred: deferred again here, whatever an earlier
        -- batch or the caller set in this transaction, 0039).
        SET CONSTRAINTS jobs.operations_job_fkey DEFERRED;
        DELETE FROM jobs.effect_escalations x WHERE x.job_id = ANY (v_ids);
        DELETE FROM jobs.effect_traces x WHERE x.job_id = ANY (v_ids);
        DELETE FROM jobs.effects e WHERE e.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_effects = ROW_COUNT;
        DELETE FROM jobs.results r WHERE r.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_results = ROW_COUNT;
        DELETE FROM jobs.jobs j WHERE j.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_jobs = ROW_COUNT;
        -- How far retention went (0047): a worker's start takes a journaled begin whose job
        -- is gone at or below it as resolved (pruned), one above it as a restore's evidence.
        INSERT INTO jobs.pruned AS p (through_job_id)
        SELECT max(x.id) FROM unnest(v_ids) AS x(id)
        ON CONFLICT (one) DO UPDATE
        SET through_job_id = GREATEST(p.through_job_id, EXCLUDED.through_job_id);
        DELETE FROM jobs.operations o WHERE o.job_id = ANY (v_ids);
    END IF;
    -- The audit tables share the batch's budget of p_limit rows (0042). Resolved restore
    -- records past the audit retention first (an open one holds its tenant and stays, whatever
    -- its age): the repair audit rows they name may then follow in the same batch.
    WITH doomed AS (
        SELECT a.restore_id FROM jobs.authority_restores a
        WHERE a.resolved_at < now() - make_interval(secs => p_audit_retention_s)
        ORDER BY a.resolved_at, a.restore_id
        LIMIT p_limit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.authority_restores a USING doomed d WHERE a.restore_id = d.restore_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_rows;
    -- Registration audit rows past the audit retention, but never a class's newest: it names
    -- who registered the owner and effects flag in force, however long ago (0042).
    WITH doomed AS (
        SELECT a.audit_id FROM jobs.registration_audit a
        WHERE a.at < now() - make_interval(secs => p_audit_retention_s)
          AND EXISTS (SELECT 1 FROM jobs.registration_audit later
                      WHERE later.workflow = a.workflow AND later.audit_id > a.audit_id)
        ORDER BY a.at, a.audit_id
        LIMIT p_limit - v_audit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.registration_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_audit + v_rows;
    -- Repair audit rows past their own retention, once their job is gone (a job still kept
    -- keeps its repair history) and unless a restore record names them.
    WITH doomed AS (
        SELECT a.audit_id FROM jobs.repair_audit a
        WHERE a.at < now() - make_interval(secs => p_audit_retention_s)
          AND (a.job_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM jobs.jobs j WHERE j.job_id = a.job_id))
          AND NOT EXISTS (SELECT 1 FROM jobs.authority_restores r
                          WHERE r.resolved_audit = a.audit_id)
        ORDER BY a.at, a.audit_id
        LIMIT p_limit - v_audit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.repair_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_audit + v_rows;
    PERFORM set_config('accord.prune', '', true);
    -- Another schema's deferred foreign key to a removed job fails here, by name: the
    -- deferrable references to jobs.jobs are checked now, then set back to their declared
    -- mode (0039; ALL IMMEDIATE left every deferred constraint of the caller's transaction
    -- immediate, and a second batch in it failed on the key's own reference).
    SELECT string_agg(format('%I.%I', n.nspname, c.conname), ', '),
           string_agg(format('%I.%I', n.nspname, c.conname), ', ') FILTER (WHERE c.condeferred)
    INTO v_refs, v_deferred
    FROM pg_catalog.pg_constraint c JOIN pg_catalog.pg_namespace n ON n.oid = c.connamespace
    WHERE c.contype = 'f' AND c.confrelid = 'jobs.jobs'::regclass AND c.condeferrable;
    IF v_refs IS NOT NULL THEN
        EXECUTE 'SET CONSTRAINTS ' || v_refs || ' IMMEDIATE';
    END IF;
    IF v_deferred IS NOT NULL THEN
        EXECUTE 'SET CONSTRAINTS ' || v_deferred || ' DEFERRED';
    END IF;
    RETURN QUERY SELECT v_jobs, v_effects, v_results, v_audit;
END $$;

COMMENT ON FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) IS 'Remove one bounded batch of finished, resolved jobs older than the retention, never shorter than the longest declared replay horizon (with their key, effects, traces, escalations and result manifest), and of audit rows older than the audit retention (resolved restore records, registration audit rows but each class''s newest, repair audit rows whose job is gone), oldest first, recording the highest job id removed in jobs.pruned; counts per table (0031, 0042, 0047)';
