-- 0027 the replay horizon is the database's to keep. A finished job (its operation key) and a
-- poison record must outlive every redelivery a consumer may still admit, and until now only
-- the `accord` commands checked their settings for it: a service composing its own worker or
-- consumer could prune inside a consumer's window. Each consumer now declares its replay
-- window (and its pruner's margin) when it starts, the last declaration of a consumer
-- standing; jobs.prune refuses a retention shorter than the longest declared horizon, and
-- consumers.prune_poison one shorter than its own consumer's (SQLSTATE AR001, the horizon
-- and its consumer in DETAIL as JSON). No declaration: nothing to outlive, nothing refused.

CREATE TABLE consumers.replay_windows (
    consumer text PRIMARY KEY,
    replay_window_s double precision NOT NULL
        CHECK (replay_window_s > 0 AND replay_window_s < 'infinity'),
    margin_s double precision NOT NULL CHECK (margin_s >= 0 AND margin_s < 'infinity'),
    declared_at timestamptz NOT NULL DEFAULT now(),
    declared_by text NOT NULL DEFAULT session_user
);

COMMENT ON TABLE consumers.replay_windows IS
    'Each consumer''s replay window and prune margin as it last declared them at start (0027)';

-- Declare (or re-declare) a consumer's window: the consumer role writes only through here.
CREATE FUNCTION consumers.declare_window(
    p_consumer text, p_replay_window_s double precision, p_margin_s double precision
)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO consumers.replay_windows AS w (consumer, replay_window_s, margin_s)
    VALUES (p_consumer, p_replay_window_s, p_margin_s)
    ON CONFLICT (consumer) DO UPDATE
    SET replay_window_s = EXCLUDED.replay_window_s, margin_s = EXCLUDED.margin_s,
        declared_at = now(), declared_by = session_user
    WHERE (w.replay_window_s, w.margin_s) IS DISTINCT FROM
          (EXCLUDED.replay_window_s, EXCLUDED.margin_s);
END $$;

COMMENT ON FUNCTION consumers.declare_window(text, double precision, double precision) IS
    'Record a consumer''s replay window and prune margin, replacing its earlier declaration (0027)';

-- The longest declared horizon (window + margin), of one consumer or (NULL) of all, with the
-- consumer that sets it; no row when none is declared.
CREATE FUNCTION consumers.replay_horizon(p_consumer text)
RETURNS TABLE(consumer text, horizon_s double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT w.consumer, w.replay_window_s + w.margin_s FROM consumers.replay_windows w
    WHERE p_consumer IS NULL OR w.consumer = p_consumer
    ORDER BY 2 DESC, 1
    LIMIT 1
$$;

COMMENT ON FUNCTION consumers.replay_horizon(text) IS
    'The longest declared replay horizon (window + margin) of one consumer, or of all, and its consumer (0027)';

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
        ORDER BY a.audit_id
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

CREATE OR REPLACE FUNCTION consumers.prune_poison(
    p_consumer text, p_retention_s double precision, p_limit integer
)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_n integer;
    v_horizon double precision;
BEGIN
    IF p_consumer IS NULL OR p_limit IS NULL OR p_limit < 1 OR p_limit > 10000
       OR p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'consumers.prune_poison: consumer %, retention % s, batch %',
            p_consumer, p_retention_s, p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT h.horizon_s INTO v_horizon FROM consumers.replay_horizon(p_consumer) h;
    IF p_retention_s < v_horizon THEN
        RAISE EXCEPTION 'consumers.prune_poison: retention % s is shorter than the replay horizon of consumer % (% s)',
            p_retention_s, p_consumer, v_horizon
            USING ERRCODE = 'AR001',
                  DETAIL = json_build_object('consumer', p_consumer, 'horizon_s', v_horizon)::text,
                  HINT = 'a redelivery could outlive its poison record: set the retention to at least the horizon';
    END IF;
    WITH doomed AS (
        SELECT p.id FROM consumers.poison p
        WHERE p.consumer = p_consumer
          AND p.created_at < now() - make_interval(secs => p_retention_s)
        ORDER BY p.created_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM consumers.poison p USING doomed d WHERE p.id = d.id RETURNING 1
    ) SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END $$;

COMMENT ON FUNCTION jobs.prune(double precision, double precision, integer) IS
    'Remove one bounded batch of finished, resolved jobs older than the retention, never shorter than the longest declared replay horizon (with their key, effects, traces, escalations and result manifest) and of repair audit rows older than the audit retention; counts per table (0027)';

COMMENT ON FUNCTION consumers.prune_poison(text, double precision, integer) IS
    'Remove one bounded batch of one consumer''s poison records older than the retention, never shorter than its declared replay horizon; the count (0027)';

REVOKE EXECUTE ON FUNCTION consumers.declare_window(text, double precision, double precision)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION consumers.declare_window(text, double precision, double precision)
    TO accord_consumer;
REVOKE EXECUTE ON FUNCTION consumers.replay_horizon(text) FROM PUBLIC;
