-- 0041 The replay ledger is bounded. ops.replay_runs and ops.replay_refusals (0008) were never
-- removed, and every status snapshot grouped every refusal ever recorded for
-- accord_replay_refusals_total. A replay whose handler is refused records a row per refused
-- event, so one bad replay of a week of events could add millions.
--
-- The totals now live in ops.replay_refusal_totals, kept by a trigger in the transaction that
-- records each refusal: the counter never goes back when old refusals are removed, and a
-- snapshot reads a row per (workflow, reason). ops.prune_replay removes the runs that ended
-- (or, never finished, began) before the retention, with their refusals, in bounded batches;
-- `accord replay`, the ledger's one writer, runs it at its start with the audit retention.

CREATE TABLE ops.replay_refusal_totals (
    workflow text NOT NULL,
    reason text NOT NULL,
    refusals bigint NOT NULL CHECK (refusals >= 0),
    PRIMARY KEY (workflow, reason)
);

COMMENT ON TABLE ops.replay_refusal_totals IS 'Replay refusals ever recorded, by workflow and reason (0041): kept by a trigger on ops.replay_refusals, never decreased by its retention';

INSERT INTO ops.replay_refusal_totals (workflow, reason, refusals)
SELECT workflow, reason, count(*) FROM ops.replay_refusals GROUP BY workflow, reason;

CREATE FUNCTION ops.replay_refusal_count() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO ops.replay_refusal_totals AS t (workflow, reason, refusals)
    VALUES (NEW.workflow, NEW.reason, 1)
    ON CONFLICT (workflow, reason) DO UPDATE SET refusals = t.refusals + 1;
    RETURN NULL;
END $$;

REVOKE ALL ON FUNCTION ops.replay_refusal_count() FROM PUBLIC;

CREATE TRIGGER replay_refusals_count AFTER INSERT ON ops.replay_refusals
    FOR EACH ROW EXECUTE FUNCTION ops.replay_refusal_count();

-- A batch: at most p_limit refusals of expired runs, then at most p_limit expired runs left
-- with none; (runs, refusals) removed. Expired: ended, or never ended and began, more than
-- p_retention_s ago. A run in progress is recent by its start, so it is never taken.
CREATE FUNCTION ops.prune_replay(p_retention_s double precision, p_limit integer) RETURNS TABLE(runs integer, refusals integer)
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
        ORDER BY r.run_id
        LIMIT p_limit
    );
    GET DIAGNOSTICS v_refusals = ROW_COUNT;
    DELETE FROM ops.replay_runs r
    WHERE r.run_id IN (
        SELECT e.run_id FROM ops.replay_runs e
        WHERE coalesce(e.finished_at, e.started_at) < v_cutoff
          AND NOT EXISTS (SELECT 1 FROM ops.replay_refusals x WHERE x.run_id = e.run_id)
        ORDER BY e.run_id
        LIMIT p_limit
    );
    GET DIAGNOSTICS v_runs = ROW_COUNT;
    RETURN QUERY SELECT v_runs, v_refusals;
END $$;

COMMENT ON FUNCTION ops.prune_replay(double precision, integer) IS 'Remove one bounded batch of the replay ledger older than the retention (0041): refusals of expired runs, then expired runs left with none; (runs, refusals)';
