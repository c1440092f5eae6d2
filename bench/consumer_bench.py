"""Consumer throughput against raw limits measured in the same run.

    .venv/bin/python -m bench.consumer_bench [--messages 10000] [--rounds 2]

Work measured: messages in a quorum queue → inbox row + one effect row committed → acked.
1. ``amqp_raw``: aio-pika alone, consume + ack each message (same prefetch), no database.
2. ``pg_raw_row``: asyncpg alone, one INSERT + COMMIT per message at the same concurrency.
   ``pg_raw_batch``: asyncpg alone, ``batch`` rows per COMMIT (executemany), same concurrency.
3. ``straightforward``: the runtime with one transaction and one ack per message.
4. ``accord``: the runtime as configured for speed: several messages per transaction,
   each its own inbox decision, acked after that commit.
Ratios are against the lower raw limit at the runtime's own concurrency and batching,
``min(amqp_raw, pg_raw_batch)``; the ratio against one commit per row is printed too.
Needs PostgreSQL (ACCORD_PG_DSN's server) and RabbitMQ (ACCORD_AMQP_URL); creates and
drops its own database and broker names.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import anyio
import asyncpg

from accord import runtime
from accord.consumers import ConsumerRuntime, Handlers, RuntimeConfig
from accord.demo.catalog import demo_catalog
from accord.schemas import migrate
from accord.schemas.events import Event, encode_payload
from accord.schemas.settings import load_settings
from accord.schemas.topology import Topology, WorkflowQueue, declare
from accord.schemas.wire import to_amqp

CATALOG = demo_catalog()
WORKFLOW = "bench"
TENANT = "bench"
PREFETCH = 256
BATCH = 64
CONCURRENCY = 2

CREATE_EFFECTS = """
CREATE TABLE bench_effects (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant text NOT NULL, operation_id text NOT NULL, event_id uuid NOT NULL
)
"""
INSERT_EFFECT = "INSERT INTO bench_effects (tenant, operation_id, event_id) VALUES ($1, $2, $3)"
# the raw database limit writes rows of the inbox's shape (plus nothing else)
CREATE_RAW = """
CREATE TABLE bench_raw (
    tenant text, consumer text, operation_id text, event_id uuid, digest text,
    PRIMARY KEY (tenant, consumer, operation_id)
)
"""
INSERT_RAW = "INSERT INTO bench_raw VALUES ($1, $2, $3, $4, $5)"


def messages(n: int) -> list[aio_pika.Message]:
    out = []
    for i in range(n):
        event = Event(
            tenant=TENANT,
            operation_id=f"op-{uuid.uuid4().hex[:16]}-{i}",
            type="report.accepted",
            version=1,
            payload={"report_id": f"r{i}", "subject": "quarterly numbers"},
        )
        wire = to_amqp(
            event,
            encode_payload(event),
            digest=CATALOG.digest(event),
            publish_id=str(uuid.UUID(int=i)),
        )
        out.append(
            aio_pika.Message(
                wire.body,
                headers=dict(wire.headers),
                message_id=wire.message_id,
                content_type=wire.content_type,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
        )
    return out


async def fill(channel: aio_pika.abc.AbstractChannel, topo: Topology, n: int) -> None:
    exchange = await channel.get_exchange(topo.exchange)
    batch: list[Any] = []
    for message in messages(n):
        batch.append(exchange.publish(message, routing_key="report.accepted.v1", mandatory=True))
        if len(batch) >= 1000:
            await _all(batch)
            batch = []
    await _all(batch)


async def _all(awaitables: list[Any]) -> None:
    async with anyio.create_task_group() as tg:
        for aw in awaitables:
            tg.start_soon(_wait, aw)


async def _wait(aw: Any) -> None:
    await aw


async def amqp_raw(url: str, queue_name: str, n: int) -> float:
    """aio-pika alone: consume and ack each message. Messages per second."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=PREFETCH)
    queue = await channel.declare_queue(queue_name, passive=True)
    done = anyio.Event()
    count = 0

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal count
        await message.ack()
        count += 1
        if count >= n:
            done.set()

    start = time.perf_counter()
    tag = await queue.consume(on_message)
    await done.wait()
    elapsed = time.perf_counter() - start
    await queue.cancel(tag)
    await connection.close()
    return n / elapsed


async def pg_raw(dsn: str, n: int, rows_per_commit: int) -> float:
    """asyncpg alone: inbox-shaped INSERTs and COMMITs at the consumer's concurrency."""
    pool = await asyncpg.create_pool(dsn, min_size=CONCURRENCY, max_size=CONCURRENCY)
    await pool.execute("TRUNCATE bench_raw")
    per_worker = n // CONCURRENCY

    async def worker(w: int) -> None:
        async with pool.acquire() as conn:
            for start in range(0, per_worker, rows_per_commit):
                rows = [
                    (TENANT, WORKFLOW, f"op-{w}-{i}", uuid.uuid4(), "a" * 64)
                    for i in range(start, min(start + rows_per_commit, per_worker))
                ]
                async with conn.transaction():
                    if rows_per_commit == 1:
                        await conn.execute(INSERT_RAW, *rows[0])
                    else:
                        await conn.executemany(INSERT_RAW, rows)

    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(CONCURRENCY):
            tg.start_soon(worker, w)
    elapsed = time.perf_counter() - began
    await pool.close()
    return per_worker * CONCURRENCY / elapsed


async def consumer(url: str, dsn: str, topo: Topology, n: int, batch_max: int) -> float:
    """The runtime until ``n`` messages are committed and acked. Messages per second."""
    handlers = Handlers(WORKFLOW)

    @handlers.on("report.accepted", 1)
    async def effect(tx: Any, event: Event) -> None:
        await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

    runner = ConsumerRuntime(
        config=RuntimeConfig(
            workflow=WORKFLOW,
            tenants=frozenset({TENANT}),
            prefetch=PREFETCH,
            batch_max=batch_max,
            concurrency=CONCURRENCY,
        ),
        amqp_url=url,
        pg_dsn=dsn,
        topology=topo,
        catalog=CATALOG,
        handlers=handlers,
    )
    elapsed = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.run)
        await runner.consuming.wait()
        start = time.perf_counter()
        while runner.stats.new + runner.stats.duplicate < n:  # noqa: ASYNC110 - a counter
            await anyio.sleep(0.002)
        elapsed = time.perf_counter() - start
        runner.stop()
    assert runner.stats.poisoned == 0 and runner.stats.retried == 0
    return n / elapsed


async def main(n: int, rounds: int) -> dict[str, Any]:
    settings = load_settings()
    name = f"accord_bench_{uuid.uuid4().hex[:8]}"
    admin_dsn = urlunsplit(urlsplit(settings.pg_dsn)._replace(path="/postgres"))
    dsn = urlunsplit(urlsplit(settings.pg_dsn)._replace(path=f"/{name}"))
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    topo = Topology(
        f"bench{uuid.uuid4().hex[:6]}", (WorkflowQueue(WORKFLOW, ("report.accepted.v1",)),)
    )
    amqp = await aio_pika.connect(settings.amqp_url)
    channel = await amqp.channel(publisher_confirms=True, on_return_raises=True)
    samples: dict[str, list[float]] = {}
    try:
        conn = await asyncpg.connect(dsn)
        await migrate.migrate(conn)
        await conn.execute(CREATE_EFFECTS)
        await conn.execute(CREATE_RAW)
        await conn.close()
        await declare(channel, topo)
        queue = topo.queue(WORKFLOW)
        for _ in range(rounds):
            await fill(channel, topo, n)
            samples.setdefault("amqp_raw", []).append(await amqp_raw(settings.amqp_url, queue, n))
            samples.setdefault("pg_raw_row", []).append(await pg_raw(dsn, n, 1))
            samples.setdefault("pg_raw_batch", []).append(await pg_raw(dsn, n, BATCH))
            await fill(channel, topo, n)
            straight = await consumer(settings.amqp_url, dsn, topo, n, batch_max=1)
            samples.setdefault("straightforward", []).append(straight)
            await fill(channel, topo, n)
            fast = await consumer(settings.amqp_url, dsn, topo, n, batch_max=BATCH)
            samples.setdefault("accord", []).append(fast)
    finally:
        exchanges, queues = topo.names()
        cleanup = await amqp.channel()  # a fresh channel: the first may have been closed
        for q in queues:
            await cleanup.queue_delete(q)
        for x in exchanges:
            await cleanup.exchange_delete(x)
        await amqp.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    results: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    lower = min(results["amqp_raw"], results["pg_raw_batch"])
    results["lower_raw_limit"] = lower
    results["accord_ratio"] = results["accord"] / lower
    results["straightforward_ratio"] = results["straightforward"] / lower
    results["accord_vs_pg_raw_row"] = results["accord"] / results["pg_raw_row"]
    results["straightforward_vs_pg_raw_row"] = results["straightforward"] / results["pg_raw_row"]
    results["settings"] = {
        "messages": n, "rounds": rounds, "prefetch": PREFETCH, "batch": BATCH,
        "concurrency": CONCURRENCY,
    }  # fmt: skip
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results = runtime.run(main, args.messages, args.rounds)
    print(json.dumps(results, indent=2))
    print(
        f"accord/lower raw limit: {results['accord_ratio']:.2f} "
        f"(accord {results['accord']:.0f}/s; raw: amqp consume+ack {results['amqp_raw']:.0f}/s, "
        f"pg batched commits {results['pg_raw_batch']:.0f}/s; goal >= 0.5)"
    )
    print(
        f"straightforward/lower raw limit: {results['straightforward_ratio']:.2f} "
        f"({results['straightforward']:.0f}/s)"
    )
    print(
        f"against one commit per row ({results['pg_raw_row']:.0f}/s): accord "
        f"{results['accord_vs_pg_raw_row']:.2f}, straightforward "
        f"{results['straightforward_vs_pg_raw_row']:.2f}"
    )


if __name__ == "__main__":
    cli()
