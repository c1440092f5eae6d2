-- The demo application's tables: the report workflow's domain (schema `demo`) and its
-- projection (schema `demo_projection`). Applied by `accord migrate --app accord.demo:app`
-- after accord's own chain.
--
-- Written with IF NOT EXISTS because accord 0.1 created these same objects in its own chain
-- (0007 and part of 0008): a database migrated by 0.1 already has them.
--
-- demo.submissions is written by accept_submission in the same transaction as the outbox row
-- of report.accepted.v1; demo.reports only by the report job's fenced publish callback, in
-- the same transaction as the jobs.results manifest row and the outbox row of
-- report.published.v1. A stale worker's publish rolls back whole, so a report row always
-- names the generation that held the job when it committed.
CREATE SCHEMA IF NOT EXISTS demo;

CREATE TABLE IF NOT EXISTS demo.submissions (
    tenant       text        NOT NULL CHECK (tenant <> ''),
    report_id    text        NOT NULL CHECK (report_id <> ''),
    subject      text        NOT NULL,
    -- The operation this submission started and the event that announced it (idempotent
    -- re-accepts return that same event).
    operation_id text        NOT NULL,
    event_id     uuid        NOT NULL,
    state        text        NOT NULL DEFAULT 'accepted',
    accepted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, report_id),
    CONSTRAINT submissions_state_check CHECK (state IN ('accepted', 'published'))
);

CREATE TABLE IF NOT EXISTS demo.reports (
    tenant           text        NOT NULL,
    report_id        text        NOT NULL,
    job_id           bigint      NOT NULL REFERENCES jobs.jobs (job_id),
    object_key       text        NOT NULL,
    provider_receipt text,
    published_at     timestamptz NOT NULL DEFAULT now(),
    generation       bigint      NOT NULL,
    PRIMARY KEY (tenant, report_id),
    FOREIGN KEY (tenant, report_id) REFERENCES demo.submissions (tenant, report_id)
);

-- The report job runs as the execution principal (accord_worker, 0006): its fenced publish
-- writes the report and marks the submission; it never deletes domain rows.
GRANT USAGE ON SCHEMA demo TO accord_worker;
GRANT SELECT, INSERT, UPDATE ON demo.submissions, demo.reports TO accord_worker;

-- The demo projection: one row per published report, rebuilt from report.published.v1.
-- Deterministic in the events alone (no wall-clock columns), so a rebuild by replay can be
-- compared row for row with the live projection.
CREATE SCHEMA IF NOT EXISTS demo_projection;

CREATE TABLE IF NOT EXISTS demo_projection.published_reports (
    tenant           text        NOT NULL,
    report_id        text        NOT NULL,
    operation_id     text        NOT NULL,
    event_id         uuid        NOT NULL,
    object_key       text        NOT NULL,
    provider_receipt text,
    published_at     timestamptz NOT NULL,  -- the event's occurred_at
    CONSTRAINT published_reports_pkey PRIMARY KEY (tenant, report_id)
);

GRANT USAGE ON SCHEMA demo_projection TO accord_projection;
GRANT SELECT, INSERT, UPDATE, DELETE ON demo_projection.published_reports TO accord_projection;
-- Projection tables added later in this schema by the same migrating role get the same grants.
ALTER DEFAULT PRIVILEGES IN SCHEMA demo_projection
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO accord_projection;
