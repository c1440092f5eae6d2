-- 0008 ops: the projection principal and the replay ledger.
--
-- (0.1 also created an application's projection table here; since 0.2 an application's
-- projection tables are in its own migrations, applied after accord's.)
--
-- Projection replay (accord/ops/replay.py) re-delivers retained outbox events to projection
-- handlers under the role accord_projection (SET LOCAL ROLE per transaction). The role can
-- read and write projection tables only: it has no privilege on the jobs, relay, consumers or
-- ops schemas, so a projection handler that tries to submit a job or begin an effect is
-- refused by PostgreSQL itself (SQLSTATE 42501), not by a Python check.
--
-- Roles are cluster-wide while migrations run per database, and test databases share one
-- cluster: the role is created at most once, and a concurrent creation from another
-- database's migration is tolerated (unique_violation on pg_authid, or duplicate_object).
-- https://www.postgresql.org/docs/15/sql-createrole.html
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'accord_projection') THEN
        BEGIN
            CREATE ROLE accord_projection NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database's migration created it first
        END;
    END IF;
    -- SET ROLE needs membership: a non-superuser migrating user gets it (a superuser
    -- can always SET ROLE).
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       AND NOT pg_has_role(current_user, 'accord_projection', 'MEMBER') THEN
        EXECUTE format('GRANT accord_projection TO %I', current_user);
    END IF;
END $$;

-- Explicitly nothing on the execution side (the role never had it; this states the intent).
REVOKE ALL ON SCHEMA jobs, relay, consumers FROM accord_projection;
REVOKE ALL ON ALL TABLES IN SCHEMA jobs, relay, consumers FROM accord_projection;

-- The replay ledger: one row per `accord replay` run, and one per refused event. Written by
-- the replaying (owner) role, never by accord_projection.
CREATE SCHEMA IF NOT EXISTS ops;
REVOKE ALL ON SCHEMA ops FROM accord_projection;

CREATE TABLE ops.replay_runs (
    run_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow    text        NOT NULL CHECK (workflow <> ''),
    since       timestamptz NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    events      integer     NOT NULL DEFAULT 0 CHECK (events >= 0),
    applied     integer     NOT NULL DEFAULT 0 CHECK (applied >= 0),
    refused     integer     NOT NULL DEFAULT 0 CHECK (refused >= 0),
    skipped     integer     NOT NULL DEFAULT 0 CHECK (skipped >= 0)
);

-- A projection handler tried something its principal may not do (submit a job, begin an
-- effect, touch the outbox): the event is recorded here, never silently dropped. Identifiers
-- and the typed reason only; the message is PostgreSQL's own (object names, no values).
CREATE TABLE ops.replay_refusals (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id       bigint      NOT NULL REFERENCES ops.replay_runs (run_id),
    workflow     text        NOT NULL,
    tenant       text        NOT NULL,
    operation_id text        NOT NULL,
    event_id     uuid        NOT NULL,
    event_type   text        NOT NULL,
    outbox_id    bigint      NOT NULL,
    reason       text        NOT NULL
        CONSTRAINT replay_refusals_reason_check CHECK (reason IN ('insufficient_privilege')),
    sqlstate     text        NOT NULL,
    message      text        NOT NULL,
    refused_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX replay_refusals_run_idx ON ops.replay_refusals (run_id);
