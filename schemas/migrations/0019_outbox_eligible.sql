-- 0019 outbox eligibility: the relay's claim goes straight to the rows it may take.
--
-- A pending row waiting out a retry backoff (or another relay's lease) has lease_expires_at
-- in the future. The claim used to walk pending rows in id order and skip those, so a
-- backlog in backoff made every claim read all of it, and an idle relay read it on every
-- poll. This index orders pending rows by when they become eligible: their lease or backoff
-- end, or, never claimed, their enqueue time; the claim's range condition on it stops at
-- now(), so rows still waiting are never read (tests/integration/relay/test_enqueue.py).
CREATE INDEX outbox_eligible_idx ON relay.outbox
    ((COALESCE(lease_expires_at, enqueued_at)), id) WHERE state = 'pending';
DROP INDEX relay.outbox_pending_idx;
