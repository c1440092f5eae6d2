-- 0048 How many times in a row the broker returned a row's publish (no queue bound for its
-- type). A row was held as unroutable once its `attempts` reached the relay's
-- relay_unroutable_attempts, but `attempts` counts every claim: after a memory alarm's
-- timeouts or a full queue's nacks, the row's first return held it at once, and a binding
-- missing for a moment during a consumer's redeploy held the whole backlog, to be released
-- row by row. The settle now counts returns in a row (any other outcome starts it again), and
-- the relay holds a row only after that many returns.

ALTER TABLE relay.outbox ADD COLUMN returns integer DEFAULT 0 NOT NULL;

ALTER TABLE relay.outbox ADD CONSTRAINT outbox_returns_check CHECK (returns >= 0);

COMMENT ON COLUMN relay.outbox.returns IS 'Publishes the broker returned in a row (unroutable); any other outcome resets it (0048)';

GRANT UPDATE(returns) ON TABLE relay.outbox TO accord_relay;
