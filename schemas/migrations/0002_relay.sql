-- 0002 relay: the transactional outbox (DESIGN.md §4).
--
-- One row per enqueued event, written in the producer's own transaction. The relay
-- claims rows *by state* (never by an id cursor: ids commit out of order), publishes
-- them, and marks them published under its lease token. `body` holds the exact bytes
-- that go on the wire, so every re-publish of a row is byte-identical.
CREATE TABLE relay.outbox (
    id               bigserial   PRIMARY KEY,
    event_id         uuid        NOT NULL,
    tenant           text        NOT NULL,
    operation_id     text        NOT NULL,
    type             text        NOT NULL,
    version          integer     NOT NULL CHECK (version >= 1),
    authority_epoch  bigint      NOT NULL DEFAULT 0 CHECK (authority_epoch >= 0),
    digest           text        NOT NULL,
    body             bytea       NOT NULL,
    trace            jsonb,
    occurred_at      timestamptz NOT NULL,
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    state            text        NOT NULL DEFAULT 'pending',
    attempts         integer     NOT NULL DEFAULT 0,
    last_reason      text,
    -- The lease: who may publish the row now. A failed publish clears the token and
    -- leaves lease_expires_at as the earliest retry time (a backoff held by nobody).
    lease_token      uuid,
    lease_expires_at timestamptz,
    published_at     timestamptz,
    publish_id       uuid,
    -- The event id is minted once per row and unique within its tenant (DESIGN.md §2).
    CONSTRAINT outbox_event_unique UNIQUE (tenant, event_id),
    CONSTRAINT outbox_state_check CHECK (state IN ('pending', 'published', 'held')),
    CONSTRAINT outbox_published_check CHECK ((state = 'published') = (published_at IS NOT NULL))
);

-- The claim's index: only unpublished rows, in id order (oldest first). Small because
-- published rows leave it at once.
CREATE INDEX outbox_pending_idx ON relay.outbox (id) WHERE state = 'pending';

-- The pruner's index: published rows by age.
CREATE INDEX outbox_published_idx ON relay.outbox (published_at) WHERE state = 'published';
