"""Relay retention (migration 0023): published rows leave after the retention, held rows never
(a held row is the only copy of an event that never reached the broker), and the release
audit only through relay.prune_release_audit, once its row is resolved."""

from __future__ import annotations

import asyncpg
import pytest

from accord.relay import Relay, outbox
from accord.schemas.topology import Topology
from tests.integration.relay import helpers
from tests.support import enqueue

DAY = 86400.0


async def rows(conn: asyncpg.Connection, n: int) -> list[int]:
    async with conn.transaction():
        for i in range(n):
            await enqueue(conn, helpers.make_event(i))
    return [r["id"] for r in await conn.fetch("SELECT id FROM relay.outbox ORDER BY id")]


async def test_a_held_row_outlives_the_retention_a_published_row_as_old_does_not(
    pg: asyncpg.Connection,
) -> None:
    held, published, pending = await rows(pg, 3)
    await pg.execute("UPDATE relay.outbox SET enqueued_at = now() - interval '30 days'")
    await pg.execute(
        "UPDATE relay.outbox SET state = 'held', last_reason = 'unroutable' WHERE id = $1", held
    )
    await pg.execute(
        "UPDATE relay.outbox SET state = 'published', published_at = now() - interval '30 days'"
        " WHERE id = $1",
        published,
    )
    async with pg.transaction():
        assert await outbox.prune(pg, DAY, 100) == 1  # control: the published row goes
    async with pg.transaction():
        assert await outbox.prune(pg, 0.0, 100) == 0  # whatever the retention
    left = await pg.fetch("SELECT id, state FROM relay.outbox ORDER BY id")
    assert [(r["id"], r["state"]) for r in left] == [(held, "held"), (pending, "pending")]


async def test_release_audit_rows_leave_only_through_the_pruner_once_resolved(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    published, held_again, gone = await rows(pg, 3)
    insert = (
        "INSERT INTO relay.release_audit (at, tenant, event_id, outbox_id, held_reason,"
        " attempts, who, db_user, db_role, evidence)"
        " SELECT now() - make_interval(secs => $2), tenant, event_id, id, 'unroutable', 3,"
        " 'ops', 'u', 'r', 'ticket' FROM relay.outbox WHERE id = $1 RETURNING audit_id"
    )
    old = [await pg.fetchval(insert, row, 100 * DAY) for row in (published, held_again, gone)]
    young = await pg.fetchval(insert, published, DAY)
    await pg.execute(
        "UPDATE relay.outbox SET state = 'published', published_at = now() WHERE id = $1",
        published,
    )
    await pg.execute("UPDATE relay.outbox SET state = 'held' WHERE id = $1", held_again)
    await pg.execute("DELETE FROM relay.outbox WHERE id = $1", gone)  # published, then pruned
    # control: the audit is append-only to everyone else, its owner included
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
        await pg.execute("DELETE FROM relay.release_audit WHERE audit_id = $1", old[0])

    relay = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_relay"})
    try:
        async with relay.transaction():
            assert await outbox.prune_release_audit(relay, 90 * DAY, 1) == 1  # bounded
        async with relay.transaction():
            assert await outbox.prune_release_audit(relay, 90 * DAY, 10) == 1
        async with relay.transaction():
            assert await outbox.prune_release_audit(relay, 90 * DAY, 10) == 0
    finally:
        await relay.close()
    left = {r[0] for r in await pg.fetch("SELECT audit_id FROM relay.release_audit")}
    assert left == {old[1], young}  # a row held again keeps its history; the young one stays


async def test_the_relays_prune_loop_takes_old_release_audit_rows_too(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    (published,) = await rows(pg, 1)
    await pg.execute(
        "UPDATE relay.outbox SET state = 'published', published_at = now() WHERE id = $1",
        published,
    )
    await pg.execute(
        "INSERT INTO relay.release_audit (at, tenant, event_id, outbox_id, held_reason,"
        " attempts, who, db_user, db_role, evidence)"
        " SELECT now() - interval '100 days', tenant, event_id, id, 'unroutable', 3,"
        " 'ops', 'u', 'r', 'ticket' FROM relay.outbox WHERE id = $1",
        published,
    )

    def relay(audit_days: float) -> Relay:
        return Relay(
            helpers.config(
                pg_dsn, "amqp://unused/", Topology("unused", ()), audit_retention_s=audit_days * DAY
            )
        )

    assert await relay(200).prune_once(pg) == 0  # control: inside the audit retention
    pruner = relay(90)
    assert await pruner.prune_once(pg) == 1
    assert pruner.stats.pruned_audit == 1 and pruner.stats.pruned == 0  # the row is young
    assert await pg.fetchval("SELECT count(*) FROM relay.release_audit") == 0
