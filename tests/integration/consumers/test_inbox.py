"""reserve(): one operation per (tenant, consumer, operation id), in the caller's transaction."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from accord.consumers import (
    Consumer,
    Delivery,
    InboxConflict,
    InboxOutcome,
    OccurredInFuture,
    PoisonReason,
    ReplayTooOld,
    prune,
    reserve,
    reserve_many,
)
from accord.consumers import sql as consumer_sql
from accord.consumers.inbox import PRUNE_MARGIN_S
from accord.schemas.errors import NotInTransaction
from accord.schemas.events import Event
from tests.integration.consumers.support import CATALOG, counts, report

CONSUMER = Consumer("report", CATALOG, replay_window_s=3600.0)


async def _reserve(
    conn: asyncpg.Connection,
    event: Event,
    delivery: Delivery | None = None,
    consumer: Consumer = CONSUMER,
) -> bool:
    async with conn.transaction():
        return await reserve(conn, consumer, event, delivery or Delivery())


async def test_new_then_duplicate_records_each_delivery(pg: asyncpg.Connection) -> None:
    event = report()
    assert await _reserve(pg, event, Delivery(publish_id="p1")) is True
    # A redelivery, and a re-publish of the same operation under a new event id: skipped.
    assert await _reserve(pg, event, Delivery("p1", redelivered=True, delivery_count=1)) is False
    again = event.model_copy(update={"event_id": uuid.uuid4()})
    assert await _reserve(pg, again, Delivery(publish_id="p2")) is False
    assert await counts(pg) == {"new": 1, "duplicate": 2}
    row = await pg.fetchrow("SELECT * FROM consumers.inbox")
    assert row["digest"] == CATALOG.digest(event)
    assert row["event_id"] == event.event_id
    logged = await pg.fetch(
        "SELECT publish_id, redelivered, delivery_count FROM consumers.deliveries ORDER BY id"
    )
    assert [tuple(r) for r in logged] == [("p1", False, 0), ("p1", True, 1), ("p2", False, 0)]


async def test_changed_digest_is_a_conflict_with_both_digests(pg: asyncpg.Connection) -> None:
    event = report("op-1", subject="first")
    assert await _reserve(pg, event) is True
    # control: an immaterial change (priority is not material) is the same operation
    hinted = event.model_copy(update={"payload": {**event.payload, "priority": 3}})
    assert await _reserve(pg, hinted) is False
    changed = report("op-1", subject="something else")
    with pytest.raises(InboxConflict) as caught:
        await _reserve(pg, changed)
    assert caught.value.stored_digest == CATALOG.digest(event)
    assert caught.value.incoming_digest == CATALOG.digest(changed)
    assert caught.value.reason == PoisonReason.CONFLICT
    assert await pg.fetchval("SELECT count(*) FROM consumers.inbox") == 1


async def test_same_event_id_with_another_operation_is_a_conflict(pg: asyncpg.Connection) -> None:
    event = report("op-a")
    assert await _reserve(pg, event) is True
    other = report("op-b", event_id=event.event_id)
    with pytest.raises(InboxConflict) as caught:
        await _reserve(pg, other)
    assert caught.value.stored_operation_id == "op-a"


async def test_operation_ids_are_tenant_scoped(pg: asyncpg.Connection) -> None:
    assert await _reserve(pg, report("op-x", tenant="acme")) is True
    assert await _reserve(pg, report("op-x", tenant="globex", subject="other")) is True
    # and per consumer: another workflow class reserves the same operation for itself
    other = Consumer("report_projection", CATALOG, replay_window_s=3600.0)
    assert await _reserve(pg, report("op-x", tenant="acme"), consumer=other) is True
    assert await pg.fetchval("SELECT count(*) FROM consumers.inbox") == 3


async def test_an_event_older_than_the_window_is_refused(pg: asyncpg.Connection) -> None:
    now = datetime.now(UTC)
    # control: just inside the window is new
    assert await _reserve(pg, report(occurred_at=now - timedelta(seconds=3500))) is True
    with pytest.raises(ReplayTooOld):
        await _reserve(pg, report(occurred_at=now - timedelta(seconds=3700)))
    assert await pg.fetchval("SELECT count(*) FROM consumers.inbox") == 1


async def test_an_event_dated_past_the_prune_margin_ahead_is_refused(
    pg: asyncpg.Connection,
) -> None:
    """Its age is reckoned from its date: an event stamped further ahead than the inbox's prune
    margin would outlive its inbox row and its job's key, so it is refused, by reserve and by
    the batch statement alike (control: a producer's clock a minute ahead is admitted)."""
    now = datetime.now(UTC)
    assert await _reserve(pg, report(occurred_at=now + timedelta(seconds=60))) is True
    ahead = report(occurred_at=now + timedelta(seconds=PRUNE_MARGIN_S + 120))
    with pytest.raises(OccurredInFuture) as caught:
        await _reserve(pg, ahead)
    assert caught.value.fields["tolerance_s"] == PRUNE_MARGIN_S
    with pytest.raises(OccurredInFuture):
        async with pg.transaction():
            await reserve_many(pg, CONSUMER, [(ahead, Delivery(), CATALOG.digest(ahead))])
    assert await pg.fetchval("SELECT count(*) FROM consumers.inbox") == 1


async def test_an_old_redelivery_of_a_kept_row_is_still_a_duplicate(
    pg: asyncpg.Connection,
) -> None:
    event = report()
    assert await _reserve(pg, event) is True
    short = Consumer("report", CATALOG, replay_window_s=0.001)
    assert await _reserve(pg, event, consumer=short) is False


async def test_reserve_needs_a_transaction(pg: asyncpg.Connection) -> None:
    async with pg.transaction():  # control
        assert await reserve(pg, CONSUMER, report(), Delivery()) is True
    with pytest.raises(NotInTransaction):
        await reserve(pg, CONSUMER, report(), Delivery())


async def test_prune_deletes_expired_rows_in_bounded_batches(pg: asyncpg.Connection) -> None:
    for _ in range(5):
        assert await _reserve(pg, report()) is True
    fresh = report()
    assert await _reserve(pg, fresh) is True
    await pg.execute(
        "UPDATE consumers.inbox SET first_seen_at = now() - interval '3 days',"
        " occurred_at = now() - interval '3 days' WHERE operation_id <> $1",
        fresh.operation_id,
    )
    await pg.execute(
        "UPDATE consumers.deliveries SET received_at = now() - interval '3 days'"
        " WHERE operation_id <> $1",
        fresh.operation_id,
    )
    # control: nothing is pruned inside the window (plus margin)
    async with pg.transaction():
        assert await prune(pg, Consumer("report", CATALOG, 7 * 86400.0), limit=2) == (0, 0)
    async with pg.transaction():
        assert await prune(pg, Consumer("report", CATALOG, 86400.0), limit=2) == (2, 2)
    async with pg.transaction():
        assert await prune(pg, Consumer("report", CATALOG, 86400.0), limit=10) == (3, 3)
    assert await pg.fetchval("SELECT operation_id FROM consumers.inbox") == fresh.operation_id
    # the pruned operations are older than the window: a replay is refused, not new
    stale = report(occurred_at=datetime.now(UTC) - timedelta(days=3))
    with pytest.raises(ReplayTooOld):
        await _reserve(pg, stale, consumer=Consumer("report", CATALOG, 86400.0))


async def test_every_statement_prepares(pg: asyncpg.Connection) -> None:
    names = [n for n in dir(consumer_sql) if n.isupper()]
    assert names
    for name in names:
        await pg.prepare(getattr(consumer_sql, name))


async def _check_values(pg: asyncpg.Connection, constraint: str) -> set[str]:
    definition = await pg.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1", constraint
    )
    assert definition is not None
    return set(__import__("re").findall(r"'([a-z_]+)'::text", definition))


async def test_enums_mirror_check_constraints(pg: asyncpg.Connection) -> None:
    assert await _check_values(pg, "deliveries_outcome_check") == {str(o) for o in InboxOutcome}
    assert await _check_values(pg, "poison_reason_check") == {str(r) for r in PoisonReason}


async def test_collision_lookup_uses_the_unique_indexes(pg: asyncpg.Connection) -> None:
    await pg.execute(
        "INSERT INTO consumers.inbox (tenant, consumer, operation_id, event_id, digest,"
        " event_type, version, occurred_at)"
        " SELECT 'acme', 'report', 'op-' || i, gen_random_uuid(), repeat('a', 64),"
        " 'report.accepted', 1, now() FROM generate_series(1, 5000) AS i"
    )
    await pg.execute("ANALYZE consumers.inbox")
    query = (
        consumer_sql.COLLISIONS.replace("$1", "'acme'")
        .replace("$2", "'report'")
        .replace("$3", "'op-42'")
        .replace("$4", f"'{uuid.uuid4()}'::uuid")
    )
    plan = "\n".join(r[0] for r in await pg.fetch("EXPLAIN " + query))
    assert "inbox_pkey" in plan and "inbox_event_key" in plan, plan
    assert "Seq Scan" not in plan, plan


async def test_reserve_many_decides_each_message_like_reserve(pg: asyncpg.Connection) -> None:
    kept = report()
    assert await _reserve(pg, kept) is True
    a, b = report(), report()
    batch = [a, b, a, kept, b.model_copy(update={"event_id": uuid.uuid4()})]
    async with pg.transaction():
        decided = await reserve_many(
            pg,
            CONSUMER,
            [(e, Delivery(publish_id=str(i)), CATALOG.digest(e)) for i, e in enumerate(batch)],
        )
    # first arrivals are new; a repeat in the same batch and an applied one are duplicates
    assert decided == [True, True, False, False, False]
    assert await counts(pg) == {"new": 3, "duplicate": 3}
    logged = await pg.fetch("SELECT publish_id FROM consumers.deliveries WHERE outcome = 'new'")
    assert sorted(str(r["publish_id"]) for r in logged) == ["0", "1", "None"]
    changed = report(a.operation_id, subject="changed")
    with pytest.raises(InboxConflict):
        async with pg.transaction():
            await reserve_many(
                pg,
                CONSUMER,
                [
                    (report(), Delivery(), CATALOG.digest(report())),
                    (changed, Delivery(), CATALOG.digest(changed)),
                ],
            )
    stale = report(occurred_at=datetime.now(UTC) - timedelta(hours=2))
    with pytest.raises(ReplayTooOld):
        async with pg.transaction():
            await reserve_many(pg, CONSUMER, [(stale, Delivery(), CATALOG.digest(stale))])


async def test_reserve_many_credits_the_copy_whose_row_went_in(pg: asyncpg.Connection) -> None:
    """Two copies of one event in a batch, the first outside the replay window with other
    content, the second inside it: the second's row goes in, so the second is the new one
    and the first is refused (a conflict with the row now stored; alone, too old). Before,
    the first copy was credited with the second's row: its stale content applied as new
    under the other's digest, the recorded copy skipped as a duplicate."""
    fresh = report()
    old = datetime.now(UTC) - timedelta(hours=2)
    stale = report(fresh.operation_id, subject="stale", event_id=fresh.event_id, occurred_at=old)
    batch = [(e, Delivery(), CATALOG.digest(e)) for e in (stale, fresh)]
    with pytest.raises(InboxConflict) as refused:
        async with pg.transaction():
            await reserve_many(pg, CONSUMER, batch)
    assert refused.value.fields["stored_digest"] == CATALOG.digest(fresh)
    async with pg.transaction():  # control: the fresh copy alone is new
        assert await reserve_many(pg, CONSUMER, batch[1:]) == [True]
    assert await pg.fetchval("SELECT digest FROM consumers.inbox") == CATALOG.digest(fresh)
