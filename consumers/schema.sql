-- The current definition of the `consumers` schema: generated from a migrated database by
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
-- Name: consumers; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA consumers;

--
-- Name: admit_floor(double precision); Type: FUNCTION; Schema: consumers; Owner: -
--

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

--
-- Name: FUNCTION admit_floor(p_window_s double precision); Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON FUNCTION consumers.admit_floor(p_window_s double precision) IS 'The oldest enqueue time every consumer still admits, less what a release needs to reach them: a held outbox row enqueued before it would be poisoned too_old (0056)';

--
-- Name: declare_window(text, double precision, double precision); Type: FUNCTION; Schema: consumers; Owner: -
--

CREATE FUNCTION consumers.declare_window(p_consumer text, p_replay_window_s double precision, p_margin_s double precision) RETURNS void
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

--
-- Name: FUNCTION declare_window(p_consumer text, p_replay_window_s double precision, p_margin_s double precision); Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON FUNCTION consumers.declare_window(p_consumer text, p_replay_window_s double precision, p_margin_s double precision) IS 'Record a consumer''s replay window and prune margin, replacing its earlier declaration; a raise admits nothing older than where admission stood (0027, 0046)';

--
-- Name: prune_poison(text, double precision, integer); Type: FUNCTION; Schema: consumers; Owner: -
--

CREATE FUNCTION consumers.prune_poison(p_consumer text, p_retention_s double precision, p_limit integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

--
-- Name: FUNCTION prune_poison(p_consumer text, p_retention_s double precision, p_limit integer); Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON FUNCTION consumers.prune_poison(p_consumer text, p_retention_s double precision, p_limit integer) IS 'Remove one bounded batch of one consumer''s poison records older than the retention, never shorter than its declared replay horizon; the count (0027)';

--
-- Name: record_poison(text, text, text, jsonb, text, text, text, text, text, text, boolean, integer, jsonb, integer, text, text); Type: FUNCTION; Schema: consumers; Owner: -
--

CREATE FUNCTION consumers.record_poison(p_consumer text, p_queue text, p_reason text, p_detail jsonb, p_tenant text, p_operation_id text, p_event_id text, p_event_type text, p_message_id text, p_publish_id text, p_redelivered boolean, p_delivery_count integer, p_headers jsonb, p_body_size integer, p_body_sha256 text, p_move_id text) RETURNS TABLE(poison_id bigint, written boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_redelivered AND p_publish_id IS NOT NULL THEN
        SELECT p.id INTO v_id FROM consumers.poison p
        WHERE p.consumer = p_consumer AND p.publish_id = p_publish_id
          AND p.body_sha256 = p_body_sha256
          AND p.message_id IS NOT DISTINCT FROM p_message_id
          AND p.move_id IS NOT DISTINCT FROM p_move_id
        ORDER BY p.id DESC LIMIT 1;
        IF FOUND THEN
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
    END IF;
    INSERT INTO consumers.poison
        (consumer, queue, reason, detail, tenant, operation_id, event_id, event_type,
         message_id, publish_id, redelivered, delivery_count, headers, body_size, body_sha256,
         move_id)
    VALUES (p_consumer, p_queue, p_reason, p_detail, p_tenant, p_operation_id, p_event_id,
            p_event_type, p_message_id, p_publish_id, p_redelivered, p_delivery_count,
            p_headers, p_body_size, p_body_sha256, p_move_id)
    RETURNING id INTO v_id;
    RETURN QUERY SELECT v_id, true;
END $$;

--
-- Name: FUNCTION record_poison(p_consumer text, p_queue text, p_reason text, p_detail jsonb, p_tenant text, p_operation_id text, p_event_id text, p_event_type text, p_message_id text, p_publish_id text, p_redelivered boolean, p_delivery_count integer, p_headers jsonb, p_body_size integer, p_body_sha256 text, p_move_id text); Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON FUNCTION consumers.record_poison(p_consumer text, p_queue text, p_reason text, p_detail jsonb, p_tenant text, p_operation_id text, p_event_id text, p_event_type text, p_message_id text, p_publish_id text, p_redelivered boolean, p_delivery_count integer, p_headers jsonb, p_body_size integer, p_body_sha256 text, p_move_id text) IS 'Write one poison record and return its id, or, for a redelivered message this consumer already recorded in the same life (publish id, body hash, message id, move id), return that record''s id and write nothing (0057)';

--
-- Name: replay_horizon(text); Type: FUNCTION; Schema: consumers; Owner: -
--

CREATE FUNCTION consumers.replay_horizon(p_consumer text) RETURNS TABLE(consumer text, horizon_s double precision)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT h.consumer, h.horizon_s FROM consumers.replay_horizons h
    WHERE p_consumer IS NULL OR h.consumer = p_consumer
    ORDER BY 2 DESC, 1
    LIMIT 1
$$;

--
-- Name: FUNCTION replay_horizon(p_consumer text); Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON FUNCTION consumers.replay_horizon(p_consumer text) IS 'The longest effective replay horizon of one consumer, or of all, and its consumer (0028)';

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: deliveries; Type: TABLE; Schema: consumers; Owner: -
--

CREATE TABLE consumers.deliveries (
    id bigint NOT NULL,
    tenant text NOT NULL,
    consumer text NOT NULL,
    operation_id text NOT NULL,
    event_id uuid NOT NULL,
    publish_id text,
    redelivered boolean NOT NULL,
    delivery_count integer NOT NULL,
    outcome text NOT NULL,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT deliveries_delivery_count_check CHECK ((delivery_count >= 0)),
    CONSTRAINT deliveries_outcome_check CHECK ((outcome = ANY (ARRAY['new'::text, 'duplicate'::text, 'conflict'::text])))
);

--
-- Name: deliveries_id_seq; Type: SEQUENCE; Schema: consumers; Owner: -
--

ALTER TABLE consumers.deliveries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME consumers.deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: inbox; Type: TABLE; Schema: consumers; Owner: -
--

CREATE TABLE consumers.inbox (
    tenant text NOT NULL,
    consumer text NOT NULL,
    operation_id text NOT NULL,
    event_id uuid NOT NULL,
    digest text NOT NULL,
    event_type text NOT NULL,
    version integer NOT NULL,
    occurred_at timestamp with time zone NOT NULL,
    first_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT inbox_digest_check CHECK ((digest ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT inbox_version_check CHECK ((version >= 1))
);

--
-- Name: poison; Type: TABLE; Schema: consumers; Owner: -
--

CREATE TABLE consumers.poison (
    id bigint NOT NULL,
    consumer text NOT NULL,
    queue text NOT NULL,
    reason text NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    tenant text,
    operation_id text,
    event_id text,
    event_type text,
    message_id text,
    publish_id text,
    redelivered boolean NOT NULL,
    delivery_count integer NOT NULL,
    headers jsonb NOT NULL,
    body_size integer NOT NULL,
    body_sha256 text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    move_id text,
    CONSTRAINT poison_body_sha256_check CHECK ((body_sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT poison_body_size_check CHECK ((body_size >= 0)),
    CONSTRAINT poison_delivery_count_check CHECK ((delivery_count >= 0)),
    CONSTRAINT poison_reason_check CHECK ((reason = ANY (ARRAY['malformed'::text, 'malformed_json'::text, 'duplicate_key'::text, 'non_finite_number'::text, 'body_not_object'::text, 'missing_header'::text, 'bad_header'::text, 'duplicate_header'::text, 'bad_specversion'::text, 'bad_content_type'::text, 'bad_attribute'::text, 'unknown_type'::text, 'unknown_version'::text, 'invalid_event'::text, 'no_handler'::text, 'digest_mismatch'::text, 'tenant_mismatch'::text, 'conflict'::text, 'too_old'::text, 'rejected'::text, 'retries_exhausted'::text, 'tenant_conflict'::text, 'too_large'::text, 'data_exception'::text, 'integrity_violation'::text, 'statement_refused'::text, 'in_future'::text])))
);

--
-- Name: COLUMN poison.move_id; Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON COLUMN consumers.poison.move_id IS 'The accord-move-id header of a message accord dead-letters moved back (a fresh UUID per move); NULL for one never moved (0057)';

--
-- Name: poison_id_seq; Type: SEQUENCE; Schema: consumers; Owner: -
--

ALTER TABLE consumers.poison ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME consumers.poison_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: replay_promises; Type: TABLE; Schema: consumers; Owner: -
--

CREATE TABLE consumers.replay_promises (
    consumer text NOT NULL,
    horizon_s double precision NOT NULL,
    until timestamp with time zone NOT NULL,
    CONSTRAINT replay_promises_bounded CHECK ((horizon_s <= ('6307200000'::bigint)::double precision)),
    CONSTRAINT replay_promises_horizon_s_check CHECK (((horizon_s > (0)::double precision) AND (horizon_s < 'Infinity'::double precision)))
);

--
-- Name: TABLE replay_promises; Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON TABLE consumers.replay_promises IS 'Horizons that lowering declarations replaced, each kept in force until its end (0028)';

--
-- Name: replay_windows; Type: TABLE; Schema: consumers; Owner: -
--

CREATE TABLE consumers.replay_windows (
    consumer text NOT NULL,
    replay_window_s double precision NOT NULL,
    margin_s double precision NOT NULL,
    declared_at timestamp with time zone DEFAULT now() NOT NULL,
    declared_by text DEFAULT SESSION_USER NOT NULL,
    admit_from timestamp with time zone,
    CONSTRAINT replay_windows_bounded CHECK (((replay_window_s <= ('3153600000'::bigint)::double precision) AND (margin_s <= ('3153600000'::bigint)::double precision))),
    CONSTRAINT replay_windows_margin_s_check CHECK (((margin_s >= (0)::double precision) AND (margin_s < 'Infinity'::double precision))),
    CONSTRAINT replay_windows_replay_window_s_check CHECK (((replay_window_s > (0)::double precision) AND (replay_window_s < 'Infinity'::double precision)))
);

--
-- Name: TABLE replay_windows; Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON TABLE consumers.replay_windows IS 'Each consumer''s replay window and prune margin as it last declared them at start (0027)';

--
-- Name: COLUMN replay_windows.admit_from; Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON COLUMN consumers.replay_windows.admit_from IS 'Since a raise of the window: nothing older is admitted, its inbox rows may be gone (0046)';

--
-- Name: replay_horizons; Type: VIEW; Schema: consumers; Owner: -
--

CREATE VIEW consumers.replay_horizons AS
 SELECT w.consumer,
    w.replay_window_s AS window_s,
    GREATEST((w.replay_window_s + w.margin_s), ( SELECT max(p.horizon_s) AS max
           FROM consumers.replay_promises p
          WHERE ((p.consumer = w.consumer) AND (p.until > now())))) AS horizon_s,
    w.admit_from
   FROM consumers.replay_windows w;

--
-- Name: VIEW replay_horizons; Type: COMMENT; Schema: consumers; Owner: -
--

COMMENT ON VIEW consumers.replay_horizons IS 'Each consumer''s declared window and effective horizon, which bound what its processes admit and prune (0028)';

--
-- Name: deliveries deliveries_pkey; Type: CONSTRAINT; Schema: consumers; Owner: -
--

ALTER TABLE ONLY consumers.deliveries
    ADD CONSTRAINT deliveries_pkey PRIMARY KEY (id);

--
-- Name: inbox inbox_event_key; Type: CONSTRAINT; Schema: consumers; Owner: -
--

ALTER TABLE ONLY consumers.inbox
    ADD CONSTRAINT inbox_event_key UNIQUE (tenant, consumer, event_id);

--
-- Name: inbox inbox_pkey; Type: CONSTRAINT; Schema: consumers; Owner: -
--

ALTER TABLE ONLY consumers.inbox
    ADD CONSTRAINT inbox_pkey PRIMARY KEY (tenant, consumer, operation_id);

--
-- Name: poison poison_pkey; Type: CONSTRAINT; Schema: consumers; Owner: -
--

ALTER TABLE ONLY consumers.poison
    ADD CONSTRAINT poison_pkey PRIMARY KEY (id);

--
-- Name: replay_promises replay_promises_pkey; Type: CONSTRAINT; Schema: consumers; Owner: -
--

ALTER TABLE ONLY consumers.replay_promises
    ADD CONSTRAINT replay_promises_pkey PRIMARY KEY (consumer, horizon_s);

--
-- Name: replay_windows replay_windows_pkey; Type: CONSTRAINT; Schema: consumers; Owner: -
--

ALTER TABLE ONLY consumers.replay_windows
    ADD CONSTRAINT replay_windows_pkey PRIMARY KEY (consumer);

--
-- Name: deliveries_conflict_idx; Type: INDEX; Schema: consumers; Owner: -
--

CREATE INDEX deliveries_conflict_idx ON consumers.deliveries USING btree (consumer, tenant) WHERE (outcome = 'conflict'::text);

--
-- Name: deliveries_operation_idx; Type: INDEX; Schema: consumers; Owner: -
--

CREATE INDEX deliveries_operation_idx ON consumers.deliveries USING btree (tenant, consumer, operation_id);

--
-- Name: deliveries_received_idx; Type: INDEX; Schema: consumers; Owner: -
--

CREATE INDEX deliveries_received_idx ON consumers.deliveries USING btree (consumer, received_at);

--
-- Name: inbox_retention_idx; Type: INDEX; Schema: consumers; Owner: -
--

CREATE INDEX inbox_retention_idx ON consumers.inbox USING btree (consumer, GREATEST(first_seen_at, occurred_at));

--
-- Name: poison_created_idx; Type: INDEX; Schema: consumers; Owner: -
--

CREATE INDEX poison_created_idx ON consumers.poison USING btree (consumer, created_at);

--
-- Name: poison_redelivery_idx; Type: INDEX; Schema: consumers; Owner: -
--

CREATE INDEX poison_redelivery_idx ON consumers.poison USING btree (consumer, publish_id) WHERE (publish_id IS NOT NULL);

--
-- Name: replay_promises replay_promises_consumer_fkey; Type: FK CONSTRAINT; Schema: consumers; Owner: -
--

ALTER TABLE ONLY consumers.replay_promises
    ADD CONSTRAINT replay_promises_consumer_fkey FOREIGN KEY (consumer) REFERENCES consumers.replay_windows(consumer) ON DELETE CASCADE;

--
-- Name: SCHEMA consumers; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA consumers TO accord_consumer;
GRANT USAGE ON SCHEMA consumers TO accord_repair;

--
-- Name: FUNCTION admit_floor(p_window_s double precision); Type: ACL; Schema: consumers; Owner: -
--

REVOKE ALL ON FUNCTION consumers.admit_floor(p_window_s double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION consumers.admit_floor(p_window_s double precision) TO accord_repair;

--
-- Name: FUNCTION declare_window(p_consumer text, p_replay_window_s double precision, p_margin_s double precision); Type: ACL; Schema: consumers; Owner: -
--

REVOKE ALL ON FUNCTION consumers.declare_window(p_consumer text, p_replay_window_s double precision, p_margin_s double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION consumers.declare_window(p_consumer text, p_replay_window_s double precision, p_margin_s double precision) TO accord_consumer;

--
-- Name: FUNCTION prune_poison(p_consumer text, p_retention_s double precision, p_limit integer); Type: ACL; Schema: consumers; Owner: -
--

REVOKE ALL ON FUNCTION consumers.prune_poison(p_consumer text, p_retention_s double precision, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION consumers.prune_poison(p_consumer text, p_retention_s double precision, p_limit integer) TO accord_consumer;

--
-- Name: FUNCTION record_poison(p_consumer text, p_queue text, p_reason text, p_detail jsonb, p_tenant text, p_operation_id text, p_event_id text, p_event_type text, p_message_id text, p_publish_id text, p_redelivered boolean, p_delivery_count integer, p_headers jsonb, p_body_size integer, p_body_sha256 text, p_move_id text); Type: ACL; Schema: consumers; Owner: -
--

REVOKE ALL ON FUNCTION consumers.record_poison(p_consumer text, p_queue text, p_reason text, p_detail jsonb, p_tenant text, p_operation_id text, p_event_id text, p_event_type text, p_message_id text, p_publish_id text, p_redelivered boolean, p_delivery_count integer, p_headers jsonb, p_body_size integer, p_body_sha256 text, p_move_id text) FROM PUBLIC;
GRANT ALL ON FUNCTION consumers.record_poison(p_consumer text, p_queue text, p_reason text, p_detail jsonb, p_tenant text, p_operation_id text, p_event_id text, p_event_type text, p_message_id text, p_publish_id text, p_redelivered boolean, p_delivery_count integer, p_headers jsonb, p_body_size integer, p_body_sha256 text, p_move_id text) TO accord_consumer;

--
-- Name: FUNCTION replay_horizon(p_consumer text); Type: ACL; Schema: consumers; Owner: -
--

REVOKE ALL ON FUNCTION consumers.replay_horizon(p_consumer text) FROM PUBLIC;

--
-- Name: TABLE deliveries; Type: ACL; Schema: consumers; Owner: -
--

GRANT SELECT,INSERT,DELETE ON TABLE consumers.deliveries TO accord_consumer;

--
-- Name: COLUMN deliveries.received_at; Type: ACL; Schema: consumers; Owner: -
--

GRANT UPDATE(received_at) ON TABLE consumers.deliveries TO accord_consumer;

--
-- Name: TABLE inbox; Type: ACL; Schema: consumers; Owner: -
--

GRANT SELECT,INSERT,DELETE ON TABLE consumers.inbox TO accord_consumer;

--
-- Name: COLUMN inbox.first_seen_at; Type: ACL; Schema: consumers; Owner: -
--

GRANT UPDATE(first_seen_at) ON TABLE consumers.inbox TO accord_consumer;

--
-- Name: TABLE poison; Type: ACL; Schema: consumers; Owner: -
--

GRANT INSERT ON TABLE consumers.poison TO accord_consumer;

--
-- Name: COLUMN poison.id; Type: ACL; Schema: consumers; Owner: -
--

GRANT SELECT(id) ON TABLE consumers.poison TO accord_consumer;

--
-- Name: TABLE replay_horizons; Type: ACL; Schema: consumers; Owner: -
--

GRANT SELECT ON TABLE consumers.replay_horizons TO accord_consumer;

--
--
