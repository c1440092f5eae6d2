"""SQL owned by the relay (table ``relay.outbox``). Values only as $n parameters."""

# The LISTEN/NOTIFY channel that wakes relays (a hint only; polling is the truth).
NOTIFY_CHANNEL = "relay_outbox"

# An enqueue's wake-up: NOTIFY at commit, unless a relay promised to poll for more than
# AWAKE_MARGIN from now (relay.awake, migration 0030): a notifying commit holds a global lock
# through its WAL flush, so with many producers NOTIFY caps their commit rate. The margin
# covers the time from the statement to its transaction's commit; a commit later than that,
# after the promise ran out, waits for a relay's poll at most. The promise is read at the
# statement's time (statement_timestamp(), not the transaction's start).
AWAKE_MARGIN_S = 0.5
WAKE = (
    "CASE WHEN (SELECT until FROM relay.awake)"  # noqa: S608 - only constants are formatted
    f" > statement_timestamp() + interval '{AWAKE_MARGIN_S} s'"
    f" THEN NULL ELSE pg_notify('{NOTIFY_CHANNEL}', '') END"
)

# Insert one event and wake relays at commit, in one statement (one round trip, DESIGN §11).
# The wake-up in RETURNING rather than a CTE around the INSERT: the same single statement,
# and cheaper per transaction than the CTE (measured: docs/bench-log.md).
ENQUEUE = f"""
INSERT INTO relay.outbox (
    event_id, tenant, operation_id, type, version, authority_epoch,
    digest, body, trace, occurred_at
)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
RETURNING id, {WAKE}
"""  # noqa: S608 - WAKE is a constant

#: The column the joined enqueue adds to the domain statement's rows: the outbox row id.
JOINED_OUTBOX_ID = "accord_outbox_id"
#: ENQUEUE's parameters, which the joined statement takes after the domain statement's.
OUTBOX_PARAMS = 10


def enqueue_joined(domain: str, n: int, ctes: str | None = None) -> str:
    """The domain statement (parameters $1..$n, with RETURNING) and the outbox row in one
    statement: the row is written only when the domain statement returned a row; the outbox
    parameters follow as $n+1..$n+10 (ENQUEUE's, in its order), so the domain statement must
    use exactly $1..$n (relay.outbox._joined checks it). Every row comes back with the
    outbox id. ``ctes``: the domain statement's own WITH list (what followed its WITH), put
    first, since a data-modifying CTE may stand only at the top level; ``domain`` is then
    the statement after it."""
    p = [f"${n + i}" for i in range(1, OUTBOX_PARAMS + 1)]
    head = "WITH " if ctes is None else f"WITH {ctes}\n, "
    return (  # the domain on lines of its own: a comment ending it ends with its line
        f"{head}accord_domain AS (\n{domain}\n), accord_outbox AS ("  # noqa: S608 - parameter numbers
        " INSERT INTO relay.outbox (event_id, tenant, operation_id, type, version,"
        " authority_epoch, digest, body, trace, occurred_at)"
        f" SELECT {', '.join(p)} WHERE EXISTS (SELECT 1 FROM accord_domain)"
        f" RETURNING id, {WAKE})"
        f" SELECT accord_domain.*, (SELECT id FROM accord_outbox) AS {JOINED_OUTBOX_ID}"
        " FROM accord_domain"
    )


# Claim up to $1 eligible rows by state (never an id cursor), stamping lease $2 for $3 s, in
# the order they became eligible (backoff or lease end, else enqueue time): the range on
# outbox_eligible_idx stops at now(), so rows still in backoff are never read.
# SKIP LOCKED lets several relays claim side by side without waiting on each other:
# https://www.postgresql.org/docs/15/sql-select.html#SQL-FOR-UPDATE-SHARE
CLAIM = """
WITH eligible AS (
    SELECT id FROM relay.outbox
    WHERE state = 'pending'
      AND COALESCE(lease_expires_at, enqueued_at) <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY COALESCE(lease_expires_at, enqueued_at), id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE relay.outbox AS o
SET lease_token = $2,
    lease_expires_at = now() + make_interval(secs => $3),
    attempts = o.attempts + 1
FROM eligible
WHERE o.id = eligible.id
RETURNING o.id, o.event_id, o.tenant, o.operation_id, o.type, o.version,
          o.authority_epoch, o.digest, o.body, o.trace, o.occurred_at, o.enqueued_at,
          o.attempts, o.returns
"""

# Settle a claimed batch under lease $1: per row its new state, reason, publish id and
# retry delay; the broker's returns counted in a row (0048). The token guard makes a relay
# whose lease was taken over a no-op.
SETTLE = """
UPDATE relay.outbox AS o
SET state = u.state,
    returns = CASE WHEN u.reason = 'unroutable' THEN o.returns + 1 ELSE 0 END,
    published_at = CASE WHEN u.state = 'published' THEN now() END,
    publish_id = COALESCE(u.publish_id, o.publish_id),
    last_reason = COALESCE(u.reason, o.last_reason),
    lease_token = NULL,
    lease_expires_at = CASE
        WHEN u.state = 'pending' THEN now() + make_interval(secs => u.delay)
    END
FROM unnest($2::bigint[], $3::text[], $4::text[], $5::uuid[], $6::float8[])
     AS u(id, state, reason, publish_id, delay)
WHERE o.id = u.id AND o.lease_token = $1 AND o.state IS NOT DISTINCT FROM 'pending'
"""  # IS NOT DISTINCT FROM (state is never NULL): `state = 'pending'` matches
# outbox_eligible_idx's predicate, and a plan made under statistics of a quiet outbox then
# read every pending row to settle a batch (a custom plan: a connection's first five, or
# every one behind a pooler); this way only the primary key can find the batch's rows.

# Delete up to $2 rows published more than $1 seconds ago (one bounded batch), and keep the
# latest enqueue time it took in relay.pruned (migration 0044: a rebuild of a projection
# then knows events are gone). Returns how many rows it deleted.
PRUNE = """
WITH gone AS (
    DELETE FROM relay.outbox
    WHERE id IN (
        SELECT id FROM relay.outbox
        WHERE state = 'published' AND published_at < now() - make_interval(secs => $1)
        ORDER BY published_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING enqueued_at
), marked AS (
    INSERT INTO relay.pruned AS p (through)
    SELECT max(enqueued_at) FROM gone HAVING count(*) > 0
    ON CONFLICT (one) DO UPDATE SET through = greatest(p.through, excluded.through)
)
SELECT count(*) FROM gone
"""

# Counts by state and the age in seconds of the oldest pending row (the relay lag).
STATS = """
SELECT count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'published') AS published,
       count(*) FILTER (WHERE state = 'held') AS held,
       COALESCE(EXTRACT(EPOCH FROM now() - min(enqueued_at) FILTER (WHERE state = 'pending')), 0)
           ::float8 AS oldest_pending_s
FROM relay.outbox
"""

# Status figures (accord status, /metrics): unpublished and held rows, the relay lag (oldest
# unpublished age) and attempts; reads only pending and held rows, each by its index (published
# ones may be many).
FIGURES = """
SELECT p.pending, (SELECT count(*) FROM relay.outbox WHERE state = 'held')::bigint AS held,
       p.lag_s, p.pending_attempts,
       (SELECT CASE WHEN until > now() THEN EXTRACT(EPOCH FROM until - now()) ELSE 0 END
        FROM relay.awake)::float8 AS awake_s
FROM (SELECT count(*)::bigint AS pending,
             COALESCE(EXTRACT(EPOCH FROM now() - min(enqueued_at)), 0)::float8 AS lag_s,
             COALESCE(sum(attempts), 0)::bigint AS pending_attempts
      FROM relay.outbox WHERE state = 'pending') p
"""  # Pending rows by outbox_eligible_idx, held ones by outbox_held_idx (0034): never the
# published history.

# Held outbox rows by typed reason.
HELD_BY_REASON = """
SELECT COALESCE(last_reason, 'unspecified') AS reason, count(*)::bigint AS rows,
       EXTRACT(EPOCH FROM now() - min(enqueued_at))::float8 AS oldest_age_s
FROM relay.outbox
WHERE state = 'held'
GROUP BY 1
ORDER BY 1
"""

# Release held rows of tenant $1 with event ids $2 as principal $3 with evidence $4 (all or
# nothing, relay.release_held in relay/schema.sql), refusing a row enqueued before $5 (NULL:
# unchecked): each released row with its audit id, or else each refused id with its status
# (missing, not_held, past_replay_window; principal_required).
RELEASE_HELD_AUDITED = (
    "SELECT event_id, outbox_id, status, audit_id"
    " FROM relay.release_held($1, $2::uuid[], $3, $4, $5::timestamptz)"
)

# Discard held rows $2 of tenant $1 for good as principal $3 with evidence $4: all or nothing,
# one audit row each (relay.discard_held, 0061).
DISCARD_HELD = (
    "SELECT event_id, outbox_id, status, audit_id FROM relay.discard_held($1, $2::uuid[], $3, $4)"
)

# Held rows, oldest first, optionally of tenant $1, at most $2: identifiers, type, the reason
# they are held and their attempts (never the body).
HELD_ROWS = """
SELECT id, tenant, event_id, operation_id, type, version, last_reason, attempts, enqueued_at
FROM relay.outbox
WHERE state = 'held' AND ($1::text IS NULL OR tenant = $1)
ORDER BY id
LIMIT $2
"""

# The release audit of tenant $1 (optionally of event $2), oldest first.
RELEASE_AUDIT = """
SELECT audit_id, at, tenant, event_id, outbox_id, held_reason, attempts, who, db_user, db_role,
       evidence, action, operation_id, type, version, digest, enqueued_at
FROM relay.release_audit
WHERE tenant = $1 AND ($2::uuid IS NULL OR event_id = $2)
ORDER BY audit_id
"""

# Why the previous attempt of each claimed row $1 failed (publish spans only; the claim leaves
# last_reason as the last settle wrote it).
PREVIOUS_REASONS = (
    "SELECT id, last_reason FROM relay.outbox WHERE id = ANY($1::bigint[])"
    " AND last_reason IS NOT NULL"
)

# Delete one bounded batch of at most $2 release audit rows older than $1 seconds whose outbox
# row is resolved (published or pruned; relay.prune_release_audit); the count.
PRUNE_RELEASE_AUDIT = "SELECT relay.prune_release_audit($1, $2)"

# A relay's promise to poll the outbox for $1 s more (relay.awake, migration 0030): never
# shortens another relay's. Returns the promise now in force, how long it has to run (by
# the database clock) and whether it is this one (not another relay's longer one).
PROMISE_AWAKE = """
UPDATE relay.awake SET until = GREATEST(until, now() + make_interval(secs => $1))
RETURNING until, EXTRACT(epoch FROM until - now())::float8 AS remaining_s,
          until = now() + make_interval(secs => $1) AS own
"""

# A relay stopping cleanly takes back its own promise ($1, as PROMISE_AWAKE returned it)
# unless another relay has promised longer since.
WITHDRAW_AWAKE = "UPDATE relay.awake SET until = LEAST(until, now()) WHERE until = $1"
