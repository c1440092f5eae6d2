-- The current definition of the `relay` schema: generated from a migrated database by
-- pg_dump (`make schema`); never edited by hand. The history (and the reasons, in comments)
-- is in schemas/migrations/; tests/integration/test_schema_files.py keeps the two equal.

--
--

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: relay; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA relay;

--
-- Name: append_only(); Type: FUNCTION; Schema: relay; Owner: -
--

CREATE FUNCTION relay.append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'release_audit'
       AND current_setting('accord.prune', true) = 'relay'
       AND current_user = (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p
                           WHERE p.oid = 'relay.prune_release_audit(double precision,integer)'
                                         ::regprocedure) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$;

--
-- Name: discard_held(text, uuid[], text, text); Type: FUNCTION; Schema: relay; Owner: -
--

CREATE FUNCTION relay.discard_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) RETURNS TABLE(event_id uuid, outbox_id bigint, status text, audit_id bigint)
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

--
-- Name: FUNCTION discard_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text); Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON FUNCTION relay.discard_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) IS 'Remove held outbox rows of a tenant for good (all or nothing), one relay.release_audit row each (action discard); a row that is not held is refused (0061)';

--
-- Name: outbox_guard(); Type: FUNCTION; Schema: relay; Owner: -
--

CREATE FUNCTION relay.outbox_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF pg_has_role(current_user,
                   (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF OLD.state = 'held' THEN
        RAISE EXCEPTION 'relay.outbox row % (event %) is held: only a person moves it on',
            OLD.id, OLD.event_id
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'as the repair role: accord relay release-held (publish it) or accord'
                         ' relay discard-held (give it up, audited)';
    END IF;
    RAISE EXCEPTION 'relay.outbox row % (event %) is %: only a published row is removed',
        OLD.id, OLD.event_id, OLD.state
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'a committed event leaves the outbox by being published (accord relay)';
END $$;

--
-- Name: FUNCTION outbox_guard(); Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON FUNCTION relay.outbox_guard() IS 'Refuses, but to the outbox''s owner, deleting a row that is not published and changing a held row (0062)';

--
-- Name: prune_release_audit(double precision, integer); Type: FUNCTION; Schema: relay; Owner: -
--

CREATE FUNCTION relay.prune_release_audit(p_retention_s double precision, p_limit integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000
       OR p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'relay.prune_release_audit: retention % s, batch %', p_retention_s,
            p_limit USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('accord.prune', 'relay', true);
    WITH doomed AS (
        SELECT a.audit_id FROM relay.release_audit a
        WHERE a.at < now() - make_interval(secs => p_retention_s)
          AND NOT EXISTS (SELECT 1 FROM relay.outbox o
                          WHERE o.id = a.outbox_id AND o.state <> 'published')
        ORDER BY a.at, a.audit_id
        LIMIT p_limit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM relay.release_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_n FROM gone;
    PERFORM set_config('accord.prune', '', true);
    RETURN v_n;
END $$;

--
-- Name: FUNCTION prune_release_audit(p_retention_s double precision, p_limit integer); Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON FUNCTION relay.prune_release_audit(p_retention_s double precision, p_limit integer) IS 'Remove one bounded batch of release audit rows older than the retention whose outbox row is resolved, oldest first; the count (0031)';

--
-- Name: release_held(text, uuid[], text, text); Type: FUNCTION; Schema: relay; Owner: -
--

CREATE FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) RETURNS TABLE(event_id uuid, outbox_id bigint, status text, audit_id bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT * FROM relay.release_held(p_tenant, p_event_ids, p_who, p_evidence,
                                     NULL::timestamp with time zone)
$$;

--
-- Name: FUNCTION release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text); Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) IS 'Release held outbox rows of a tenant (all or nothing), one relay.release_audit row each';

--
-- Name: release_held(text, uuid[], text, text, timestamp with time zone); Type: FUNCTION; Schema: relay; Owner: -
--

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

--
-- Name: FUNCTION release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text, p_admit_from timestamp with time zone); Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text, p_admit_from timestamp with time zone) IS 'Release held outbox rows of a tenant (all or nothing), one relay.release_audit row each; a row enqueued before p_admit_from (consumers.admit_floor) is refused past_replay_window (0056)';

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: awake; Type: TABLE; Schema: relay; Owner: -
--

CREATE TABLE relay.awake (
    one boolean DEFAULT true NOT NULL,
    until timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    CONSTRAINT awake_one_check CHECK (one)
);

--
-- Name: outbox; Type: TABLE; Schema: relay; Owner: -
--

CREATE TABLE relay.outbox (
    id bigint NOT NULL,
    event_id uuid NOT NULL,
    tenant text NOT NULL,
    operation_id text NOT NULL,
    type text NOT NULL,
    version integer NOT NULL,
    authority_epoch bigint DEFAULT 0 NOT NULL,
    digest text NOT NULL,
    body bytea NOT NULL,
    trace jsonb,
    occurred_at timestamp with time zone NOT NULL,
    enqueued_at timestamp with time zone DEFAULT now() NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    last_reason text,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    published_at timestamp with time zone,
    publish_id uuid,
    returns integer DEFAULT 0 NOT NULL,
    CONSTRAINT outbox_authority_epoch_check CHECK ((authority_epoch >= 0)),
    CONSTRAINT outbox_published_check CHECK (((state = 'published'::text) = (published_at IS NOT NULL))),
    CONSTRAINT outbox_returns_check CHECK ((returns >= 0)),
    CONSTRAINT outbox_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'published'::text, 'held'::text]))),
    CONSTRAINT outbox_version_check CHECK ((version >= 1))
);

--
-- Name: COLUMN outbox.returns; Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON COLUMN relay.outbox.returns IS 'Publishes the broker returned in a row (unroutable); any other outcome resets it (0048)';

--
-- Name: outbox_id_seq; Type: SEQUENCE; Schema: relay; Owner: -
--

CREATE SEQUENCE relay.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: outbox_id_seq; Type: SEQUENCE OWNED BY; Schema: relay; Owner: -
--

ALTER SEQUENCE relay.outbox_id_seq OWNED BY relay.outbox.id;

--
-- Name: pruned; Type: TABLE; Schema: relay; Owner: -
--

CREATE TABLE relay.pruned (
    one boolean DEFAULT true NOT NULL,
    through timestamp with time zone NOT NULL,
    CONSTRAINT pruned_one_check CHECK (one)
);

--
-- Name: release_audit; Type: TABLE; Schema: relay; Owner: -
--

CREATE TABLE relay.release_audit (
    audit_id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    tenant text NOT NULL,
    event_id uuid NOT NULL,
    outbox_id bigint NOT NULL,
    held_reason text,
    attempts integer NOT NULL,
    who text NOT NULL,
    db_user text NOT NULL,
    db_role text NOT NULL,
    evidence text NOT NULL,
    action text DEFAULT 'release'::text NOT NULL,
    operation_id text,
    type text,
    version integer,
    digest text,
    enqueued_at timestamp with time zone,
    CONSTRAINT release_audit_action_check CHECK ((action = ANY (ARRAY['release'::text, 'discard'::text]))),
    CONSTRAINT release_audit_evidence_check CHECK ((evidence <> ''::text)),
    CONSTRAINT release_audit_who_check CHECK ((who <> ''::text))
);

--
-- Name: TABLE release_audit; Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON TABLE relay.release_audit IS 'Append-only: one row per held outbox row an operator released (relay.release_held) or discarded (relay.discard_held)';

--
-- Name: COLUMN release_audit.action; Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON COLUMN relay.release_audit.action IS 'release: made publishable again (relay.release_held); discard: removed for good (relay.discard_held, 0061)';

--
-- Name: COLUMN release_audit.operation_id; Type: COMMENT; Schema: relay; Owner: -
--

COMMENT ON COLUMN relay.release_audit.operation_id IS 'A discarded row''s operation id, with its type, version, digest and enqueue time: what the event was (0061)';

--
-- Name: release_audit_audit_id_seq; Type: SEQUENCE; Schema: relay; Owner: -
--

ALTER TABLE relay.release_audit ALTER COLUMN audit_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME relay.release_audit_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: outbox id; Type: DEFAULT; Schema: relay; Owner: -
--

ALTER TABLE ONLY relay.outbox ALTER COLUMN id SET DEFAULT nextval('relay.outbox_id_seq'::regclass);

--
-- Name: awake awake_pkey; Type: CONSTRAINT; Schema: relay; Owner: -
--

ALTER TABLE ONLY relay.awake
    ADD CONSTRAINT awake_pkey PRIMARY KEY (one);

--
-- Name: outbox outbox_event_unique; Type: CONSTRAINT; Schema: relay; Owner: -
--

ALTER TABLE ONLY relay.outbox
    ADD CONSTRAINT outbox_event_unique UNIQUE (tenant, event_id);

--
-- Name: outbox outbox_pkey; Type: CONSTRAINT; Schema: relay; Owner: -
--

ALTER TABLE ONLY relay.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);

--
-- Name: pruned pruned_pkey; Type: CONSTRAINT; Schema: relay; Owner: -
--

ALTER TABLE ONLY relay.pruned
    ADD CONSTRAINT pruned_pkey PRIMARY KEY (one);

--
-- Name: release_audit release_audit_pkey; Type: CONSTRAINT; Schema: relay; Owner: -
--

ALTER TABLE ONLY relay.release_audit
    ADD CONSTRAINT release_audit_pkey PRIMARY KEY (audit_id);

--
-- Name: outbox_eligible_idx; Type: INDEX; Schema: relay; Owner: -
--

CREATE INDEX outbox_eligible_idx ON relay.outbox USING btree (COALESCE(lease_expires_at, enqueued_at), id) WHERE (state = 'pending'::text);

--
-- Name: outbox_held_idx; Type: INDEX; Schema: relay; Owner: -
--

CREATE INDEX outbox_held_idx ON relay.outbox USING btree (id) WHERE (state = 'held'::text);

--
-- Name: outbox_published_idx; Type: INDEX; Schema: relay; Owner: -
--

CREATE INDEX outbox_published_idx ON relay.outbox USING btree (published_at) WHERE (state = 'published'::text);

--
-- Name: release_audit_at_idx; Type: INDEX; Schema: relay; Owner: -
--

CREATE INDEX release_audit_at_idx ON relay.release_audit USING btree (at, audit_id);

--
-- Name: release_audit_event_idx; Type: INDEX; Schema: relay; Owner: -
--

CREATE INDEX release_audit_event_idx ON relay.release_audit USING btree (tenant, event_id);

--
-- Name: outbox outbox_held_kept; Type: TRIGGER; Schema: relay; Owner: -
--

CREATE TRIGGER outbox_held_kept BEFORE UPDATE ON relay.outbox FOR EACH ROW WHEN ((old.state = 'held'::text)) EXECUTE FUNCTION relay.outbox_guard();

--
-- Name: outbox outbox_unpublished_kept; Type: TRIGGER; Schema: relay; Owner: -
--

CREATE TRIGGER outbox_unpublished_kept BEFORE DELETE ON relay.outbox FOR EACH ROW WHEN ((old.state <> 'published'::text)) EXECUTE FUNCTION relay.outbox_guard();

--
-- Name: release_audit release_audit_append_only; Type: TRIGGER; Schema: relay; Owner: -
--

CREATE TRIGGER release_audit_append_only BEFORE DELETE OR UPDATE ON relay.release_audit FOR EACH ROW EXECUTE FUNCTION relay.append_only();

--
-- Name: release_audit release_audit_no_truncate; Type: TRIGGER; Schema: relay; Owner: -
--

CREATE TRIGGER release_audit_no_truncate BEFORE TRUNCATE ON relay.release_audit FOR EACH STATEMENT EXECUTE FUNCTION relay.append_only();

--
-- Name: SCHEMA relay; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA relay TO accord_worker;
GRANT USAGE ON SCHEMA relay TO accord_relay;
GRANT USAGE ON SCHEMA relay TO accord_repair;

--
-- Name: FUNCTION discard_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text); Type: ACL; Schema: relay; Owner: -
--

REVOKE ALL ON FUNCTION relay.discard_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) FROM PUBLIC;
GRANT ALL ON FUNCTION relay.discard_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) TO accord_repair;

--
-- Name: FUNCTION prune_release_audit(p_retention_s double precision, p_limit integer); Type: ACL; Schema: relay; Owner: -
--

REVOKE ALL ON FUNCTION relay.prune_release_audit(p_retention_s double precision, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION relay.prune_release_audit(p_retention_s double precision, p_limit integer) TO accord_relay;

--
-- Name: FUNCTION release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text); Type: ACL; Schema: relay; Owner: -
--

REVOKE ALL ON FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) FROM PUBLIC;
GRANT ALL ON FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text) TO accord_repair;

--
-- Name: FUNCTION release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text, p_admit_from timestamp with time zone); Type: ACL; Schema: relay; Owner: -
--

REVOKE ALL ON FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text, p_admit_from timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION relay.release_held(p_tenant text, p_event_ids uuid[], p_who text, p_evidence text, p_admit_from timestamp with time zone) TO accord_repair;

--
-- Name: TABLE awake; Type: ACL; Schema: relay; Owner: -
--

GRANT SELECT ON TABLE relay.awake TO PUBLIC;

--
-- Name: COLUMN awake.until; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(until) ON TABLE relay.awake TO accord_relay;

--
-- Name: TABLE outbox; Type: ACL; Schema: relay; Owner: -
--

GRANT INSERT ON TABLE relay.outbox TO accord_worker;
GRANT SELECT,DELETE ON TABLE relay.outbox TO accord_relay;

--
-- Name: COLUMN outbox.id; Type: ACL; Schema: relay; Owner: -
--

GRANT SELECT(id) ON TABLE relay.outbox TO accord_worker;

--
-- Name: COLUMN outbox.event_id; Type: ACL; Schema: relay; Owner: -
--

GRANT SELECT(event_id) ON TABLE relay.outbox TO accord_worker;

--
-- Name: COLUMN outbox.state; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(state) ON TABLE relay.outbox TO accord_relay;

--
-- Name: COLUMN outbox.attempts; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(attempts) ON TABLE relay.outbox TO accord_relay;

--
-- Name: COLUMN outbox.last_reason; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(last_reason) ON TABLE relay.outbox TO accord_relay;

--
-- Name: COLUMN outbox.lease_token; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(lease_token) ON TABLE relay.outbox TO accord_relay;

--
-- Name: COLUMN outbox.lease_expires_at; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(lease_expires_at) ON TABLE relay.outbox TO accord_relay;

--
-- Name: COLUMN outbox.published_at; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(published_at) ON TABLE relay.outbox TO accord_relay;

--
-- Name: COLUMN outbox.publish_id; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(publish_id) ON TABLE relay.outbox TO accord_relay;

--
-- Name: COLUMN outbox.returns; Type: ACL; Schema: relay; Owner: -
--

GRANT UPDATE(returns) ON TABLE relay.outbox TO accord_relay;

--
-- Name: SEQUENCE outbox_id_seq; Type: ACL; Schema: relay; Owner: -
--

GRANT USAGE ON SEQUENCE relay.outbox_id_seq TO accord_worker;

--
-- Name: TABLE pruned; Type: ACL; Schema: relay; Owner: -
--

GRANT SELECT,INSERT,UPDATE ON TABLE relay.pruned TO accord_relay;

--
-- Name: TABLE release_audit; Type: ACL; Schema: relay; Owner: -
--

GRANT SELECT ON TABLE relay.release_audit TO accord_repair;

--
--
