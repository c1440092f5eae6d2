-- 0003 consumers: the inbox (one row per semantic operation per consumer), the delivery
-- log (one row per delivery that reached the inbox) and poison records (typed reasons).
-- Owned by the consumers module; see consumers/inbox.py for the invariants.

-- One reserved semantic operation per (tenant, consumer). The row is written in the same
-- transaction as the handler's effect, so "row exists" means "effect committed".
CREATE TABLE consumers.inbox (
    tenant        text        NOT NULL,
    consumer      text        NOT NULL,
    operation_id  text        NOT NULL,
    event_id      uuid        NOT NULL,
    digest        text        NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$'),
    event_type    text        NOT NULL,
    version       integer     NOT NULL CHECK (version >= 1),
    occurred_at   timestamptz NOT NULL,
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbox_pkey PRIMARY KEY (tenant, consumer, operation_id),
    CONSTRAINT inbox_event_key UNIQUE (tenant, consumer, event_id)
);

-- Retention: a row is kept for the replay window after the later of the two clocks, so an
-- event whose row was pruned is always older than the window and is refused as too old.
CREATE INDEX inbox_retention_idx
    ON consumers.inbox ((GREATEST(first_seen_at, occurred_at)));

-- The delivery identity, recorded separately from the operation: every delivery that
-- reached the inbox decision, with its outcome. This is how duplicates are counted.
CREATE TABLE consumers.deliveries (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant         text        NOT NULL,
    consumer       text        NOT NULL,
    operation_id   text        NOT NULL,
    event_id       uuid        NOT NULL,
    publish_id     text,
    redelivered    boolean     NOT NULL,
    delivery_count integer     NOT NULL CHECK (delivery_count >= 0),
    outcome        text        NOT NULL
        CONSTRAINT deliveries_outcome_check CHECK (outcome IN ('new', 'duplicate', 'conflict')),
    received_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX deliveries_received_idx ON consumers.deliveries (received_at);
CREATE INDEX deliveries_operation_idx ON consumers.deliveries (tenant, consumer, operation_id);

-- A message that can never be applied: typed reason, identifiers and a header summary.
-- Never the raw payload: only its size and SHA-256.
CREATE TABLE consumers.poison (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer       text        NOT NULL,
    queue          text        NOT NULL,
    reason         text        NOT NULL
        CONSTRAINT poison_reason_check CHECK (reason IN (
            'malformed', 'malformed_json', 'duplicate_key', 'non_finite_number',
            'body_not_object', 'missing_header', 'bad_header', 'duplicate_header',
            'bad_specversion', 'bad_content_type', 'bad_attribute', 'unknown_type',
            'unknown_version', 'invalid_event', 'no_handler', 'digest_mismatch',
            'tenant_mismatch', 'conflict', 'too_old', 'rejected', 'retries_exhausted')),
    detail         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    tenant         text,
    operation_id   text,
    event_id       text,
    event_type     text,
    message_id     text,
    publish_id     text,
    redelivered    boolean     NOT NULL,
    delivery_count integer     NOT NULL CHECK (delivery_count >= 0),
    headers        jsonb       NOT NULL,
    body_size      integer     NOT NULL CHECK (body_size >= 0),
    body_sha256    text        NOT NULL CHECK (body_sha256 ~ '^[0-9a-f]{64}$'),
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX poison_created_idx ON consumers.poison (created_at);
