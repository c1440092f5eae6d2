-- 0028 the declared window bounds every process of a consumer. Two processes of one consumer
-- may run with different windows for a while (a canary, a rolling deploy that changes it),
-- each declaring its own at every start and reconnect, the last one standing (0027). Until
-- now each process admitted and pruned by its own window alone: one with a shorter window
-- pruned inbox rows that one with a longer window still admitted redeliveries for, as new.
-- Now:
--   * a process admits no event older than the lesser of its own window and the declared one
--     (consumers/sql.py RESERVE, RESERVE_MANY);
--   * a process prunes no inbox row younger than the greater of its own horizon and the
--     consumer's effective one (PRUNE_INBOX), and jobs.prune and consumers.prune_poison refuse
--     a retention shorter than the effective one (consumers.replay_horizon);
--   * the effective horizon is the declared window plus margin, or, for as long as it lasts
--     from the moment a declaration lowered it, the horizon that declaration replaced: rows
--     admitted under the longer window are kept as long as it promised, however often the
--     declarations alternate.
ALTER TABLE consumers.replay_windows
    ADD COLUMN previous_horizon_s double precision NOT NULL DEFAULT 0
        CHECK (previous_horizon_s >= 0 AND previous_horizon_s < 'infinity'),
    ADD COLUMN lowered_at timestamptz NOT NULL DEFAULT '-infinity';

COMMENT ON COLUMN consumers.replay_windows.previous_horizon_s IS
    'The horizon the last lowering declaration replaced, kept for that long from lowered_at (0028)';

-- The effective horizon of a declaration (see the header).
CREATE FUNCTION consumers.effective_horizon(
    p_replay_window_s double precision, p_margin_s double precision,
    p_previous_horizon_s double precision, p_lowered_at timestamptz
)
RETURNS double precision
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT GREATEST(p_replay_window_s + p_margin_s,
                    CASE WHEN p_lowered_at + make_interval(secs => p_previous_horizon_s) > now()
                         THEN p_previous_horizon_s ELSE 0 END)
$$;

CREATE VIEW consumers.replay_horizons AS
SELECT w.consumer, w.replay_window_s AS window_s,
       consumers.effective_horizon(w.replay_window_s, w.margin_s, w.previous_horizon_s,
                                   w.lowered_at) AS horizon_s
FROM consumers.replay_windows w;

COMMENT ON VIEW consumers.replay_horizons IS
    'Each consumer''s declared window and effective horizon, which bound what its processes admit and prune (0028)';

CREATE OR REPLACE FUNCTION consumers.declare_window(
    p_consumer text, p_replay_window_s double precision, p_margin_s double precision
)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_horizon double precision;
BEGIN
    SELECT consumers.effective_horizon(w.replay_window_s, w.margin_s, w.previous_horizon_s,
                                       w.lowered_at)
    INTO v_horizon
    FROM consumers.replay_windows w WHERE w.consumer = p_consumer FOR UPDATE;
    INSERT INTO consumers.replay_windows AS w (consumer, replay_window_s, margin_s)
    VALUES (p_consumer, p_replay_window_s, p_margin_s)
    ON CONFLICT (consumer) DO UPDATE
    SET replay_window_s = EXCLUDED.replay_window_s, margin_s = EXCLUDED.margin_s,
        previous_horizon_s = CASE WHEN EXCLUDED.replay_window_s + EXCLUDED.margin_s < v_horizon
                                  THEN v_horizon ELSE w.previous_horizon_s END,
        lowered_at = CASE WHEN EXCLUDED.replay_window_s + EXCLUDED.margin_s < v_horizon
                          THEN now() ELSE w.lowered_at END,
        declared_at = now(), declared_by = session_user
    WHERE (w.replay_window_s, w.margin_s) IS DISTINCT FROM
          (EXCLUDED.replay_window_s, EXCLUDED.margin_s);
END $$;

CREATE OR REPLACE FUNCTION consumers.replay_horizon(p_consumer text)
RETURNS TABLE(consumer text, horizon_s double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT h.consumer, h.horizon_s FROM consumers.replay_horizons h
    WHERE p_consumer IS NULL OR h.consumer = p_consumer
    ORDER BY 2 DESC, 1
    LIMIT 1
$$;

COMMENT ON FUNCTION consumers.replay_horizon(text) IS
    'The longest effective replay horizon of one consumer, or of all, and its consumer (0028)';

GRANT SELECT ON consumers.replay_horizons TO accord_consumer;
