-- 0063 Retention keeps what may still be needed (a review of retention's races and clocks).
--   * A job's operation key outlives the replay horizon by the inbox's future tolerance too.
--     An event's enqueue time (the producer database's clock) may run up to the prune margin
--     ahead of the consumer's; one class admits it that early and finishes its job at once,
--     another admits the same event up to the horizon later. With a retention at exactly the
--     horizon (the least jobs.prune allows) the key could go just as the second class admitted
--     the event, and its submit, later in the same transaction, created a second job: the work
--     ran twice. The key (with the job) is now kept the longest horizon plus the largest
--     declared margin (the admission's tolerance, declared by each consumer);
--     the refusal of a retention shorter than the horizon is unchanged.
--   * jobs.note_trace holds the job (FOR KEY SHARE) before it records an effect's trace: it
--     read the effect row without a lock, and racing jobs.prune it left a trace row whose job
--     was gone, which nothing ever removed. Such rows already written are removed here.
--   * Acknowledged journal evidence is no longer removed after the audit retention: a worker
--     whose journal still carried the begin (stopped, or idle and never rotating since)
--     found no note at its next start and noted the begin again, unacknowledged, for a person
--     to recheck (0054). Notes come only from what a restore lost, not from traffic. The
--     repair audit row of a note's acknowledgement (who, with what evidence) stays with it.

CREATE OR REPLACE FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) RETURNS TABLE(jobs_pruned integer, effects_pruned integer, results_pruned integer, audit_pruned integer, tombstones_pruned integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz;
    v_ids bigint[];
    v_jobs integer := 0;
    v_effects integer := 0;
    v_results integer := 0;
    v_audit integer := 0;
    v_tombstones integer := 0;
    v_rows integer;
    v_consumer text;
    v_horizon double precision;
    v_key_horizon double precision;
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
    -- An event's enqueue time may run ahead of this clock by the inbox's future tolerance
    -- (its prune margin, which each consumer declares, 0063): one class may finish the job
    -- that long before another class admits the same event for the last time, a horizon
    -- after its date. The key is kept that much longer, so the margin a late submit relies
    -- on is never spent on a clock ahead; the two classes may be any two consumers.
    SELECT max(h.horizon_s) + max(w.margin_s) INTO v_key_horizon
    FROM consumers.replay_horizons h JOIN consumers.replay_windows w USING (consumer);
    v_cutoff := now() - make_interval(secs => greatest(p_retention_s, v_key_horizon));
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
        -- Each attempt whose effects go leaves a tombstone (0054): a journaled begin of that
        -- attempt was resolved here, and its worker's journal may let it go.
        WITH gone AS (
            DELETE FROM jobs.effects e WHERE e.job_id = ANY (v_ids) RETURNING e.attempt_id
        ), kept AS (
            INSERT INTO jobs.pruned_attempts (attempt_id)
            SELECT DISTINCT g.attempt_id FROM gone g
            ON CONFLICT (attempt_id) DO NOTHING
        ) SELECT count(*) INTO v_effects FROM gone;
        DELETE FROM jobs.results r WHERE r.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_results = ROW_COUNT;
        DELETE FROM jobs.jobs j WHERE j.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_jobs = ROW_COUNT;
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
    -- keeps its repair history) and unless a restore record or a journal evidence note (kept
    -- for good, 0063: who acknowledged it) names them.
    WITH doomed AS (
        SELECT a.audit_id FROM jobs.repair_audit a
        WHERE a.at < now() - make_interval(secs => p_audit_retention_s)
          AND (a.job_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM jobs.jobs j WHERE j.job_id = a.job_id))
          AND NOT EXISTS (SELECT 1 FROM jobs.authority_restores r
                          WHERE r.resolved_audit = a.audit_id)
          AND NOT EXISTS (SELECT 1 FROM jobs.journal_evidence v WHERE v.audit_id = a.audit_id)
        ORDER BY a.at, a.audit_id
        LIMIT p_limit - v_audit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.repair_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_audit + v_rows;
    -- Tombstones one more retention after their job went (a worker down longer than that
    -- reports its begins of such attempts as evidence, for a person to acknowledge). Journal
    -- evidence is never removed (0063): an acknowledged note is the only thing that lets a
    -- journal drop its begin, at that journal's next start or rotation, which may come after
    -- any retention (a worker stopped, or idle); notes come only from what a restore lost.
    WITH doomed AS (
        SELECT t.attempt_id FROM jobs.pruned_attempts t
        WHERE t.pruned_at < v_cutoff
        ORDER BY t.pruned_at
        LIMIT p_limit
        FOR UPDATE OF t SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.pruned_attempts t USING doomed d WHERE t.attempt_id = d.attempt_id
        RETURNING 1
    ) SELECT count(*) INTO v_tombstones FROM gone;
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
    RETURN QUERY SELECT v_jobs, v_effects, v_results, v_audit, v_tombstones;
END $$;

CREATE OR REPLACE FUNCTION jobs.note_trace(p_job_id bigint, p_attempt_id uuid, p_effect_key text, p_seq integer, p_trace jsonb) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_effect_key IS NULL THEN
        UPDATE jobs.jobs SET attempt_trace = p_trace
        WHERE job_id = p_job_id AND attempt_id = p_attempt_id;
        RETURN FOUND;
    END IF;
    -- Hold the job, as every writer of a job's rows does (0063): jobs.prune, which takes
    -- its batch FOR UPDATE SKIP LOCKED, passes it by, or has removed it (nothing to note).
    PERFORM 1 FROM jobs.jobs j WHERE j.job_id = p_job_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO jobs.effect_traces (job_id, effect_key, seq, trace)
    SELECT e.job_id, e.effect_key, e.seq, p_trace FROM jobs.effects e
    WHERE e.job_id = p_job_id AND e.effect_key = p_effect_key AND e.seq = p_seq
      AND e.attempt_id = p_attempt_id
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END $$;

DELETE FROM jobs.effect_traces t
WHERE NOT EXISTS (SELECT 1 FROM jobs.jobs j WHERE j.job_id = t.job_id);

COMMENT ON FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) IS 'Remove one bounded batch of finished, resolved jobs older than the retention, never shorter than the longest declared replay horizon and kept past it by the inbox''s future tolerance (with their key, effects, traces, escalations and result manifest, leaving a tombstone per attempt whose effects go), of tombstones one retention old, and of audit rows older than the audit retention (resolved restore records, registration audit rows but each class''s newest, repair audit rows whose job is gone; never journal evidence), oldest first; counts per table, tombstones included (0031, 0042, 0054, 0063)';

CREATE INDEX journal_evidence_audit_idx ON jobs.journal_evidence (audit_id)
    WHERE audit_id IS NOT NULL;
