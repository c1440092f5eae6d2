"""The relay's claim and settle on real PostgreSQL: SKIP LOCKED, the lease token, in-flight.

Each test shows the allowed case beside the refused one: a claim takes rows nobody holds and
never waits for rows another claim holds; only the current lease token settles a row; the
relay never has more than ``in_flight`` publishes awaiting a confirm.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import asyncpg
import pytest

from accord.relay import Relay, outbox
from accord.relay.errors import PublishRefused
from accord.relay.outbox import OutboxState, Settlement
from accord.schemas.topology import Topology
from accord.schemas.wire import WireMessage
from tests.integration.relay import helpers


async def test_a_claim_skips_rows_another_claim_holds_instead_of_waiting(pg_dsn: str) -> None:
    ids = set(await helpers.enqueue_outbox_ids(pg_dsn, [helpers.make_event(n) for n in range(6)]))
    holder = await asyncpg.connect(pg_dsn)
    other = await asyncpg.connect(pg_dsn)
    try:
        tx = holder.transaction()
        await tx.start()  # the holder's claim keeps its row locks until it commits
        held = {row.id for row in await outbox.claim(holder, uuid.uuid4(), 2, 30.0)}
        assert len(held) == 2
        with anyio.fail_after(5):  # FOR UPDATE without SKIP LOCKED would wait for the holder
            async with other.transaction():
                got = {row.id for row in await outbox.claim(other, uuid.uuid4(), 10, 30.0)}
        assert got == ids - held
        await tx.commit()
        async with other.transaction():  # leased by their claims now: nothing left to take
            assert await outbox.claim(other, uuid.uuid4(), 10, 30.0) == []
    finally:
        await holder.close()
        await other.close()


async def test_only_the_current_lease_token_settles_a_row(pg_dsn: str) -> None:
    """A relay whose lease expired (token A) settles after another relay re-claimed the row
    (token B): A's settle changes nothing, the row stays pending under B, and B's settles it."""
    [row_id] = await helpers.enqueue_outbox_ids(pg_dsn, [helpers.make_event(1)])
    conn = await asyncpg.connect(pg_dsn)
    try:
        stale, current = uuid.uuid4(), uuid.uuid4()
        async with conn.transaction():
            assert [r.id for r in await outbox.claim(conn, stale, 10, 0.2)] == [row_id]
        await anyio.sleep(0.4)  # the database clock passes the 0.2 s lease
        async with conn.transaction():
            assert [r.id for r in await outbox.claim(conn, current, 10, 30.0)] == [row_id]
        done = [Settlement(row_id, OutboxState.PUBLISHED, publish_id=uuid.uuid4())]
        async with conn.transaction():
            assert await outbox.settle(conn, stale, done) == 0
        row = await conn.fetchrow(
            "SELECT state, lease_token FROM relay.outbox WHERE id = $1", row_id
        )
        assert (row["state"], row["lease_token"]) == ("pending", current)
        async with conn.transaction():  # control: the holder of the lease settles it
            assert await outbox.settle(conn, current, done) == 1
        assert await conn.fetchval("SELECT state FROM relay.outbox WHERE id = $1", row_id) == (
            "published"
        )
    finally:
        await conn.close()


class CountingPublisher:
    """A recording double at the broker seam: confirms after a short delay and records how
    many publishes were awaiting a confirm at once."""

    def __init__(self) -> None:
        self.awaiting = 0
        self.peak = 0
        self.confirmed: list[str] = []

    async def publish(self, message: WireMessage, *, confirm_timeout_s: float) -> None:
        self.awaiting += 1
        self.peak = max(self.peak, self.awaiting)
        try:
            await anyio.sleep(0.01)
        finally:
            self.awaiting -= 1
        self.confirmed.append(message.message_id)

    def broken(self) -> bool:
        return False

    async def writable(self) -> None:
        return None


async def test_the_relay_never_has_more_than_in_flight_publishes_awaiting_a_confirm(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    events = [helpers.make_event(n) for n in range(120)]
    await helpers.enqueue_committed(pg_dsn, events)
    double = CountingPublisher()

    @asynccontextmanager
    async def factory() -> AsyncIterator[CountingPublisher]:
        yield double

    relay = Relay(
        helpers.config(pg_dsn, amqp_url, topo, in_flight=8, batch=50, loops=2, poll_s=0.05),
        publisher=factory,
    )
    assert relay.config.claim_size == 4  # two loops share the eight
    await helpers.run_until_settled([relay], pg_dsn, len(events), within_s=30)
    assert sorted(double.confirmed) == sorted(str(e.event_id) for e in events)
    # pipelined (more than one confirm awaited at once), and never past the bound
    assert 1 < double.peak <= 8, double.peak


class RefusingPublisher:
    """A double at the broker seam: the first publish waits until a second one is in flight
    (the other loop's), then is refused (PublishRefused, as for a user without write
    permission); every other publish is confirmed after ``confirm_s``."""

    def __init__(self, confirm_s: float = 0.5) -> None:
        self.confirm_s = confirm_s
        self.calls = 0
        self.second = anyio.Event()
        self.confirmed: list[str] = []

    async def publish(self, message: WireMessage, *, confirm_timeout_s: float) -> None:
        self.calls += 1
        if self.calls == 1:
            await self.second.wait()
            raise PublishRefused("refused", exchange="x", detail="ACCESS_REFUSED")
        self.second.set()
        await anyio.sleep(self.confirm_s)
        self.confirmed.append(message.message_id)

    def broken(self) -> bool:
        return False

    async def writable(self) -> None:
        return None


async def test_a_refused_publish_stops_the_relay_after_every_loop_settled(pg_dsn: str) -> None:
    """Two loops, each with a batch of one in flight; the broker refuses one publish (a user
    without write permission). The relay stops as on SIGTERM and raises the refusal only
    once every loop settled: the refused row pending with its reason, the other loop's
    publish confirmed and settled published (control: it was allowed to finish), no row
    left leased to wait out its lease. Before, the first loop raised as soon as its own
    batch was settled, cancelling the other's publish mid-flight and leaving its row
    leased."""
    await helpers.enqueue_committed(pg_dsn, [helpers.make_event(n) for n in range(4)])
    double = RefusingPublisher()

    @asynccontextmanager
    async def factory() -> AsyncIterator[RefusingPublisher]:
        yield double

    topo = Topology("unused")  # nothing reaches a broker: the double is the seam
    relay = Relay(
        helpers.config(pg_dsn, "amqp://unused", topo, in_flight=2, loops=2, poll_s=0.05),
        publisher=factory,
    )
    assert relay.config.claim_size == 1
    with anyio.fail_after(20), pytest.raises(ExceptionGroup) as raised:
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
    refused, rest = raised.value.split(PublishRefused)
    assert refused is not None and rest is None  # the refusal alone
    assert len(double.confirmed) == 1
    rows = await helpers.pg_value(
        pg_dsn,
        "SELECT string_agg(state || '/' || coalesce(last_reason, '-') || '/'"
        " || (lease_token IS NOT NULL)::text, ' ' ORDER BY id) FROM relay.outbox",
    )
    states = sorted(str(rows).split())
    assert states == sorted(["pending/access_refused/false", "published/-/false",
                             "pending/-/false", "pending/-/false"]), rows  # fmt: skip


class StallingPublisher:
    """A double at the broker seam whose confirm comes only after ``stall_s``, during which
    another relay claims the batch's rows (their lease ran out): a stalled relay."""

    def __init__(self, pg_dsn: str, stall_s: float) -> None:
        self.pg_dsn, self.stall_s = pg_dsn, stall_s
        self.taken: list[int] = []

    async def publish(self, message: WireMessage, *, confirm_timeout_s: float) -> None:
        if not self.stall_s:
            return
        await anyio.sleep(self.stall_s)
        other = await asyncpg.connect(self.pg_dsn)
        try:
            self.taken += [row.id for row in await outbox.claim(other, uuid.uuid4(), 10, 30.0)]
        finally:
            await other.close()

    def broken(self) -> bool:
        return False

    async def writable(self) -> None:
        return None


async def test_a_settle_that_lost_its_lease_is_counted_and_named(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay whose lease ran out while its publish was in flight finds, at its settle,
    that another relay claimed the row: the token guard changes nothing (the row stays
    pending under the other's lease, to be published again), and the relay counts the lost
    settle and logs what to raise, instead of nothing. Control: a prompt publish settles
    its row and counts no loss."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        config = helpers.config(
            pg_dsn, "amqp://unused", Topology("unused"), lease_s=0.5, publish_timeout_s=0.4
        )
        prompt = Relay(config)
        await helpers.enqueue_committed(pg_dsn, [helpers.make_event(1)])
        assert await prompt.cycle(conn, StallingPublisher(pg_dsn, 0.0)) == 1
        assert (prompt.stats.published, prompt.stats.settle_lost) == (1, 0)

        [row_id] = await helpers.enqueue_outbox_ids(pg_dsn, [helpers.make_event(2)])
        stalled, double = Relay(config), StallingPublisher(pg_dsn, 0.7)
        assert await stalled.cycle(conn, double) == 1
        assert double.taken == [row_id]
        assert stalled.stats.settle_lost == 1
        row = await conn.fetchrow(
            "SELECT state, lease_token IS NOT NULL AS leased FROM relay.outbox WHERE id = $1",
            row_id,
        )
        assert (row["state"], row["leased"]) == ("pending", True)  # the other relay's now
        assert any("ACCORD_RELAY_LEASE_S" in r.getMessage() for r in caplog.records)
    finally:
        await conn.close()
