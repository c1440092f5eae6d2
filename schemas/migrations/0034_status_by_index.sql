-- 0034 A status snapshot reads the work that is not done, not the history kept. Every /metrics
-- scrape of every process takes one (accord.ops.status), and its counts by state read
-- jobs.jobs and relay.outbox whole to find the few rows not succeeded or published: with
-- 200,000 of each retained, a snapshot took 458 ms of the server (measured on a scratch
-- database), and it grows with the retention. The states a snapshot counts are each behind
-- an index now: queued and running jobs behind the claim's and the rescue's (0004), pending
-- outbox rows behind the claim's (0019); these two hold the rarer ones. Neither is written
-- on the way of a job or an event that succeeds: a row enters them only when it is held,
-- poisoned, canceled or left unknown.
CREATE INDEX jobs_attention_idx ON jobs.jobs (state)
    WHERE state IN ('poison', 'unknown', 'canceled', 'held');
CREATE INDEX outbox_held_idx ON relay.outbox (id) WHERE state = 'held';
