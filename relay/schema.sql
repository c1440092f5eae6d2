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

SET default_tablespace = '';

SET default_table_access_method = heap;

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
    CONSTRAINT outbox_authority_epoch_check CHECK ((authority_epoch >= 0)),
    CONSTRAINT outbox_published_check CHECK (((state = 'published'::text) = (published_at IS NOT NULL))),
    CONSTRAINT outbox_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'published'::text, 'held'::text]))),
    CONSTRAINT outbox_version_check CHECK ((version >= 1))
);

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
-- Name: outbox id; Type: DEFAULT; Schema: relay; Owner: -
--

ALTER TABLE ONLY relay.outbox ALTER COLUMN id SET DEFAULT nextval('relay.outbox_id_seq'::regclass);

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
-- Name: outbox_eligible_idx; Type: INDEX; Schema: relay; Owner: -
--

CREATE INDEX outbox_eligible_idx ON relay.outbox USING btree (COALESCE(lease_expires_at, enqueued_at), id) WHERE (state = 'pending'::text);

--
-- Name: outbox_published_idx; Type: INDEX; Schema: relay; Owner: -
--

CREATE INDEX outbox_published_idx ON relay.outbox USING btree (published_at) WHERE (state = 'published'::text);

--
-- Name: SCHEMA relay; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA relay TO accord_worker;
GRANT USAGE ON SCHEMA relay TO accord_relay;

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
-- Name: SEQUENCE outbox_id_seq; Type: ACL; Schema: relay; Owner: -
--

GRANT USAGE ON SEQUENCE relay.outbox_id_seq TO accord_worker;

--
--
