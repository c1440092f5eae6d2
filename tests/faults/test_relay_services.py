"""The relay when its services misbehave without going away: PostgreSQL cuts its
connections, the broker refuses a message as too large, stops confirming, or closes the
connection under a publish in flight.

Each test first shows the allowed control (an event publishes), then the fault, then that
nothing committed was lost and, where a publish failed, that the row recorded the typed
reason in PostgreSQL. Every test here runs on a private RabbitMQ node (tests/rabbit_node.py),
whose settings they change and put back between tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import asyncpg
import pytest

from accord.relay import Relay
from accord.schemas.events import Event
from accord.schemas.topology import Topology
from tests.integration.relay import helpers
from tests.rabbit_node import RabbitNode
from tests.support import wait_for

# The relay's backends in the test's database (every client backend but the one asking).
OTHERS = (
    "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend'"
)


@pytest.fixture(scope="module")
def amqp_url(rabbit_node: RabbitNode) -> str:
    """The module's private node instead of the shared broker (broker_names and topo follow)."""
    return rabbit_node.url


@pytest.fixture
async def topo(amqp_url: str, broker_names: object) -> Topology:
    return await helpers.declare_demo(amqp_url, broker_names)


TEST_MAX_MESSAGE_SIZE, ALARM_WATERMARK = "1024", "0.0000001"


async def broker_eval(node: RabbitNode, expression: str) -> str:
    """Evaluate an Erlang expression on the private node (rabbitmqctl eval)."""
    return await anyio.to_thread.run_sync(node.eval, expression)


@pytest.fixture(scope="module")
def node_defaults(rabbit_node: RabbitNode) -> tuple[str, str]:
    """The fresh node's message size limit and memory watermark (Erlang terms)."""
    size = rabbit_node.eval("{ok, V} = application:get_env(rabbit, max_message_size), V.")
    return size, rabbit_node.eval("vm_memory_monitor:get_vm_memory_high_watermark().")


@pytest.fixture
async def broker_settings(
    rabbit_node: RabbitNode, node_defaults: tuple[str, str]
) -> AsyncIterator[str]:
    """Put back the node's message size limit and memory watermark for the module's next
    test, whatever happened; yields the watermark's Erlang term."""
    size, watermark = node_defaults
    yield watermark
    await broker_eval(
        rabbit_node,
        f"application:set_env(rabbit, max_message_size, {size}),"
        f" vm_memory_monitor:set_vm_memory_high_watermark({watermark}).",
    )


async def set_watermark(node: RabbitNode, term: str) -> None:
    """Set the node's memory high watermark (ALARM_WATERMARK blocks every publisher)."""
    await broker_eval(node, f"vm_memory_monitor:set_vm_memory_high_watermark({term}).")


async def _true(value: bool) -> bool:
    return value


async def failed_with(relay: Relay, dsn: str, event: Event, reason: str, times: int) -> None:
    """Wait until the relay counted ``times`` publish failures for ``reason``; the event's row
    is then still pending and keeps that reason and its attempts."""

    async def recorded() -> bool:
        # The relay counts a failure before its settle commits: wait for the row too.
        if relay.stats.failures.get(reason, 0) < times:
            return False
        row = await helpers.fetch_row(dsn, event.event_id)
        return bool(row["last_reason"] == reason and row["attempts"] >= times)

    await wait_for(recorded, within=30)
    row = await helpers.fetch_row(dsn, event.event_id)
    assert row["state"] == "pending" and row["published_at"] is None


@pytest.mark.timeout(120)
async def test_postgresql_cutting_the_relays_connections_loses_nothing(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, batch=20, poll_s=0.05))
    admin = await asyncpg.connect(pg_dsn)
    ids = []

    async def relay_connected() -> bool:
        return bool(await admin.fetchval(f"SELECT count(*) {OTHERS}"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        ids += await helpers.enqueue_committed(pg_dsn, [helpers.make_event(0)])
        await helpers.wait_until_settled(pg_dsn, expect_published=1, within_s=20)  # control
        for cut in range(3):
            batch = [helpers.make_event(n) for n in range(1 + cut * 100, 1 + (cut + 1) * 100)]
            ids += await helpers.enqueue_committed(pg_dsn, batch)
            await wait_for(relay_connected, within=20, every=0.02)  # back after the last cut
            await admin.execute(f"SELECT pg_terminate_backend(pid) {OTHERS}")
        await helpers.wait_until_settled(pg_dsn, expect_published=len(ids), within_s=60)
        relay.stop()
    await admin.close()
    assert relay.stats.reconnects >= 1  # the cuts really reached the relay
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(i) for i in ids}


@pytest.mark.timeout(120)
async def test_a_message_over_the_brokers_limit_is_held_and_never_blocks_the_rows_behind(
    pg_dsn: str, amqp_url: str, topo: Topology, rabbit_node: RabbitNode, broker_settings: str
) -> None:
    # A limit the relay learns only from the broker (it opens its channel after this).
    await broker_eval(
        rabbit_node, f"application:set_env(rabbit, max_message_size, {TEST_MAX_MESSAGE_SIZE})."
    )
    small, big, behind = (
        helpers.make_event(0),
        helpers.make_event(1, pad=1900),
        helpers.make_event(2),
    )
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.enqueue_committed(pg_dsn, [small])
        await helpers.wait_until_settled(pg_dsn, expect_published=1, within_s=20)  # control
        await helpers.enqueue_committed(pg_dsn, [big, behind])

        async def settled() -> bool:
            return (await helpers.outbox_stats(pg_dsn)).published >= 2 and relay.stats.held >= 1

        await wait_for(settled, within=30)
        relay.stop()
    held = await helpers.fetch_row(pg_dsn, big.event_id)
    assert held["state"] == "held" and held["last_reason"] == "oversize"
    assert held["published_at"] is None
    assert (await helpers.fetch_row(pg_dsn, behind.event_id))["state"] == "published"
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(small.event_id), str(behind.event_id)}


@pytest.mark.timeout(120)
async def test_a_broker_that_stops_confirming_leaves_the_row_eligible_with_a_timeout(
    pg_dsn: str, amqp_url: str, topo: Topology, rabbit_node: RabbitNode, broker_settings: str
) -> None:
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, publish_timeout_s=0.5))
    first, blocked = helpers.make_event(0), helpers.make_event(1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.enqueue_committed(pg_dsn, [first])
        await helpers.wait_until_settled(pg_dsn, expect_published=1, within_s=20)  # control
        # The node now blocks every publishing connection: the first publish after the alarm
        # times out (the block is announced to a connection as it publishes); from then on
        # the relay knows it is blocked and claims nothing until it clears.
        await set_watermark(rabbit_node, ALARM_WATERMARK)
        await helpers.enqueue_committed(pg_dsn, [blocked])
        await failed_with(relay, pg_dsn, blocked, "timeout", 1)
        await wait_for(lambda: _true(relay.blocked), within=30)
        await set_watermark(rabbit_node, broker_settings)
        await helpers.wait_until_settled(pg_dsn, expect_published=2, within_s=30)
        relay.stop()
    row = await helpers.fetch_row(pg_dsn, blocked.event_id)
    assert row["state"] == "published"
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    # At least once: the timed-out publishes may arrive too once the alarm clears.
    assert set(counts) == {str(first.event_id), str(blocked.event_id)}


@pytest.mark.timeout(120)
async def test_a_connection_lost_mid_publish_leaves_the_row_eligible_with_that_reason(
    pg_dsn: str, amqp_url: str, topo: Topology, rabbit_node: RabbitNode, broker_settings: str
) -> None:
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, publish_timeout_s=30.0, lease_s=60.0))
    first, cut = helpers.make_event(0), helpers.make_event(1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.enqueue_committed(pg_dsn, [first])
        await helpers.wait_until_settled(pg_dsn, expect_published=1, within_s=20)  # control
        # Hold the next publish in flight (a memory alarm blocks the connection, and the
        # confirm timeout is long), then the broker closes every connection under it.
        await set_watermark(rabbit_node, ALARM_WATERMARK)
        await helpers.enqueue_committed(pg_dsn, [cut])
        await anyio.sleep(1.0)
        assert (await helpers.fetch_row(pg_dsn, cut.event_id))["last_reason"] is None
        await broker_eval(
            rabbit_node,
            "'rabbit_networking':close_all_connections(<<\"accord test: connection lost\">>).",
        )
        await failed_with(relay, pg_dsn, cut, "connection_lost", 1)
        await set_watermark(rabbit_node, broker_settings)
        await helpers.wait_until_settled(pg_dsn, expect_published=2, within_s=30)
        relay.stop()
    assert relay.stats.reconnects >= 1
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(first.event_id), str(cut.event_id)}
