"""Helpers shared by the relay's integration and fault tests (no fixtures here)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable

import aio_pika
import anyio
import asyncpg

from accord.demo import demo_topology
from accord.relay import Relay, RelayConfig
from accord.relay.outbox import OutboxStats, stats
from accord.schemas.events import Event
from accord.schemas.topology import Topology, declare
from tests.support import enqueue

ACCEPTED = "report.accepted"


def make_event(n: int, *, tenant: str = "tenant-a", type_: str = ACCEPTED, pad: int = 0) -> Event:
    payload: dict[str, object] = {"report_id": f"r{n}", "subject": "s" * max(1, pad)}
    if type_ == "report.published":
        payload = {"report_id": f"r{n}", "object_key": f"k{n}"}
    return Event(tenant=tenant, operation_id=f"op-{n}", type=type_, version=1, payload=payload)


async def declare_demo(amqp_url: str, names: object) -> Topology:
    """The demo topology under this test's prefix, registered for deletion afterwards."""
    prefix: str = names.prefix  # type: ignore[attr-defined]
    topo = demo_topology(prefix)
    exchanges, queues = topo.names()
    names.exchanges.extend(exchanges)  # type: ignore[attr-defined]
    names.queues.extend(queues)  # type: ignore[attr-defined]
    conn = await aio_pika.connect(amqp_url)
    try:
        await declare(await conn.channel(), topo)
    finally:
        await conn.close()
    return topo


async def enqueue_committed(dsn: str, events: Iterable[Event]) -> list[uuid.UUID]:
    conn = await asyncpg.connect(dsn)
    ids = []
    try:
        for event in events:
            async with conn.transaction():
                await enqueue(conn, event)
            ids.append(event.event_id)
    finally:
        await conn.close()
    return ids


async def enqueue_committed_together(dsn: str, events: Iterable[Event]) -> None:
    """Every event in one committed transaction: one claim can take them all."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            for event in events:
                await enqueue(conn, event)
    finally:
        await conn.close()


async def drain(amqp_url: str, queue: str) -> Counter[str]:
    """Every message now in ``queue`` (removed), counted by message id."""
    counts: Counter[str] = Counter()
    conn = await aio_pika.connect(amqp_url)
    try:
        channel = await conn.channel()
        q = await channel.get_queue(queue)
        while True:
            message = await q.get(no_ack=True, fail=False)
            if message is None:
                break
            assert message.message_id is not None
            counts[message.message_id] += 1
    finally:
        await conn.close()
    return counts


async def outbox_stats(dsn: str) -> OutboxStats:
    conn = await asyncpg.connect(dsn)
    try:
        return await stats(conn)
    finally:
        await conn.close()


async def wait_until_settled(dsn: str, *, expect_published: int, within_s: float) -> OutboxStats:
    """Poll until ``expect_published`` rows are published and none is pending."""
    with anyio.fail_after(within_s):
        while True:
            current = await outbox_stats(dsn)
            if current.pending == 0 and current.published >= expect_published:
                return current
            await anyio.sleep(0.1)


def config(dsn: str, amqp_url: str, topo: Topology, **overrides: object) -> RelayConfig:
    base: dict[str, object] = {
        "pg_dsn": dsn,
        "amqp_url": amqp_url,
        "exchange": topo.exchange,
        "poll_s": 0.2,
        "lease_s": 10.0,
        "publish_timeout_s": 5.0,
        "retry_base_s": 0.05,
        "retry_max_s": 0.5,
        "reconnect_max_s": 0.5,
    }
    base.update(overrides)
    return RelayConfig(**base)  # type: ignore[arg-type]


async def run_until_settled(relays: list[Relay], dsn: str, expect: int, within_s: float) -> None:
    async with anyio.create_task_group() as tg:
        for r in relays:
            tg.start_soon(r.run)
        try:
            await wait_until_settled(dsn, expect_published=expect, within_s=within_s)
        finally:
            for r in relays:
                r.stop()


async def enqueue_outbox_ids(dsn: str, events: Iterable[Event]) -> list[int]:
    conn = await asyncpg.connect(dsn)
    try:
        ids = []
        for event in events:
            async with conn.transaction():
                ids.append(await enqueue(conn, event))
        return ids
    finally:
        await conn.close()


async def fetch_row(dsn: str, event_id: uuid.UUID) -> asyncpg.Record:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchrow("SELECT * FROM relay.outbox WHERE event_id = $1", event_id)
    finally:
        await conn.close()


async def get_one(amqp_url: str, queue: str) -> aio_pika.abc.AbstractIncomingMessage:
    conn = await aio_pika.connect(amqp_url)
    try:
        channel = await conn.channel()
        q = await channel.get_queue(queue)
        with anyio.fail_after(10):
            while True:
                message = await q.get(no_ack=True, fail=False)
                if message is not None:
                    return message
                await anyio.sleep(0.05)
    finally:
        await conn.close()


async def pg_value(dsn: str, query: str) -> object:
    """One value of ``query`` on a connection of its own."""
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()
