-- 0033 Plans that hold as the tables grow. Two hazards of one kind: a plan chosen while a
-- table was small, or under statistics of a quiet moment, that reads a whole table or a whole
-- backlog on every call once the table has grown (autovacuum's ANALYZE would plan again, if
-- it runs, and only after it runs).
--
-- jobs.claim and jobs.succeed_many keep one generic plan per session from their first call
-- (0012). A worker that started while jobs.jobs was nearly empty cached plans that reach the
-- claimed rows by reading the table: measured on a scratch database, in the same session
-- 100,000 jobs later, a claim of five read 100,030 rows (49-70 ms against 0.5-0.7) and a
-- batch publish 102,029. With sequential scans off in these two functions, every plan they
-- cache reaches job rows by index (jobs_claimable_idx, jobs_pkey), whatever the table held
-- when it was made; tests/integration/jobs/test_schema.py holds them to it.
ALTER FUNCTION jobs.claim(text, text, double precision, integer) SET enable_seqscan = off;
ALTER FUNCTION jobs.succeed_many(bigint[], text[], text[], text[], text[], uuid[], bigint[],
                                 bigint[])
    SET enable_seqscan = off;

-- jobs.prune's second step re-reads its locked candidates. Under statistics taken while few
-- jobs were prunable, the plan read them through jobs_prunable_idx, filtering on the batch's
-- ids: every prunable job, for each batch (measured: 99,000 rows read to keep 1,000 of a
-- backlog of 100,000, then 98,000, ...), so that draining a backlog cost its square.
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

-- And each of its statements goes by index, whatever the statistics: without them (a table
-- never analyzed), the key's delete read jobs.operations whole for each batch (20,100 rows
-- to delete 100, in tests/integration/jobs/test_schema.py).
ALTER FUNCTION jobs.prune(double precision, double precision, integer) SET enable_seqscan = off;
