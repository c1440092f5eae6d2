"""Lost connections reconnect without losing or repeating effects; process spans link to create."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import anyio
import asyncpg
import pytest
from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from accord.consumers import ConsumerRuntime, Handlers
from accord.schemas import telemetry
from accord.schemas.events import Event
from accord.schemas.topology import Topology
from tests.integration.consumers.support import (
    INSERT_EFFECT,
    WORKFLOW,
    CuttableProxy,
    amqp_message,
    declare_topology,
    publish,
    publish_events,
    report,
    running,
    runtime_for,
    wire_message,
)
from tests.support import scaled, wait_for

pytestmark = pytest.mark.timeout(120)


async def _effects(pg: asyncpg.Connection) -> int:
    return int(await pg.fetchval("SELECT count(*) FROM public.effects"))


async def _exactly_once(pg: asyncpg.Connection, n: int) -> None:
    assert await _effects(pg) == n
    assert (
        await pg.fetchval(
            "SELECT count(*) FROM (SELECT operation_id FROM public.effects"
            " GROUP BY 1 HAVING count(*) > 1) AS d"
        )
        == 0
    )
    assert await pg.fetchval("SELECT count(*) FROM consumers.poison") == 0


async def test_a_cut_broker_connection_reconnects(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    n = scaled(300, 5000)
    parts = urlsplit(amqp_url)
    proxy = CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    await declare_topology(amqp_url, topo)
    await publish_events(amqp_url, topo, [report() for _ in range(n)])
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        runtime = runtime_for(proxy.url(amqp_url), pg_dsn, topo, batch_max=8, concurrency=1)
        async with running(runtime):
            await wait_for(lambda: _over(effects_pg, n // 4))
            assert await proxy.cut() > 0
            await wait_for(lambda: _over(effects_pg, n), within=60)
        tg.cancel_scope.cancel()
    assert runtime.sessions >= 2
    await _exactly_once(effects_pg, n)


async def test_lost_database_connections_reconnect(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    n = scaled(300, 5000)
    await declare_topology(amqp_url, topo)
    await publish_events(amqp_url, topo, [report() for _ in range(n)])
    runtime = runtime_for(amqp_url, pg_dsn, topo, batch_max=8)
    async with running(runtime):
        await wait_for(lambda: _over(effects_pg, n // 4))
        killed = await effects_pg.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert killed > 0
        try:
            await wait_for(lambda: _over_or_poisoned(effects_pg, n), within=60)
        except TimeoutError:
            raise AssertionError(await _story(effects_pg, runtime)) from None
        assert await _over(effects_pg, n), await _story(effects_pg, runtime)
    assert runtime.sessions >= 2
    await _exactly_once(effects_pg, n)


async def _over_or_poisoned(pg: asyncpg.Connection, n: int) -> bool:
    return await _over(pg, n) or bool(await pg.fetchval("SELECT count(*) FROM consumers.poison"))


async def _story(pg: asyncpg.Connection, runtime: ConsumerRuntime) -> str:
    """What to read when a reconnect test fails: effects, poison reasons, sessions, stats."""
    poisoned = await pg.fetch("SELECT reason, delivery_count, detail FROM consumers.poison")
    return (
        f"effects={await _effects(pg)} sessions={runtime.sessions} stats={runtime.stats}"
        f" poison={[dict(row) for row in poisoned]}"
    )


async def test_a_backend_terminated_mid_batch_is_a_lost_connection_not_a_retry(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    """The terminated backend's error arrives before asyncpg sees the stream end: it is still
    a lost connection (a new session, the message back untouched), never the message's own
    transient failure counted against the queue's delivery limit."""
    slow = {"first": True}
    handlers = Handlers(WORKFLOW)

    @handlers.on("report.accepted", 1)
    async def slow_effect(tx: Any, event: Event) -> None:
        if slow.pop("first", False):
            await tx.execute("SELECT pg_sleep(30)")
        await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

    await declare_topology(amqp_url, topo)
    runtime = runtime_for(amqp_url, pg_dsn, topo, handlers=handlers, concurrency=1)
    async with running(runtime):
        await publish_events(amqp_url, topo, [report()])
        await wait_for(lambda: _sleeping(effects_pg))
        assert await effects_pg.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE query = 'SELECT pg_sleep(30)' AND pid <> pg_backend_pid()"
        )
        await wait_for(lambda: _over(effects_pg, 1))
    assert runtime.sessions == 2
    assert runtime.stats.retried == 0
    await _exactly_once(effects_pg, 1)


async def _sleeping(pg: asyncpg.Connection) -> bool:
    return bool(
        await pg.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'"
        )
    )


async def _over(pg: asyncpg.Connection, n: int) -> bool:
    return await _effects(pg) >= n


async def test_a_duplicate_shows_as_two_process_spans_linked_to_one_create(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("create") as create:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
    event = report()
    message = wire_message(event, trace=carrier)
    await declare_topology(amqp_url, topo)
    async with running(runtime_for(amqp_url, pg_dsn, topo, tracer=tracer)):
        await publish(amqp_url, topo, [(event.ce_type, amqp_message(message))])
        await wait_for(lambda: _delivered(effects_pg, 1))
        await publish(amqp_url, topo, [(event.ce_type, amqp_message(message))])
        await wait_for(lambda: _delivered(effects_pg, 2))
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("process ")]
    assert len(spans) == 2
    for span in spans:
        assert [link.context.span_id for link in span.links] == [create.get_span_context().span_id]
        assert span.attributes is not None
        assert span.attributes[telemetry.ATTR_REDELIVERED] is False
        assert span.attributes[telemetry.ATTR_DELIVERY_COUNT] == 0
        assert span.attributes[telemetry.ATTR_OPERATION_ID] == event.operation_id
    outcomes = sorted(str((s.attributes or {})[telemetry.ATTR_INBOX_OUTCOME]) for s in spans)
    assert outcomes == ["duplicate", "new"]


async def _delivered(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM consumers.deliveries") >= n)
