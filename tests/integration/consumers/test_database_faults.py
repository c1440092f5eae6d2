"""The consumer under faults of its database (a review of it on a PostgreSQL cluster of its
own): what one fault may cost a message against RabbitMQ's delivery limit, which counts every
return of it."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest

from accord.consumers import Handlers
from accord.schemas.events import Event
from accord.schemas.topology import Topology
from tests.integration.consumers.support import (
    INSERT_EFFECT,
    declare_topology,
    publish_events,
    report,
    running,
    runtime_for,
)
from tests.support import wait_for

pytestmark = pytest.mark.timeout(120)


async def _applied(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM public.effects") >= n)


async def test_a_lost_database_costs_each_message_one_return_at_most(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    """Eight lanes, each holding a window of deliveries; every backend of the consumer is
    terminated at once mid-run, which ends its broker connection. Each lane's consumer is
    cancelled before the connection closes: closed with consumers on, the messages one
    closing channel returned went to a sibling lane still open, which dropped them, each
    return counted (one terminate: up to 4 deliveries of a message, a sound one
    dead-lettered at the default limit after three). Control: every message applied once."""
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def apply(tx: Any, event: Event) -> None:
        await tx.execute("SELECT pg_sleep(0.005)")
        await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

    events = [report() for _ in range(400)]
    await declare_topology(amqp_url, topo)
    await publish_events(amqp_url, topo, events)
    runtime = runtime_for(amqp_url, pg_dsn, topo, handlers, concurrency=8, prefetch=32,
                          batch_max=16)  # fmt: skip
    async with running(runtime):
        await wait_for(lambda: _applied(effects_pg, 40), within=60)
        await effects_pg.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        await wait_for(lambda: _applied(effects_pg, len(events)), within=90)
    assert runtime.sessions == 2  # the terminate ended one connection
    counts = await effects_pg.fetch(
        "SELECT operation_id, max(delivery_count) AS n FROM consumers.deliveries"
        " WHERE outcome = 'new' GROUP BY 1"
    )
    assert len(counts) == len(events)
    assert max(r["n"] for r in counts) <= 1, sorted(r["n"] for r in counts)[-10:]


async def test_a_prune_round_the_database_cannot_serve_leaves_the_connection_up(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    """The inbox's pruner meets a lock it waits for too long (a CREATE INDEX on the inbox,
    under a lock_timeout): it logs the round and tries at the next interval. Before, the
    whole consumer connection ended, every message in flight charged a delivery (28
    reconnects in 30 s). Control: messages are consumed meanwhile."""
    db = await effects_pg.fetchval("SELECT current_database()")
    await effects_pg.execute(f"ALTER DATABASE \"{db}\" SET lock_timeout = '100ms'")
    await declare_topology(amqp_url, topo)
    holder = await asyncpg.connect(pg_dsn)
    try:
        await holder.execute("BEGIN; LOCK consumers.inbox IN SHARE MODE")
        runtime = runtime_for(amqp_url, pg_dsn, topo, prune_interval_s=0.2)
        async with running(runtime):
            await anyio.sleep(1.5)  # several prune rounds refused by the lock
            await holder.execute("ROLLBACK")
            await publish_events(amqp_url, topo, [report() for _ in range(3)])
            await wait_for(lambda: _applied(effects_pg, 3))
        assert runtime.sessions == 1
    finally:
        await holder.close()
