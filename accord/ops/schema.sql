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

--
-- Name: prune_replay(double precision, integer); Type: FUNCTION; Schema: ops; Owner: -
--

CREATE FUNCTION ops.prune_replay(p_retention_s double precision, p_limit integer) RETURNS TABLE(runs integer, refusals integer)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_cutoff timestamptz;
    v_runs integer;
    v_refusals integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'ops.prune_replay: a batch holds 1 to 10000 rows, not %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'ops.prune_replay: retention % s', p_retention_s
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_cutoff := now() - make_interval(secs => p_retention_s);
    DELETE FROM ops.replay_refusals f
    WHERE f.id IN (
        SELECT x.id FROM ops.replay_runs r JOIN ops.replay_refusals x ON x.run_id = r.run_id
        WHERE coalesce(r.finished_at, r.started_at) < v_cutoff
          AND (r.finished_at IS NOT NULL OR NOT ops.replay_running(r.run_id))
        ORDER BY r.run_id
        LIMIT p_limit
    );
    GET DIAGNOSTICS v_refusals = ROW_COUNT;
    DELETE FROM ops.replay_runs r
    WHERE r.run_id IN (
        SELECT e.run_id FROM ops.replay_runs e
        WHERE coalesce(e.finished_at, e.started_at) < v_cutoff
          AND (e.finished_at IS NOT NULL OR NOT ops.replay_running(e.run_id))
          AND NOT EXISTS (SELECT 1 FROM ops.replay_refusals x WHERE x.run_id = e.run_id)
        ORDER BY e.run_id
        LIMIT p_limit
    );
    GET DIAGNOSTICS v_runs = ROW_COUNT;
    RETURN QUERY SELECT v_runs, v_refusals;
END $$;

--
-- Name: FUNCTION prune_replay(p_retention_s double precision, p_limit integer); Type: COMMENT; Schema: ops; Owner: -
--

COMMENT ON FUNCTION ops.prune_replay(p_retention_s double precision, p_limit integer) IS 'Remove one bounded batch of the replay ledger older than the retention (0041): refusals of expired runs, then expired runs left with none; never a run in progress (0053); (runs, refusals)';

--
-- Name: replay_refusal_count(); Type: FUNCTION; Schema: ops; Owner: -
--

CREATE FUNCTION ops.replay_refusal_count() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO ops.replay_refusal_totals AS t (workflow, reason, refusals)
    VALUES (NEW.workflow, NEW.reason, 1)
    ON CONFLICT (workflow, reason) DO UPDATE SET refusals = t.refusals + 1;
    RETURN NULL;
END $$;

--
-- Name: replay_running(bigint); Type: FUNCTION; Schema: ops; Owner: -
--

CREATE FUNCTION ops.replay_running(p_run_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.database = (SELECT d.oid FROM pg_database d
                            WHERE d.datname = current_database())
          AND l.classid = 1919250030::oid AND l.objid = (p_run_id & 2147483647)::oid)
$$;

--
-- Name: FUNCTION replay_running(p_run_id bigint); Type: COMMENT; Schema: ops; Owner: -
--

COMMENT ON FUNCTION ops.replay_running(p_run_id bigint) IS 'Whether a replay holds run p_run_id''s lock (accord.ops.sql.HOLD_RUN) in this database: it is in progress (0053)';

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: replay_refusal_totals; Type: TABLE; Schema: ops; Owner: -
--

CREATE TABLE ops.replay_refusal_totals (
    workflow text NOT NULL,
    reason text NOT NULL,
    refusals bigint NOT NULL,
    CONSTRAINT replay_refusal_totals_refusals_check CHECK ((refusals >= 0))
);

--
-- Name: TABLE replay_refusal_totals; Type: COMMENT; Schema: ops; Owner: -
--

COMMENT ON TABLE ops.replay_refusal_totals IS 'Replay refusals ever recorded, by workflow and reason (0041): kept by a trigger on ops.replay_refusals, never decreased by its retention';

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
    sqlstate text,
    message text NOT NULL,
    refused_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT replay_refusals_reason_check CHECK ((reason = ANY (ARRAY['insufficient_privilege'::text, 'data_exception'::text, 'integrity_violation'::text, 'malformed'::text, 'unknown_type'::text, 'invalid_event'::text])))
);

--
-- Name: COLUMN replay_refusals.reason; Type: COMMENT; Schema: ops; Owner: -
--

COMMENT ON COLUMN ops.replay_refusals.reason IS 'insufficient_privilege: the handler reached past the projection principal; data_exception, integrity_violation: PostgreSQL refused its statement for the event''s content (the live consumer poisons these); malformed, unknown_type, invalid_event: the event no longer decodes with the catalog (0064)';

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
-- Name: replay_refusal_totals replay_refusal_totals_pkey; Type: CONSTRAINT; Schema: ops; Owner: -
--

ALTER TABLE ONLY ops.replay_refusal_totals
    ADD CONSTRAINT replay_refusal_totals_pkey PRIMARY KEY (workflow, reason);

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
-- Name: replay_refusals replay_refusals_count; Type: TRIGGER; Schema: ops; Owner: -
--

CREATE TRIGGER replay_refusals_count AFTER INSERT ON ops.replay_refusals FOR EACH ROW EXECUTE FUNCTION ops.replay_refusal_count();

--
-- Name: replay_refusals replay_refusals_run_id_fkey; Type: FK CONSTRAINT; Schema: ops; Owner: -
--

ALTER TABLE ONLY ops.replay_refusals
    ADD CONSTRAINT replay_refusals_run_id_fkey FOREIGN KEY (run_id) REFERENCES ops.replay_runs(run_id);

--
-- Name: FUNCTION replay_refusal_count(); Type: ACL; Schema: ops; Owner: -
--

REVOKE ALL ON FUNCTION ops.replay_refusal_count() FROM PUBLIC;

--
--
