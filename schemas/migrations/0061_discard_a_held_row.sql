-- 0061 A held outbox row a person gives up on leaves, audited (a review of retention: a
-- held row had no way out but a release). A row held for good (a body over the broker's
-- limit that will never fit, a type no queue will bind again, or, since 0056, a row past its
-- consumers' replay window whose content was enqueued again as a new event) stayed in
-- relay.outbox and in the held figures for ever.
--   * relay.discard_held removes named held rows of a tenant, all or nothing (missing or
--     not held refuses every one, nothing changed), as the repair role, with one
--     relay.release_audit row each (action 'discard'; the body is not kept). A row that is
--     not held is never removed: pending rows are published, published ones pruned.
--   * relay.release_audit.action tells a release from a discard, and a discard's row keeps
--     what the event was (operation id, type and version, digest, enqueue time: never the
--     body); the audit's pruner takes it after the audit retention (its outbox row is gone).
ALTER TABLE relay.release_audit ADD COLUMN action text NOT NULL DEFAULT 'release'
    CONSTRAINT release_audit_action_check CHECK (action IN ('release', 'discard')),
    ADD COLUMN operation_id text, ADD COLUMN type text, ADD COLUMN version integer,
    ADD COLUMN digest text, ADD COLUMN enqueued_at timestamptz;
COMMENT ON COLUMN relay.release_audit.operation_id IS 'A discarded row''s operation id, with its type, version, digest and enqueue time: what the event was (0061)';
COMMENT ON COLUMN relay.release_audit.action IS 'release: made publishable again (relay.release_held); discard: removed for good (relay.discard_held, 0061)';
COMMENT ON TABLE relay.release_audit IS 'Append-only: one row per held outbox row an operator released (relay.release_held) or discarded (relay.discard_held)';

CREATE FUNCTION relay.discard_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text)
    RETURNS TABLE(event_id uuid, outbox_id bigint, status text, audit_id bigint)
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
    SELECT g.id, o.id, CASE WHEN o.id IS NULL THEN 'missing' ELSE 'not_held' END, NULL::bigint
    FROM (SELECT DISTINCT unnest(p_event_ids) AS id) g
    LEFT JOIN relay.outbox o ON o.tenant = p_tenant AND o.event_id = g.id
    WHERE o.id IS NULL OR o.state <> 'held'
    ORDER BY g.id;
    IF FOUND THEN
        RETURN;  -- refused: nothing changed
    END IF;
    RETURN QUERY
    WITH gone AS (
        DELETE FROM relay.outbox o
        WHERE o.tenant = p_tenant AND o.event_id = ANY (p_event_ids) AND o.state = 'held'
        RETURNING o.id, o.event_id, o.last_reason, o.attempts, o.operation_id, o.type,
                  o.version, o.digest, o.enqueued_at
    ), audited AS (
        INSERT INTO relay.release_audit AS a (tenant, event_id, outbox_id, held_reason,
                                              attempts, who, db_user, db_role, evidence, action,
                                              operation_id, type, version, digest, enqueued_at)
        SELECT p_tenant, g.event_id, g.id, g.last_reason, g.attempts, p_who, session_user,
               current_setting('role'), p_evidence, 'discard', g.operation_id, g.type,
               g.version, g.digest, g.enqueued_at
        FROM gone g
        RETURNING a.event_id, a.outbox_id, a.audit_id
    )
    SELECT x.event_id, x.outbox_id, NULL::text, x.audit_id FROM audited x ORDER BY x.outbox_id;
END $$;

COMMENT ON FUNCTION relay.discard_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) IS 'Remove held outbox rows of a tenant for good (all or nothing), one relay.release_audit row each (action discard); a row that is not held is refused (0061)';

REVOKE ALL ON FUNCTION relay.discard_held(text, uuid[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION relay.discard_held(text, uuid[], text, text) TO accord_repair;
