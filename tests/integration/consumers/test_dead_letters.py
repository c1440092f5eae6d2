"""`accord dead-letters`: what a class's poison queue holds, and moving messages back, on the
real broker and the real consumer runtime (consumers/dead_letters.py)."""

from __future__ import annotations

import os
import sys

import aio_pika
import anyio
import asyncpg
import pytest

from accord import observe
from accord.cli import EXIT_TEMPFAIL
from accord.consumers import dead_letters
from accord.schemas.topology import Topology, WorkflowQueue
from tests.conftest import BrokerNames
from tests.integration.consumers.conftest import own
from tests.integration.consumers.support import (
    WORKFLOW,
    amqp_message,
    declare_topology,
    publish,
    publish_events,
    queue_depth,
    report,
    running,
    runtime_for,
    topology_for,
    wire_message,
)
from tests.support import wait_for

pytestmark = pytest.mark.timeout(90)


async def _exhaust(amqp_url: str, topo: Topology, limit: int) -> None:
    """Return the class queue's one message until the broker dead-letters it (delivery_limit):
    each return a get and a requeue, as a consumer restarted in a loop returns what it held."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(topo.queue(WORKFLOW), passive=True)
        for _ in range(limit + 1):
            message = await queue.get(no_ack=False, fail=False, timeout=5)
            assert message is not None
            await message.reject(requeue=True)
    finally:
        await connection.close()


async def _applied(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM public.effects") == n)


async def test_messages_the_broker_dead_lettered_are_listed_and_moved_back_once(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, broker_names: BrokerNames
) -> None:
    """Three messages reach the poison queue: ``applied`` (a copy of an event the consumer
    had applied) and ``lost`` (never applied) by the broker's delivery limit, with no poison
    record; ``refused`` (a version the catalog lacks) by the consumer, with its record. A list
    shows all three by their death's reason and moves none. Requeues (the first reading two
    of them: at most its limit) move the broker's two to the class queue, nothing else (the
    refused one is put back with its reason, each read once, and no other queue gets a copy):
    the runtime applies ``lost`` once and absorbs ``applied`` as a duplicate. A second
    requeue finds nothing of its reason."""
    # another class bound to the same event type: a move must not give it a copy
    other = WorkflowQueue("audit", ("report.accepted.v1",), 3)
    topo = own(
        broker_names, Topology(broker_names.prefix, (*topology_for("x", 3).workflows, other))
    )
    await declare_topology(amqp_url, topo)
    limit = topo.workflow(WORKFLOW).delivery_limit
    applied, lost = report(), report()
    async with running(runtime_for(amqp_url, pg_dsn, topo)) as first:
        await publish_events(amqp_url, topo, [applied])
        await wait_for(lambda: _applied(effects_pg, 1))
        refused = wire_message(report())
        bad = amqp_message(refused)
        bad.headers["ce-type"] = "report.accepted.v9"
        await publish(amqp_url, topo, [(refused.routing_key, bad)])
        await wait_for(lambda: _poisoned(effects_pg, 1))
    assert (first.stats.new, first.stats.poisoned) == (1, 1)
    for event in (applied, lost):  # nobody consuming: each returned past the limit
        await publish_events(amqp_url, topo, [event])
        await _exhaust(amqp_url, topo, limit)
    poison = topo.poison_queue(WORKFLOW)
    assert await queue_depth(amqp_url, poison) == 3
    assert await queue_depth(amqp_url, topo.queue("audit")) == 4  # its own copy of each

    seen = await dead_letters.look(amqp_url, topo, WORKFLOW, limit=100)
    assert (seen.held, seen.moved, seen.failed) == (3, [], [])
    assert [(d.message_id, d.reason) for d in seen.skipped] == [
        (refused.message_id, "rejected"),
        (str(applied.event_id), "delivery_limit"),
        (str(lost.event_id), "delivery_limit"),
    ]
    assert seen.skipped[1].tenant == applied.tenant
    assert seen.skipped[1].operation_id == applied.operation_id
    assert await queue_depth(amqp_url, poison) == 3  # a look moves nothing

    # At most --limit read, oldest first: the refused one is put back at the tail, the
    # next one moved; the second pass reads what the queue then holds, each once.
    first_pass = await dead_letters.move_back(
        amqp_url, topo, WORKFLOW, reason="delivery_limit", limit=2
    )
    assert [d.message_id for d in first_pass.skipped] == [refused.message_id]
    assert [d.message_id for d in first_pass.moved] == [str(applied.event_id)]
    moved = await dead_letters.move_back(
        amqp_url, topo, WORKFLOW, reason="delivery_limit", limit=100
    )
    assert moved.held == 2 and [d.message_id for d in moved.moved] == [str(lost.event_id)]
    assert [(d.message_id, d.reason) for d in moved.skipped] == [(refused.message_id, "rejected")]
    assert await queue_depth(amqp_url, poison) == 1
    assert await queue_depth(amqp_url, topo.queue(WORKFLOW)) == 2
    assert await queue_depth(amqp_url, topo.queue("audit")) == 4  # no copy of the moved
    async with running(runtime_for(amqp_url, pg_dsn, topo)) as second:
        await wait_for(lambda: _applied(effects_pg, 2))

        async def settled() -> bool:
            return second.stats.new + second.stats.duplicate == 2

        await wait_for(settled)
    assert (second.stats.new, second.stats.duplicate, second.stats.poisoned) == (1, 1, 0)
    rows = await effects_pg.fetch("SELECT operation_id FROM public.effects ORDER BY id")
    assert [r["operation_id"] for r in rows] == [applied.operation_id, lost.operation_id]
    again = await dead_letters.move_back(
        amqp_url, topo, WORKFLOW, reason="delivery_limit", limit=100
    )
    assert (again.held, again.moved, len(again.skipped)) == (1, [], 1)


async def _poisoned(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM consumers.poison") == n)


async def test_the_command_lists_and_requeues_by_the_application_s_topology(
    amqp_url: str, broker_names: object, topo: Topology
) -> None:
    """`accord dead-letters` through the demo application's topology under the test's prefix
    (its "report" class is the test topology's): the list prints the message and leaves it;
    a requeue of another reason keeps it; the default reason moves it (exit 0 each); an
    unknown class is refused before connecting; a broker that does not answer and a missing
    queue are one line each, naming what is wrong."""
    await declare_topology(amqp_url, topo)
    event = report()
    await publish_events(amqp_url, topo, [event])
    await _exhaust(amqp_url, topo, topo.workflow(WORKFLOW).delivery_limit)
    env = {
        **os.environ,
        "ACCORD_APP": "accord.demo:app",
        "ACCORD_AMQP_URL": amqp_url,
        "ACCORD_TOPOLOGY_PREFIX": topo.prefix,
    }

    async def run(*argv: str) -> tuple[int, str]:
        done = await anyio.run_process(
            [sys.executable, "-m", "accord", "dead-letters", *argv], env=env, check=False
        )
        return done.returncode, (done.stdout + done.stderr).decode()

    code, out = await run("list", "--workflow", WORKFLOW)
    assert code == 0, out
    assert f"held message_id={event.event_id} type=report.accepted.v1" in out
    assert "reason=delivery_limit" in out and "held=1 requeued=0 kept=1" in out
    code, out = await run("requeue", "--workflow", WORKFLOW, "--reason", "rejected")
    assert code == 0 and "requeued=0 kept=1" in out, out
    code, out = await run("requeue", "--workflow", WORKFLOW)
    assert code == 0 and f"requeued message_id={event.event_id}" in out, out
    assert await queue_depth(amqp_url, topo.queue(WORKFLOW)) == 1
    assert await queue_depth(amqp_url, topo.poison_queue(WORKFLOW)) == 0
    code, out = await run("list", "--workflow", "nope")
    assert code == 2 and "nope" in out, out
    # a broker that does not answer, and a class whose queues are missing: one line each
    env["ACCORD_AMQP_URL"] = "amqp://guest:guest@127.0.0.1:1/"
    code, out = await run("list", "--workflow", WORKFLOW)
    assert code == EXIT_TEMPFAIL and "accord: ServiceUnavailable" in out, out
    assert "Traceback" not in out, out
    env["ACCORD_AMQP_URL"], env["ACCORD_TOPOLOGY_PREFIX"] = amqp_url, topo.prefix + "-none"
    code, out = await run("list", "--workflow", WORKFLOW)
    assert code == 2 and f"queue='{topo.prefix}-none.wf.report'" in out, out


async def test_a_move_the_broker_refuses_leaves_the_message_in_the_poison_queue(
    amqp_url: str, topo: Topology
) -> None:
    """The message is acknowledged in the poison queue only after the broker confirmed its
    copy. Here the class queue refuses every publish (the test's own queue, declared again
    with no room and ``reject-publish``): the move reports it failed and the message stays
    where it was (control: the first test's move, confirmed, takes it out)."""
    await declare_topology(amqp_url, topo)
    event = report()
    await publish_events(amqp_url, topo, [event])
    await _exhaust(amqp_url, topo, topo.workflow(WORKFLOW).delivery_limit)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(topo.queue(WORKFLOW))
        await channel.declare_queue(
            topo.queue(WORKFLOW),
            durable=True,
            arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
        )
    finally:
        await connection.close()
    done = await dead_letters.move_back(amqp_url, topo, WORKFLOW, reason="delivery_limit", limit=10)
    assert done.moved == [] and [(d.message_id, why) for d, why in done.failed] == [
        (str(event.event_id), "DeliveryError")
    ]
    assert await queue_depth(amqp_url, topo.poison_queue(WORKFLOW)) == 1


async def test_a_running_consumer_counts_its_poison_queue_for_metrics(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    """``accord_consumer_poison_queue_messages``: the consumer counts its class's poison queue
    on a channel of its own, so what the broker dead-letters with no record shows on /metrics
    (the chaos run's loss showed nowhere). 0 while it is empty (control), then what the
    broker put there past the delivery limit, then what the consumer itself rejected too."""
    await declare_topology(amqp_url, topo)

    def depth() -> float | None:
        return observe.REGISTRY.get_sample_value(
            "accord_consumer_poison_queue_messages", {"consumer": WORKFLOW}
        )

    lost = report()
    await publish_events(amqp_url, topo, [lost])
    async with running(runtime_for(amqp_url, pg_dsn, topo, poison_depth_every_s=0.1)):

        async def counted(n: int) -> bool:
            return depth() == n

        await wait_for(lambda: counted(0))
        await wait_for(lambda: _applied(effects_pg, 1))
    await publish_events(amqp_url, topo, [lost])  # again, and nobody takes it in time
    await _exhaust(amqp_url, topo, topo.workflow(WORKFLOW).delivery_limit)
    async with running(runtime_for(amqp_url, pg_dsn, topo, poison_depth_every_s=0.1)):
        await wait_for(lambda: counted(1))
        refused = wire_message(report())
        bad = amqp_message(refused)
        bad.headers["ce-type"] = "report.accepted.v9"
        await publish(amqp_url, topo, [(refused.routing_key, bad)])
        await wait_for(lambda: counted(2))
