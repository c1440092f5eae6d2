-- 0031 The audit pruners read only the rows they may remove. jobs.prune's repair audit step
-- and relay.prune_release_audit chose their batch as `at < cutoff ORDER BY audit_id` with no
-- index on `at`: every call read every audit row still within its retention (measured: 0.8 ms
-- a call with 1,000 kept rows, 108 ms with 100,000), so a pruner's cost grew with the history
-- it keeps. Each table now has an index on (at, audit_id) and each pruner takes its batch in
-- that order, so a call reads the expired rows and stops at the cutoff; what it still reads
-- and skips is an expired row something keeps (its job still there, a restore naming it, an
-- outbox row not published). The order within a batch changes from id to time, the same
-- order up to rows written in one transaction.
CREATE INDEX repair_audit_at_idx ON jobs.repair_audit (at, audit_id);
CREATE INDEX release_audit_at_idx ON relay.release_audit (at, audit_id);

CREATE OR REPLACE FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) RETURNS TABLE(jobs_pruned integer, effects_pruned integer, results_pruned integer, audit_pruned integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz;
    v_ids bigint[];
    v_jobs integer := 0;
    v_effects integer := 0;
    v_results integer := 0;
    v_audit integer := 0;
    v_consumer text;
    v_horizon double precision;
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
        SELECT array_agg(j.job_id) INTO v_ids FROM jobs.jobs j
        WHERE j.job_id = ANY (v_ids)
          AND j.state IN ('succeeded', 'failed', 'canceled') AND j.unresolved_effects = 0
          AND j.updated_at < v_cutoff
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id
                            AND (e.state IN ('pending', 'unknown') OR e.finished_at >= v_cutoff));
    END IF;
    PERFORM set_config('accord.prune', 'jobs', true);
    IF v_ids IS NOT NULL THEN
        -- Children first; the job before its key (jobs_operation_fkey is immediate, the key's
        -- own reference to the job is deferred).
        DELETE FROM jobs.effect_escalations x WHERE x.job_id = ANY (v_ids);
        DELETE FROM jobs.effect_traces x WHERE x.job_id = ANY (v_ids);
        DELETE FROM jobs.effects e WHERE e.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_effects = ROW_COUNT;
        DELETE FROM jobs.results r WHERE r.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_results = ROW_COUNT;
        DELETE FROM jobs.jobs j WHERE j.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_jobs = ROW_COUNT;
        DELETE FROM jobs.operations o WHERE o.job_id = ANY (v_ids);
    END IF;
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
        LIMIT p_limit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.repair_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_audit FROM gone;
    PERFORM set_config('accord.prune', '', true);
    -- Another schema's deferred foreign key to a removed job fails here, by name.
    SET CONSTRAINTS ALL IMMEDIATE;
    RETURN QUERY SELECT v_jobs, v_effects, v_results, v_audit;
END $$;

CREATE OR REPLACE FUNCTION relay.prune_release_audit(p_retention_s double precision, p_limit integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000
       OR p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'relay.prune_release_audit: retention % s, batch %', p_retention_s,
            p_limit USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('accord.prune', 'relay', true);
    WITH doomed AS (
        SELECT a.audit_id FROM relay.release_audit a
        WHERE a.at < now() - make_interval(secs => p_retention_s)
          AND NOT EXISTS (SELECT 1 FROM relay.outbox o
                          WHERE o.id = a.outbox_id AND o.state <> 'published')
        ORDER BY a.at, a.audit_id
        LIMIT p_limit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM relay.release_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_n FROM gone;
    PERFORM set_config('accord.prune', '', true);
    RETURN v_n;
END $$;

COMMENT ON FUNCTION jobs.prune(double precision, double precision, integer) IS
    'Remove one bounded batch of finished, resolved jobs older than the retention, never shorter than the longest declared replay horizon (with their key, effects, traces, escalations and result manifest) and of repair audit rows older than the audit retention, oldest first; counts per table (0031)';

COMMENT ON FUNCTION relay.prune_release_audit(double precision, integer) IS
    'Remove one bounded batch of release audit rows older than the retention whose outbox row is resolved, oldest first; the count (0031)';
