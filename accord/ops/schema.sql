-- The current definition of the `ops` schema: generated from a migrated database by
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
-- Name: ops; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA ops;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: replay_refusals; Type: TABLE; Schema: ops; Owner: -
--

CREATE TABLE ops.replay_refusals (
    id bigint NOT NULL,
    run_id bigint NOT NULL,
    workflow text NOT NULL,
    tenant text NOT NULL,
    operation_id text NOT NULL,
    event_id uuid NOT NULL,
    event_type text NOT NULL,
    outbox_id bigint NOT NULL,
    reason text NOT NULL,
    sqlstate text NOT NULL,
    message text NOT NULL,
    refused_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT replay_refusals_reason_check CHECK ((reason = 'insufficient_privilege'::text))
);

--
-- Name: replay_refusals_id_seq; Type: SEQUENCE; Schema: ops; Owner: -
--

ALTER TABLE ops.replay_refusals ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME ops.replay_refusals_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: replay_runs; Type: TABLE; Schema: ops; Owner: -
--

CREATE TABLE ops.replay_runs (
    run_id bigint NOT NULL,
    workflow text NOT NULL,
    since timestamp with time zone NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    events integer DEFAULT 0 NOT NULL,
    applied integer DEFAULT 0 NOT NULL,
    refused integer DEFAULT 0 NOT NULL,
    skipped integer DEFAULT 0 NOT NULL,
    CONSTRAINT replay_runs_applied_check CHECK ((applied >= 0)),
    CONSTRAINT replay_runs_events_check CHECK ((events >= 0)),
    CONSTRAINT replay_runs_refused_check CHECK ((refused >= 0)),
    CONSTRAINT replay_runs_skipped_check CHECK ((skipped >= 0)),
    CONSTRAINT replay_runs_workflow_check CHECK ((workflow <> ''::text))
);

--
-- Name: replay_runs_run_id_seq; Type: SEQUENCE; Schema: ops; Owner: -
--

ALTER TABLE ops.replay_runs ALTER COLUMN run_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME ops.replay_runs_run_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: replay_refusals replay_refusals_pkey; Type: CONSTRAINT; Schema: ops; Owner: -
--

ALTER TABLE ONLY ops.replay_refusals
    ADD CONSTRAINT replay_refusals_pkey PRIMARY KEY (id);

--
-- Name: replay_runs replay_runs_pkey; Type: CONSTRAINT; Schema: ops; Owner: -
--

ALTER TABLE ONLY ops.replay_runs
    ADD CONSTRAINT replay_runs_pkey PRIMARY KEY (run_id);

--
-- Name: replay_refusals_run_idx; Type: INDEX; Schema: ops; Owner: -
--

CREATE INDEX replay_refusals_run_idx ON ops.replay_refusals USING btree (run_id);

--
-- Name: replay_refusals replay_refusals_run_id_fkey; Type: FK CONSTRAINT; Schema: ops; Owner: -
--

ALTER TABLE ONLY ops.replay_refusals
    ADD CONSTRAINT replay_refusals_run_id_fkey FOREIGN KEY (run_id) REFERENCES ops.replay_runs(run_id);

--
--
