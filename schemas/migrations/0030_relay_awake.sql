-- 0030 relay.awake: a relay that finds events at a sustained rate promises to poll the outbox
-- until `until` (database clock); while a promise has more than half a second to run, enqueue
-- does not NOTIFY (relay/sql.py, ENQUEUE and the joined form). A notifying commit holds a
-- global lock through its WAL flush, so producers' notifying commits never share a flush:
-- eight producers commit 0.43 x as often with NOTIFY as without (docs/bench-log.md,
-- 2026-12-04). NOTIFY stays a wake-up hint and polling the truth: a promise its relay did not
-- keep (it died) delays an event by at most another relay's poll interval, never loses it.
-- One row; -infinity: no promise, every enqueue notifies.
CREATE TABLE relay.awake (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    until timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO relay.awake DEFAULT VALUES;

-- Every enqueue reads it, in whatever role the application enqueues as (its INSERT grant on
-- relay.outbox is the application's own): one timestamp, readable by all.
GRANT SELECT ON relay.awake TO PUBLIC;
-- The relay writes its promise and withdraws it at a clean stop.
GRANT UPDATE (until) ON relay.awake TO accord_relay;
