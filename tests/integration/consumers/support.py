"""Helpers for consumer tests: events, publishing with confirms, an effect table, a runner."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import aio_pika
import anyio
import anyio.abc
import asyncpg

from accord.consumers import ConsumerRuntime, Handlers, RuntimeConfig
from accord.demo.catalog import demo_catalog
from accord.schemas import wire
from accord.schemas.events import Event, encode_payload
from accord.schemas.topology import Topology, WorkflowQueue

WORKFLOW = "report"
TENANT = "acme"
CATALOG = demo_catalog()

# A test-only effect table: deliberately without a unique key, so a duplicate effect
# would show up as a second row instead of an error.
CREATE_EFFECTS = """
CREATE TABLE IF NOT EXISTS public.effects (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant       text NOT NULL,
    operation_id text NOT NULL,
    event_id     uuid NOT NULL
)
"""
INSERT_EFFECT = "INSERT INTO public.effects (tenant, operation_id, event_id) VALUES ($1, $2, $3)"


def topology_for(prefix: str, delivery_limit: int = 5) -> Topology:
    return Topology(prefix, (WorkflowQueue(WORKFLOW, ("report.accepted.v1",), delivery_limit),))


def report(
    operation_id: str | None = None,
    *,
    tenant: str = TENANT,
    subject: str = "quarterly numbers",
    event_id: uuid.UUID | None = None,
    occurred_at: datetime | None = None,
) -> Event:
    op = operation_id or f"op-{uuid.uuid4().hex[:12]}"
    return Event(
        tenant=tenant,
        operation_id=op,
        type="report.accepted",
        version=1,
        payload={"report_id": f"r-{op}", "subject": subject},
        event_id=event_id or uuid.uuid4(),
        occurred_at=occurred_at or datetime.now(UTC),
    )


def wire_message(event: Event, trace: Mapping[str, str] | None = None) -> wire.WireMessage:
    return wire.to_amqp(
        event,
        encode_payload(event),
        digest=CATALOG.digest(event),
        publish_id=str(uuid.uuid4()),
        trace=trace,
    )


def amqp_message(msg: wire.WireMessage) -> aio_pika.Message:
    return aio_pika.Message(
        msg.body,
        headers=dict(msg.headers),
        message_id=msg.message_id,
        content_type=msg.content_type,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


async def publish(
    amqp_url: str,
    topo: Topology,
    messages: Iterable[tuple[str, aio_pika.Message]],
    *,
    window: int = 500,
) -> int:
    """Publish (routing key, message) pairs with confirms, ``window`` in flight; returns count."""
    connection = await aio_pika.connect(amqp_url)
    sent = 0
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(topo.exchange)
        pending: list[Awaitable[Any]] = []
        for routing_key, message in messages:
            pending.append(exchange.publish(message, routing_key=routing_key, mandatory=True))
            if len(pending) >= window:
                await _gather(pending)
                sent += len(pending)
                pending = []
        await _gather(pending)
        sent += len(pending)
    finally:
        await connection.close()
    return sent


async def _gather(awaitables: list[Awaitable[Any]]) -> None:
    async with anyio.create_task_group() as tg:
        for aw in awaitables:
            tg.start_soon(_await, aw)


async def _await(aw: Awaitable[Any]) -> None:
    await aw


async def publish_events(amqp_url: str, topo: Topology, events: Iterable[Event]) -> int:
    return await publish(
        amqp_url,
        topo,
        ((e.ce_type, amqp_message(wire_message(e))) for e in events),
    )


async def declare_topology(amqp_url: str, topo: Topology) -> None:
    from accord.schemas.topology import declare

    connection = await aio_pika.connect(amqp_url)
    try:
        await declare(await connection.channel(), topo)
    finally:
        await connection.close()


def effect_handlers(workflow: str = WORKFLOW) -> Handlers:
    handlers = Handlers(workflow)

    @handlers.on("report.accepted", 1)
    async def write_effect(tx: Any, event: Event) -> None:
        await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

    return handlers


def runtime_for(
    amqp_url: str,
    pg_dsn: str,
    topo: Topology,
    handlers: Handlers | None = None,
    **config: Any,
) -> ConsumerRuntime:
    options: dict[str, Any] = {"tenants": frozenset({TENANT}), "reconnect_delay_s": 0.2}
    options.update(config)
    tracer = options.pop("tracer", None)
    after_commit = options.pop("after_commit", None)
    return ConsumerRuntime(
        config=RuntimeConfig(workflow=WORKFLOW, **options),
        amqp_url=amqp_url,
        pg_dsn=pg_dsn,
        topology=topo,
        catalog=CATALOG,
        handlers=handlers or effect_handlers(),
        tracer=tracer,
        after_commit=after_commit,
    )


@contextlib.asynccontextmanager
async def running(runtime: ConsumerRuntime, within: float = 60) -> AsyncIterator[ConsumerRuntime]:
    """Run the runtime in the background; on exit, drain it and re-raise its failure."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        with anyio.fail_after(within):
            await runtime.consuming.wait()
        yield runtime
        runtime.stop()


async def queue_depth(amqp_url: str, queue: str) -> int:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        count = declared.declaration_result.message_count
        return int(count or 0)
    finally:
        await connection.close()


async def drain_queue(amqp_url: str, queue: str, within: float = 5) -> list[Any]:
    """Get every message of a queue (acking them): for checking the poison queue."""
    got: list[Any] = []
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        with anyio.move_on_after(within):
            while True:
                message = await declared.get(fail=False)
                if message is None:
                    break
                got.append(message)
                await message.ack()
    finally:
        await connection.close()
    return got


async def counts(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("SELECT outcome, count(*) AS n FROM consumers.deliveries GROUP BY 1")
    return {r["outcome"]: r["n"] for r in rows}


class CuttableProxy:
    """A loopback TCP proxy to the broker whose connections a test can cut at will, or hold
    (nothing forwarded either way, as from a broker that stopped reading) and release."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._streams: list[Any] = []
        self._held: anyio.Event | None = None

    def hold(self) -> None:
        self._held = self._held or anyio.Event()

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.set()

    async def serve(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)

    async def _handle(self, client: Any) -> None:
        upstream = await anyio.connect_tcp(*self.upstream)
        self._streams += [client, upstream]
        async with client, upstream, anyio.create_task_group() as tg:
            tg.start_soon(self._pipe, client, upstream, tg.cancel_scope)
            tg.start_soon(self._pipe, upstream, client, tg.cancel_scope)

    async def _pipe(self, source: Any, sink: Any, scope: Any) -> None:
        try:
            async for chunk in source:
                if self._held is not None:
                    await self._held.wait()
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    async def cut(self) -> int:
        """Abort every proxied connection; returns how many sockets were closed."""
        streams, self._streams = self._streams, []
        for stream in streams:
            await anyio.aclose_forcefully(stream)
        return len(streams)

    def url(self, amqp_url: str) -> str:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(amqp_url)
        netloc = f"{parts.username}:{parts.password}@127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))
