-- 0053 The replay ledger keeps a run in progress (a review of retention).
-- ops.prune_replay removed a run that had not finished once it began before the retention:
-- a second `accord replay` (each prunes the ledger first) removed the run of one still going,
-- whose next refusal record then failed on its foreign key and whose finish updated nothing.
-- A replay holds a session advisory lock on its run (accord.ops.sql.HOLD_RUN: class
-- 1919250030, the run id's low 31 bits) until it finishes or its connection ends; an
-- unfinished run whose lock is held, and its refusals, are kept.
CREATE OR REPLACE FUNCTION ops.prune_replay(p_retention_s double precision, p_limit integer) RETURNS TABLE(runs integer, refusals integer)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_cutoff timestamptz;
    v_runs integer;
    v_refusals integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'ops.prune_replay: a batch holds 1 to 10000 rows, not %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'ops.prune_replay: retention % s', p_retention_s
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_cutoff := now() - make_interval(secs => p_retention_s);
    DELETE FROM ops.replay_refusals f
    WHERE f.id IN (
        SELECT x.id FROM ops.replay_runs r JOIN ops.replay_refusals x ON x.run_id = r.run_id
        WHERE coalesce(r.finished_at, r.started_at) < v_cutoff
          AND (r.finished_at IS NOT NULL OR NOT ops.replay_running(r.run_id))
        ORDER BY r.run_id
        LIMIT p_limit
    );
    GET DIAGNOSTICS v_refusals = ROW_COUNT;
    DELETE FROM ops.replay_runs r
    WHERE r.run_id IN (
        SELECT e.run_id FROM ops.replay_runs e
        WHERE coalesce(e.finished_at, e.started_at) < v_cutoff
          AND (e.finished_at IS NOT NULL OR NOT ops.replay_running(e.run_id))
          AND NOT EXISTS (SELECT 1 FROM ops.replay_refusals x WHERE x.run_id = e.run_id)
        ORDER BY e.run_id
        LIMIT p_limit
    );
    GET DIAGNOSTICS v_runs = ROW_COUNT;
    RETURN QUERY SELECT v_runs, v_refusals;
END $$;

COMMENT ON FUNCTION ops.prune_replay(p_retention_s double precision, p_limit integer) IS 'Remove one bounded batch of the replay ledger older than the retention (0041): refusals of expired runs, then expired runs left with none; never a run in progress (0053); (runs, refusals)';

CREATE FUNCTION ops.replay_running(p_run_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.database = (SELECT d.oid FROM pg_database d
                            WHERE d.datname = current_database())
          AND l.classid = 1919250030::oid AND l.objid = (p_run_id & 2147483647)::oid)
$$;

COMMENT ON FUNCTION ops.replay_running(p_run_id bigint) IS 'Whether a replay holds run p_run_id''s lock (accord.ops.sql.HOLD_RUN) in this database: it is in progress (0053)';
