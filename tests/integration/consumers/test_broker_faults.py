"""The consumer when the broker takes its consumer or a lane's channel away (a review of the
consumer under broker faults, confirmed on a node of its own): it reconnects and consumes
again, and no sound message reaches the dead-letter queue without a poison record."""

from __future__ import annotations

from typing import Any

import aio_pika
import aiormq
import anyio
import asyncpg
import pytest

from accord.consumers import Handlers, PermanentFailure, TransientFailure, dead_letters
from accord.consumers import runtime as consumer_runtime
from accord.schemas.events import Event
from accord.schemas.topology import Topology
from tests.integration.consumers.support import (
    INSERT_EFFECT,
    WORKFLOW,
    amqp_message,
    declare_topology,
    publish,
    publish_events,
    queue_depth,
    report,
    running,
    runtime_for,
    wire_message,
)
from tests.support import wait_for

pytestmark = pytest.mark.timeout(120)


async def _applied(pg: asyncpg.Connection, prefix: str) -> int:
    like = f"{prefix}-%"
    sql = "SELECT count(DISTINCT operation_id) FROM public.effects WHERE operation_id LIKE $1"
    return int(await pg.fetchval(sql, like))


@pytest.mark.parametrize("declares", [True, False])
async def test_a_consumer_the_broker_cancels_reconnects_and_consumes_again(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology, declares: bool
) -> None:
    """The queue deleted under an idle consumer: the broker cancels its consumers. Before,
    the session went on with no consumer (nothing consumed again, /healthz ok); now the
    session ends, and the next one declares the queue again (or, declaring nothing, waits
    until whoever owns the topology has) and consumes what arrives."""
    await declare_topology(amqp_url, topo)
    runtime = runtime_for(amqp_url, pg_dsn, topo, declare=declares)
    async with running(runtime):
        await publish_events(amqp_url, topo, [report(f"a-{i}") for i in range(5)])

        async def first() -> bool:
            return await _applied(effects_pg, "a") == 5

        await wait_for(first)  # control
        connection = await aio_pika.connect(amqp_url)
        try:
            channel = await connection.channel()
            await channel.queue_delete(topo.queue(WORKFLOW))
        finally:
            await connection.close()

        if not declares:
            await anyio.sleep(1)  # sessions come and go, waiting for the queue
            assert runtime.sessions == 1
            await declare_topology(amqp_url, topo)

        async def again() -> bool:
            return runtime.sessions >= 2

        await wait_for(again, within=30)
        await publish_events(amqp_url, topo, [report(f"b-{i}") for i in range(5)])

        async def second() -> bool:
            return await _applied(effects_pg, "b") == 5

        await wait_for(second, within=30)


async def test_a_lane_s_channel_closed_by_the_broker_dead_letters_nothing(
    amqp_url: str,
    pg_dsn: str,
    effects_pg: asyncpg.Connection,
    topo: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One lane's channel closed by the broker (an ack of an unknown tag: 406) while the
    other lane consumes. Its messages go back to the queue and to the other lane, whose
    stream the ending session has closed: it nacked them with requeue, at once and again,
    each nack counted against the delivery limit (3 here), and sound messages reached the
    dead-letter queue with no poison record. Now they stay unacked until the channel closes
    (counted once) and every one is applied in the next session. The window is the
    session's teardown before its connection closes, made 3 s here (slow_to_close)."""
    lanes: list[Any] = []
    made = consumer_runtime.ConsumerRuntime._lane

    async def recorded(self: Any, connection: Any, streams: Any) -> Any:
        lane = await made(self, connection, streams)
        lanes.append(lane)
        return lane

    monkeypatch.setattr(consumer_runtime.ConsumerRuntime, "_lane", recorded)
    pools = consumer_runtime.create_pool

    async def slow_to_close(*args: Any, **kwargs: Any) -> Any:
        return _SlowToClose(await pools(*args, **kwargs))

    monkeypatch.setattr(consumer_runtime, "create_pool", slow_to_close)
    handlers = Handlers(WORKFLOW)

    @handlers.on("report.accepted", 1)
    async def slow(tx: Any, event: Event) -> None:
        await anyio.sleep(0.02)
        await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

    await declare_topology(amqp_url, topo)
    total = 300
    await publish_events(amqp_url, topo, [report(f"c-{i}") for i in range(total)])
    runtime = runtime_for(
        amqp_url, pg_dsn, topo, handlers=handlers, batch_max=8, prefetch=32, concurrency=2
    )
    async with running(runtime):

        async def started() -> bool:
            return await _applied(effects_pg, "c") >= 30

        await wait_for(started)
        underlay = await lanes[0].channel.get_underlay_channel()
        await underlay.basic_ack(10**6)  # the broker closes this channel: PRECONDITION_FAILED

        async def settled() -> bool:
            dead = await queue_depth(amqp_url, topo.poison_queue(WORKFLOW))
            return await _applied(effects_pg, "c") + dead >= total

        await wait_for(settled, within=60)
        assert runtime.sessions >= 2
    assert await queue_depth(amqp_url, topo.poison_queue(WORKFLOW)) == 0
    assert await _applied(effects_pg, "c") == total
    assert await effects_pg.fetchval("SELECT count(*) FROM consumers.poison") == 0


class _SlowToClose:
    """A session's pool whose close takes 3 s (a backend slow to end its transaction: the
    runtime gives it up to 5): the window in which the broker connection is still open."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    async def close(self) -> None:
        await anyio.sleep(3)
        await self._pool.close()


async def test_a_delivery_to_a_closed_lane_is_left_unacked_not_requeued() -> None:
    """The rule under the scenario above, where its timing is the broker's: a delivery that
    reaches a lane whose stream the ending session closed is left to the channel's close
    (one return), never nacked with requeue (before: at once to the same lane, and again,
    each counted against the delivery limit). Control: an open lane takes it."""
    nacked: list[bool] = []

    class Delivery:
        async def nack(self, requeue: bool = True) -> None:
            nacked.append(requeue)

    send, receive = anyio.create_memory_object_stream[Any](max_buffer_size=4)
    lane = consumer_runtime._Lane(channel=None, queue=None, send=send, receive=receive)  # type: ignore[arg-type]
    await lane._feed(Delivery())  # type: ignore[arg-type]
    assert receive.receive_nowait() is not None and nacked == []  # control
    receive.close()  # the session ends: its worker's stream is gone
    await lane._feed(Delivery())  # type: ignore[arg-type]
    send.close()
    await lane._feed(Delivery())  # type: ignore[arg-type]
    assert nacked == []


async def test_a_reject_lost_after_its_poison_record_writes_no_second_record(
    amqp_url: str,
    pg_dsn: str,
    pg: asyncpg.Connection,
    topo: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The poison record commits, then the reject is lost with its channel: the broker
    returns the message, redelivered, and the consumer decides it again. Before, a second
    record was written for the one message the poison queue then held; now the redelivery
    finds the first record (the same life: publish id, body, message id, move id) and is only
    rejected. Controls: the copy `accord dead-letters` moves back, retried once and so
    redelivered before its decision, is a new life with a record of its own (its move id);
    the same message published afresh gets one too."""
    handlers = Handlers(WORKFLOW)
    verdicts = [PermanentFailure, PermanentFailure, TransientFailure, PermanentFailure]

    @handlers.on("report.accepted", 1)
    async def judge(tx: Any, event: Event) -> None:
        raise (verdicts.pop(0) if verdicts else PermanentFailure)("judged")

    rejects: list[tuple[bool, bool]] = []
    reject = aio_pika.IncomingMessage.reject

    async def lost_once(self: aio_pika.IncomingMessage, requeue: bool = False) -> None:
        rejects.append((self.redelivered, requeue))
        if len(rejects) == 1:  # the channel goes with the reject: the broker returns it
            await self.channel.close()
            raise aiormq.exceptions.ChannelInvalidStateError("the channel closed")
        await reject(self, requeue=requeue)

    monkeypatch.setattr(aio_pika.IncomingMessage, "reject", lost_once)
    await declare_topology(amqp_url, topo)
    event = report("refused")
    message = wire_message(event)
    poison_queue = topo.poison_queue(WORKFLOW)
    runtime = runtime_for(amqp_url, pg_dsn, topo, handlers=handlers, retry_backoff_s=0)
    records = (
        "SELECT redelivered, move_id IS NOT NULL AS moved FROM consumers.poison"
        " WHERE operation_id = $1 ORDER BY id"
    )

    async def recorded() -> list[tuple[bool, bool]]:
        return [(r["redelivered"], r["moved"]) for r in await pg.fetch(records, "refused")]

    async def dead(n: int) -> bool:
        return await queue_depth(amqp_url, poison_queue) == n

    async with running(runtime):
        await publish(amqp_url, topo, [(event.ce_type, amqp_message(message))])
        await wait_for(lambda: dead(1), within=30)
        assert rejects == [(False, False), (True, False)]  # decided twice, rejected again
        assert await recorded() == [(False, False)]

        # Control: moved back; a retry redelivers the copy before it is decided again.
        moved = await dead_letters.move_back(amqp_url, topo, WORKFLOW, reason="rejected", limit=10)
        assert len(moved.moved) == 1
        await wait_for(lambda: dead(1), within=30)
        await wait_for(lambda: _rows(recorded, 2), within=30)
        assert await recorded() == [(False, False), (True, True)]

        # Control: the same message published afresh is decided and recorded anew.
        await publish(amqp_url, topo, [(event.ce_type, amqp_message(message))])
        await wait_for(lambda: dead(2), within=30)
        assert await recorded() == [(False, False), (True, True), (False, False)]


async def _rows(read: Any, n: int) -> bool:
    return len(await read()) == n
