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
--   * the effective horizon is the declared window plus margin, or a longer promise still in
--     force: a declaration that lowers the window promises the declared horizon it replaces
--     until now plus that horizon (consumers.replay_promises), since rows admitted under it
--     need that long. Each promise lapses at its own end; one that a newer promise covers
--     (no longer, ending no later) is dropped. However often the declarations alternate, what
--     any process admitted is kept as long as it promised, and an old promise still lapses.
CREATE TABLE consumers.replay_promises (
    consumer text NOT NULL REFERENCES consumers.replay_windows (consumer) ON DELETE CASCADE,
    horizon_s double precision NOT NULL CHECK (horizon_s > 0 AND horizon_s < 'infinity'),
    until timestamptz NOT NULL,
    PRIMARY KEY (consumer, horizon_s)
);

COMMENT ON TABLE consumers.replay_promises IS
    'Horizons that lowering declarations replaced, each kept in force until its end (0028)';

CREATE VIEW consumers.replay_horizons AS
SELECT w.consumer, w.replay_window_s AS window_s,
       GREATEST(w.replay_window_s + w.margin_s,
                (SELECT max(p.horizon_s) FROM consumers.replay_promises p
                 WHERE p.consumer = w.consumer AND p.until > now())) AS horizon_s
FROM consumers.replay_windows w;

COMMENT ON VIEW consumers.replay_horizons IS
    'Each consumer''s declared window and effective horizon, which bound what its processes admit and prune (0028)';

CREATE OR REPLACE FUNCTION consumers.declare_window(
    p_consumer text, p_replay_window_s double precision, p_margin_s double precision
)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    w consumers.replay_windows;
    v_declared double precision;
    v_until timestamptz;
BEGIN
    -- The first declaration inserts; every one then works on the locked row (two at once
    -- take turns, the second seeing the first's).
    INSERT INTO consumers.replay_windows (consumer, replay_window_s, margin_s)
    VALUES (p_consumer, p_replay_window_s, p_margin_s)
    ON CONFLICT (consumer) DO NOTHING;
    SELECT * INTO w FROM consumers.replay_windows r WHERE r.consumer = p_consumer FOR UPDATE;
    IF (w.replay_window_s, w.margin_s) IS NOT DISTINCT FROM (p_replay_window_s, p_margin_s) THEN
        RETURN;
    END IF;
    v_declared := w.replay_window_s + w.margin_s;
    IF p_replay_window_s + p_margin_s < v_declared THEN
        -- A lowering: promise the declared horizon it replaces until now plus itself, and
        -- drop the promises that have lapsed or that this one covers.
        v_until := now() + make_interval(secs => v_declared);
        DELETE FROM consumers.replay_promises p
        WHERE p.consumer = p_consumer
          AND (p.until <= now() OR (p.horizon_s <= v_declared AND p.until <= v_until));
        INSERT INTO consumers.replay_promises AS p (consumer, horizon_s, until)
        VALUES (p_consumer, v_declared, v_until)
        ON CONFLICT (consumer, horizon_s) DO UPDATE SET until = GREATEST(p.until, EXCLUDED.until);
    END IF;
    UPDATE consumers.replay_windows r
    SET replay_window_s = p_replay_window_s, margin_s = p_margin_s,
        declared_at = now(), declared_by = session_user
    WHERE r.consumer = p_consumer;
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
