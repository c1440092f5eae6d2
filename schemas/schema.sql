-- The current definition of the `schemas` schema: generated from a migrated database by
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
-- Name: schemas; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA schemas;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: migrations; Type: TABLE; Schema: schemas; Owner: -
--

CREATE TABLE schemas.migrations (
    component text DEFAULT 'accord'::text NOT NULL,
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: migrations migrations_pkey; Type: CONSTRAINT; Schema: schemas; Owner: -
--

ALTER TABLE ONLY schemas.migrations
    ADD CONSTRAINT migrations_pkey PRIMARY KEY (component, version);

--
-- Name: SCHEMA schemas; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA schemas TO accord_worker;
GRANT USAGE ON SCHEMA schemas TO accord_repair;
GRANT USAGE ON SCHEMA schemas TO accord_relay;
GRANT USAGE ON SCHEMA schemas TO accord_consumer;

--
-- Name: TABLE migrations; Type: ACL; Schema: schemas; Owner: -
--

GRANT SELECT ON TABLE schemas.migrations TO accord_worker;
GRANT SELECT ON TABLE schemas.migrations TO accord_repair;
GRANT SELECT ON TABLE schemas.migrations TO accord_relay;
GRANT SELECT ON TABLE schemas.migrations TO accord_consumer;

--
--
