-- 0056 A held row released past its consumers' replay window is refused, not published to be
-- poisoned (a left-alone defect of the release). A row's ce-time is its enqueue time (DESIGN
-- §3), and a consumer refuses a message older than its replay window, or than the admit_from
-- of a raised window (0046), as too_old: it cannot tell it from a redelivery whose inbox row
-- retention already removed. A held row released past that was published and poisoned at its
-- first delivery, the release audited as if it had worked.
--   * consumers.admit_floor: the oldest enqueue time every consumer still admits, by the
--     strictest window (the caller's, ACCORD_INBOX_REPLAY_WINDOW_S, and each consumer's
--     declared one) less what a release needs to reach them (a tenth of it, at least a
--     minute), and the latest admit_from. The repair role may ask it.
--   * relay.release_held takes that floor (p_admit_from; NULL: unchecked, as the
--     four-argument form, which calls it) and refuses a row enqueued before it with
--     past_replay_window, all or nothing as for every other refusal.
CREATE FUNCTION consumers.admit_floor(p_window_s double precision) RETURNS timestamp with time zone
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT greatest(
        statement_timestamp() - make_interval(secs => greatest(x.w - greatest(x.w / 10, 60), 0)),
        (SELECT max(h.admit_from) FROM consumers.replay_horizons h))
    FROM (SELECT least(p_window_s, (SELECT min(h.window_s) FROM consumers.replay_horizons h))
                 AS w) x
$$;

COMMENT ON FUNCTION consumers.admit_floor(p_window_s double precision) IS 'The oldest enqueue time every consumer still admits, less what a release needs to reach them: a held outbox row enqueued before it would be poisoned too_old (0056)';

REVOKE ALL ON FUNCTION consumers.admit_floor(double precision) FROM PUBLIC;
-- The schema's usage lets the repair role call it; no table of the schema is granted.
GRANT USAGE ON SCHEMA consumers TO accord_repair;
GRANT EXECUTE ON FUNCTION consumers.admit_floor(double precision) TO accord_repair;

CREATE FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text, p_admit_from timestamp with time zone) RETURNS TABLE(event_id uuid, outbox_id bigint, status text, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    IF coalesce(p_who, '') = '' OR coalesce(p_evidence, '') = '' THEN
        RETURN QUERY SELECT NULL::uuid, NULL::bigint, 'principal_required'::text, NULL::bigint;
        RETURN;
    END IF;
    PERFORM 1 FROM relay.outbox o
    WHERE o.tenant = p_tenant AND o.event_id = ANY (p_event_ids)
    ORDER BY o.id
    FOR UPDATE;
    -- A new statement, hence a snapshot taken after the locks.
    RETURN QUERY
    SELECT g.id, o.id,
           CASE WHEN o.id IS NULL THEN 'missing'
                WHEN o.state <> 'held' THEN 'not_held'
                ELSE 'past_replay_window' END,
           NULL::bigint
    FROM (SELECT DISTINCT unnest(p_event_ids) AS id) g
    LEFT JOIN relay.outbox o ON o.tenant = p_tenant AND o.event_id = g.id
    WHERE o.id IS NULL OR o.state <> 'held'
       OR o.enqueued_at < p_admit_from
    ORDER BY g.id;
    IF FOUND THEN
        RETURN;  -- refused: nothing changed
    END IF;
    RETURN QUERY
    WITH released AS (
        UPDATE relay.outbox o
        SET state = 'pending', lease_token = NULL, lease_expires_at = NULL
        WHERE o.tenant = p_tenant AND o.event_id = ANY (p_event_ids) AND o.state = 'held'
        RETURNING o.id, o.event_id, o.last_reason, o.attempts
    ), audited AS (
        INSERT INTO relay.release_audit AS a (tenant, event_id, outbox_id, held_reason,
                                              attempts, who, db_user, db_role, evidence)
        SELECT p_tenant, r.event_id, r.id, r.last_reason, r.attempts, p_who, session_user,
               current_setting('role'), p_evidence
        FROM released r
        RETURNING a.event_id, a.outbox_id, a.audit_id
    )
    SELECT x.event_id, x.outbox_id, NULL::text, x.audit_id FROM audited x ORDER BY x.outbox_id;
END $$;

COMMENT ON FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text, p_admit_from timestamp with time zone) IS 'Release held outbox rows of a tenant (all or nothing), one relay.release_audit row each; a row enqueued before p_admit_from (consumers.admit_floor) is refused past_replay_window (0056)';

-- The four-argument form, unchecked as before, calls it; one owner for both.
CREATE OR REPLACE FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) RETURNS TABLE(event_id uuid, outbox_id bigint, status text, audit_id bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT * FROM relay.release_held(p_tenant, p_event_ids, p_who, p_evidence,
                                     NULL::timestamp with time zone)
$$;

DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION relay.release_held(text, uuid[], text, text, timestamp with time zone) OWNER TO %I',
        (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p
         WHERE p.oid = 'relay.release_held(text,uuid[],text,text)'::regprocedure));
END $$;

REVOKE ALL ON FUNCTION relay.release_held(text, uuid[], text, text, timestamp with time zone) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION relay.release_held(text, uuid[], text, text, timestamp with time zone) TO accord_repair;
