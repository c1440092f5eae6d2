-- 0046 Raising a consumer's replay window admitted events its inbox had already forgotten.
-- The inbox (and jobs.prune) had removed what lay past the old, shorter horizon; the new
-- declaration at once admitted everything within the new window, so a redelivery older than
-- the old window but inside the new one found no inbox row and no job: it was reserved as new
-- and its work ran twice. A raise now records where admission stood (`admit_from`: now minus
-- the window it replaces, or an earlier raise's floor if later), and admission never reaches
-- below it: the admitted window grows with real time, from what was still kept.

ALTER TABLE consumers.replay_windows ADD COLUMN admit_from timestamp with time zone;

COMMENT ON COLUMN consumers.replay_windows.admit_from IS 'Since a raise of the window: nothing older is admitted, its inbox rows may be gone (0046)';

CREATE OR REPLACE VIEW consumers.replay_horizons AS
 SELECT w.consumer,
    w.replay_window_s AS window_s,
    GREATEST((w.replay_window_s + w.margin_s), ( SELECT max(p.horizon_s) AS max
           FROM consumers.replay_promises p
          WHERE ((p.consumer = w.consumer) AND (p.until > now())))) AS horizon_s,
    w.admit_from
   FROM consumers.replay_windows w;

CREATE OR REPLACE FUNCTION consumers.declare_window(p_consumer text, p_replay_window_s double precision, p_margin_s double precision) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    w consumers.replay_windows;
    v_declared double precision;
    v_until timestamptz;
    v_admit_from timestamptz;
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
    v_admit_from := w.admit_from;
    IF p_replay_window_s > w.replay_window_s THEN
        -- A raise: admission stays where it stood and grows with time from there (what lies
        -- past the old window may have been pruned already).
        v_admit_from := GREATEST(v_admit_from, now() - make_interval(secs => w.replay_window_s));
    END IF;
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
        declared_at = now(), declared_by = session_user,
        -- a floor the window has grown past bounds nothing any more
        admit_from = CASE WHEN v_admit_from > now() - make_interval(secs => p_replay_window_s)
                          THEN v_admit_from END
    WHERE r.consumer = p_consumer;
END $$;

COMMENT ON FUNCTION consumers.declare_window(p_consumer text, p_replay_window_s double precision, p_margin_s double precision) IS 'Record a consumer''s replay window and prune margin, replacing its earlier declaration; a raise admits nothing older than where admission stood (0027, 0046)';
