"""Poison records leave after their own retention (consumers.prune_poison, migrations 0023
and 0026), in bounded batches, through the function only: the consumer role cannot delete one
at will. Each consumer prunes only its own inbox rows, delivery log and poison records, by its
own window: one with a shorter window never removes what a longer one still promises."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import asyncpg
import pytest

from accord.consumers import Consumer, Delivery, RuntimeConfig, inbox, sql
from accord.consumers.errors import ReplayTooOld
from accord.schemas.errors import ConfigError, RetentionTooShort
from accord.schemas.topology import Topology
from tests.integration.consumers.support import CATALOG, WORKFLOW, report, running, runtime_for
from tests.support import LAPSED, wait_for

DAY = 86400.0
INSERT = (
    "INSERT INTO consumers.poison (consumer, queue, reason, redelivered, delivery_count,"
    " headers, body_size, body_sha256, created_at)"
    " VALUES ($2, 'q', 'malformed', false, 0, '{}', 0, repeat('0', 64),"
    " now() - make_interval(secs => $1)) RETURNING id"
)
AGE_INBOX = (
    "UPDATE consumers.inbox SET first_seen_at = now() - make_interval(secs => $1),"
    " occurred_at = now() - make_interval(secs => $1)"
)
AGE_DELIVERIES = "UPDATE consumers.deliveries SET received_at = now() - make_interval(secs => $1)"


async def test_poison_records_leave_after_their_retention_in_bounded_batches(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    old = [await pg.fetchval(INSERT, 31 * DAY + n, "report") for n in range(5)]
    young = await pg.fetchval(INSERT, 29 * DAY, "report")
    others = await pg.fetchval(INSERT, 31 * DAY, "ledger")  # another consumer's, as old
    consumer = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        # control: the consumer role cannot remove a poison record by plain SQL
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await consumer.execute("DELETE FROM consumers.poison WHERE id = $1", old[0])
        async with consumer.transaction():
            assert await inbox.prune_poison(consumer, "report", retention_s=40 * DAY) == 0
        batches = []
        for _ in range(3):
            async with consumer.transaction():
                batches.append(
                    await inbox.prune_poison(consumer, "report", retention_s=30 * DAY, limit=2)
                )
        assert batches == [2, 2, 1]
    finally:
        await consumer.close()
    kept = {r[0] for r in await pg.fetch("SELECT id FROM consumers.poison")}
    assert kept == {young, others}


async def test_a_poison_retention_inside_its_consumer_s_declared_horizon_is_refused(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    old = await pg.fetchval(INSERT, 8 * DAY, "report")
    consumer = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        await inbox.declare_window(consumer, Consumer("report", CATALOG, 7 * DAY))
        await inbox.declare_window(consumer, Consumer("ledger", CATALOG, 30 * DAY))
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # only through the function
            await consumer.execute("DELETE FROM consumers.replay_windows")
        horizon = 7 * DAY + inbox.PRUNE_MARGIN_S
        with pytest.raises(RetentionTooShort) as caught:
            async with consumer.transaction():
                await inbox.prune_poison(consumer, "report", retention_s=horizon - 1)
        assert (caught.value.consumer, caught.value.horizon_s) == ("report", horizon)
        assert await pg.fetchval("SELECT count(*) FROM consumers.poison") == 1  # kept
        # control: its own horizon is enough; another consumer's longer window is its own
        async with consumer.transaction():
            assert await inbox.prune_poison(consumer, "report", retention_s=horizon) == 1
    finally:
        await consumer.close()
    assert await pg.fetchval("SELECT count(*) FROM consumers.poison WHERE id = $1", old) == 0


def test_a_runtime_config_refuses_a_poison_retention_inside_its_horizon() -> None:
    RuntimeConfig(WORKFLOW, frozenset({"*"}), replay_window_s=DAY, poison_retention_s=DAY + 300)
    with pytest.raises(ConfigError, match="shorter than the replay horizon"):
        RuntimeConfig(WORKFLOW, frozenset({"*"}), replay_window_s=DAY, poison_retention_s=DAY)


async def test_each_consumer_prunes_only_its_own_rows_by_its_own_window(
    pg: asyncpg.Connection,
) -> None:
    longer = Consumer("ledger", CATALOG, replay_window_s=30 * DAY)
    shorter = Consumer(WORKFLOW, CATALOG, replay_window_s=7 * DAY)
    event = report()
    for consumer in (longer, shorter):
        async with pg.transaction():
            assert await inbox.reserve(pg, consumer, event, Delivery())
    await pg.execute(AGE_INBOX, 10 * DAY)
    await pg.execute(AGE_DELIVERIES, 10 * DAY)
    async with pg.transaction():  # control: the shorter window's own rows are past it
        assert await inbox.prune(pg, shorter) == (1, 1)
    async with pg.transaction():  # the longer window's rows are within it: kept
        assert await inbox.prune(pg, longer) == (0, 0)
    assert [r[0] for r in await pg.fetch("SELECT consumer FROM consumers.inbox")] == ["ledger"]
    assert [r[0] for r in await pg.fetch("SELECT consumer FROM consumers.deliveries")] == ["ledger"]
    async with pg.transaction():  # so a redelivery the longer window promises is absorbed
        assert not await inbox.reserve(pg, longer, event, Delivery(redelivered=True))
    async with pg.transaction():  # one consumer's expired rows, by the index leading with it
        await pg.execute("SET LOCAL enable_seqscan = off")  # the table is tiny here
        plan = "\n".join(
            r[0] for r in await pg.fetch("EXPLAIN " + sql.PRUNE_INBOX, DAY, 10, WORKFLOW)
        )
    assert (
        "inbox_retention_idx" in plan
        and "Index Cond: ((consumer = 'report'::text) AND (GREATEST(" in plan
    ), plan


async def test_processes_of_one_consumer_with_different_windows_keep_what_any_admits(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """Two processes of one consumer, one with a week's window and one with a day's (a canary,
    a rolling deploy), each declaring at every start and reconnect: however the declarations
    alternate, no process prunes an inbox row that a process still admits a redelivery for,
    and each admits no event older than the declared window."""
    week = Consumer(WORKFLOW, CATALOG, replay_window_s=7 * DAY)
    day = Consumer(WORKFLOW, CATALOG, replay_window_s=DAY)
    three_days_ago = datetime.now(UTC) - timedelta(days=3)
    first, unseen = report(occurred_at=three_days_ago), report(occurred_at=three_days_ago)
    conn = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        await inbox.declare_window(conn, week)
        async with conn.transaction():
            assert await inbox.reserve(conn, week, first, Delivery())  # within the week
        await pg.execute(AGE_INBOX, 2 * DAY)  # seen two days ago
        await pg.execute(AGE_DELIVERIES, 2 * DAY)  # its delivery logged then
        await inbox.declare_window(conn, day)  # the day's process reconnects: it lowers
        # The day's window now bounds what the week's process admits: a three-day-old event
        # never seen is refused as too old, naming the window applied.
        with pytest.raises(ReplayTooOld) as caught:
            async with conn.transaction():
                await inbox.reserve(conn, week, unseen, Delivery())
        assert caught.value.fields["window_s"] == DAY
        # But the week promised to keep what it admitted: the day's process keeps the row,
        # and its delivery log (before, it trimmed the log by its own horizon).
        async with conn.transaction():
            assert await inbox.prune(conn, day) == (0, 0)
        await inbox.declare_window(conn, week)  # the week's process reconnects
        async with conn.transaction():  # and its redelivery is absorbed, not new
            assert not await inbox.reserve(conn, week, first, Delivery(redelivered=True))
        await inbox.declare_window(conn, day)  # and again: the longer horizon still holds
        async with conn.transaction():
            assert (await inbox.prune(conn, day))[0] == 0
        # control: once the week it replaced has run out since the lowering, the day's
        # process prunes by its own horizon
        await pg.execute(LAPSED)
        async with conn.transaction():
            assert await inbox.prune(conn, day) == (1, 1)
    finally:
        await conn.close()


async def test_the_consumer_runtime_prunes_old_poison_with_its_inbox(
    amqp_url: str, pg_dsn: str, pg: asyncpg.Connection, topo: Topology
) -> None:
    old = await pg.fetchval(INSERT, 31 * DAY, WORKFLOW)
    young = await pg.fetchval(INSERT, 29 * DAY, WORKFLOW)
    async with pg.transaction():  # an inbox row past the window shows the prune loop ran
        consumer = Consumer(WORKFLOW, CATALOG, replay_window_s=7 * DAY)
        assert await inbox.reserve(pg, consumer, report(), Delivery())
    await pg.execute(AGE_INBOX, 8 * DAY)
    keeping = runtime_for(amqp_url, pg_dsn, topo)  # control: no poison retention, none pruned
    async with running(keeping):

        async def inbox_pruned() -> bool:
            return await pg.fetchval("SELECT count(*) FROM consumers.inbox") == 0

        await wait_for(inbox_pruned, within=20)
        declared = await pg.fetchrow(
            "SELECT replay_window_s, margin_s FROM consumers.replay_windows WHERE consumer = $1",
            WORKFLOW,
        )
        assert tuple(declared) == (keeping.config.replay_window_s, inbox.PRUNE_MARGIN_S)
    assert await pg.fetchval("SELECT count(*) FROM consumers.poison") == 2
    async with running(runtime_for(amqp_url, pg_dsn, topo, poison_retention_s=30 * DAY)):

        async def pruned() -> bool:
            return (
                await pg.fetchval("SELECT count(*) FROM consumers.poison WHERE id = $1", old) == 0
            )

        await wait_for(pruned, within=20)
    assert [r[0] for r in await pg.fetch("SELECT id FROM consumers.poison")] == [young]


HORIZON = "SELECT horizon_s FROM consumers.replay_horizons WHERE consumer = $1"
PROMISES = (
    "SELECT horizon_s, until > now() + interval '2 hours' AS long"
    " FROM consumers.replay_promises ORDER BY horizon_s"
)


async def test_an_old_promise_lapses_at_its_own_end_however_declarations_alternate(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """A month's canary came and went; a week's and a day's processes keep alternating. The
    week is promised again at each lowering, the month is not renewed: it lapses at its end."""
    m = inbox.PRUNE_MARGIN_S
    conn = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        for days in (30, 1):
            await inbox.declare_window(conn, Consumer(WORKFLOW, CATALOG, days * DAY))
        # a month later, less an hour
        await pg.execute("UPDATE consumers.replay_promises SET until = now() + interval '1 hour'")
        for days in (7, 1, 7, 1):
            await inbox.declare_window(conn, Consumer(WORKFLOW, CATALOG, days * DAY))
        promises = [tuple(r) for r in await pg.fetch(PROMISES)]
        assert promises == [(7 * DAY + m, True), (30 * DAY + m, False)]  # the month not renewed
        assert await pg.fetchval(HORIZON, WORKFLOW) == 30 * DAY + m  # control: still in force
        await pg.execute(
            "UPDATE consumers.replay_promises SET until = now() - interval '1 second'"
            " WHERE horizon_s > $1",
            8 * DAY,
        )  # the hour passed
        assert await pg.fetchval(HORIZON, WORKFLOW) == 7 * DAY + m
    finally:
        await conn.close()


async def test_two_first_declarations_at_once_keep_the_longer_one_promised(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    first = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    second = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        tx = first.transaction()
        await tx.start()
        await inbox.declare_window(first, Consumer(WORKFLOW, CATALOG, 7 * DAY))
        async with anyio.create_task_group() as tg:
            tg.start_soon(inbox.declare_window, second, Consumer(WORKFLOW, CATALOG, DAY))

            async def waiting() -> bool:  # the second waits on the first's row
                return bool(
                    await pg.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE '%declare_window%'"
                    )
                )

            await wait_for(waiting, within=10)
            await tx.commit()
        assert await pg.fetchval(HORIZON, WORKFLOW) == 7 * DAY + inbox.PRUNE_MARGIN_S
        assert (
            await pg.fetchval(
                "SELECT replay_window_s FROM consumers.replay_windows WHERE consumer = $1", WORKFLOW
            )
            == DAY
        )  # the last declaration stands
    finally:
        await first.close()
        await second.close()


async def test_a_raised_window_admits_nothing_its_inbox_may_have_forgotten(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """A consumer's window raised from a day to a week: an event three days old, whose inbox
    row the day's pruner may already have removed, is refused as too old (before, it was
    reserved as new and its work ran twice), by reserve and by a batch's reserve_many alike;
    one half a day old is admitted (control). As time passes admission grows into the week:
    three days after the raise the same event is admitted. Control: a consumer that declared
    the week from the start admits it at once."""
    day, week = Consumer(WORKFLOW, CATALOG, DAY), Consumer(WORKFLOW, CATALOG, 7 * DAY)
    ago = lambda days: datetime.now(UTC) - timedelta(days=days)  # noqa: E731
    old, recent = report(occurred_at=ago(3)), report(occurred_at=ago(0.5))
    conn = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        await inbox.declare_window(conn, day)
        await inbox.declare_window(conn, week)  # raised
        with pytest.raises(ReplayTooOld):
            async with conn.transaction():
                await inbox.reserve(conn, week, old, Delivery())
        batch = [(e, Delivery(), CATALOG.digest(e)) for e in (old, recent)]
        with pytest.raises(ReplayTooOld):  # the batch's old one, judged by reserve
            async with conn.transaction():
                await inbox.reserve_many(conn, week, batch)
        async with conn.transaction():
            assert await inbox.reserve(conn, week, recent, Delivery())
        await pg.execute(  # three days pass
            "UPDATE consumers.replay_windows SET admit_from = admit_from - interval '3 days'"
        )
        async with conn.transaction():
            assert await inbox.reserve(conn, week, old, Delivery())
        await inbox.declare_window(conn, week)  # unchanged: the floor stays where it is
        await inbox.declare_window(conn, day)  # lowered, raised again: no older floor
        await inbox.declare_window(conn, week)
        floor = await pg.fetchval("SELECT admit_from FROM consumers.replay_windows")
        assert ago(1.01) < floor < ago(0.99)
        await pg.execute("DELETE FROM consumers.replay_windows")
        await pg.execute("DELETE FROM consumers.inbox")
        await inbox.declare_window(conn, week)  # control: the week from the start
        async with conn.transaction():
            assert await inbox.reserve(conn, week, old, Delivery())
    finally:
        await conn.close()
