-- 0017 relay release audit: releasing a held outbox row is an operator's act, audited.
--
-- The relay holds a row it can never publish as it is (unroutable after N tries, larger than
-- the broker accepts); `accord relay release-held` makes such rows publishable again once the
-- cause is gone (a binding now exists, the broker's limit was raised). That decision is
-- recorded like every repair of the jobs module (jobs.repair_audit): who, the evidence, the
-- login and role that ran it, and the reason the row had been held, in an append-only table
-- written in the same transaction as the release, by the one function that releases.
--
-- relay.release_held is all or nothing: every named event id must exist for the tenant and
-- be held, or nothing changes and each offending id comes back with its status ('missing',
-- 'not_held'); the caller raises a typed error. The rows are locked (FOR UPDATE) before they
-- are checked so a concurrent release of the same row waits and then sees it pending
-- (https://www.postgresql.org/docs/15/explicit-locking.html#LOCKING-ROWS). The relay never
-- leases a held row (its claim reads pending rows only), so the lock never waits on a relay.
-- Attempts are history and stay as they were: a released row that still cannot be routed
-- is held again after its next attempt.

CREATE TABLE relay.release_audit (
    audit_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    tenant      text        NOT NULL,
    event_id    uuid        NOT NULL,
    outbox_id   bigint      NOT NULL,
    held_reason text,
    attempts    integer     NOT NULL,
    who         text        NOT NULL CHECK (who <> ''),
    db_user     text        NOT NULL,
    db_role     text        NOT NULL,
    evidence    text        NOT NULL CHECK (evidence <> '')
);
CREATE INDEX release_audit_event_idx ON relay.release_audit (tenant, event_id);

COMMENT ON TABLE relay.release_audit IS
    'Append-only: one row per held outbox row an operator released (relay.release_held)';

-- The same guard as jobs.repair_audit (jobs.append_only), in this module's own schema: the
-- relay module never depends on the jobs module.
CREATE FUNCTION relay.append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$;

CREATE TRIGGER release_audit_append_only BEFORE UPDATE OR DELETE ON relay.release_audit
    FOR EACH ROW EXECUTE FUNCTION relay.append_only();
CREATE TRIGGER release_audit_no_truncate BEFORE TRUNCATE ON relay.release_audit
    FOR EACH STATEMENT EXECUTE FUNCTION relay.append_only();

CREATE FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text,
                                   p_evidence text)
RETURNS TABLE (event_id uuid, outbox_id bigint, status text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
           CASE WHEN o.id IS NULL THEN 'missing' ELSE 'not_held' END, NULL::bigint
    FROM (SELECT DISTINCT unnest(p_event_ids) AS id) g
    LEFT JOIN relay.outbox o ON o.tenant = p_tenant AND o.event_id = g.id
    WHERE o.id IS NULL OR o.state <> 'held'
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

COMMENT ON FUNCTION relay.release_held(text, uuid[], text, text) IS
    'Release held outbox rows of a tenant (all or nothing), one relay.release_audit row each';

-- Only the repair principal releases (and reads the audit); the relay itself never does.
REVOKE EXECUTE ON FUNCTION relay.release_held(text, uuid[], text, text) FROM PUBLIC;
GRANT USAGE ON SCHEMA relay TO accord_repair;
GRANT EXECUTE ON FUNCTION relay.release_held(text, uuid[], text, text) TO accord_repair;
GRANT SELECT ON relay.release_audit TO accord_repair;
