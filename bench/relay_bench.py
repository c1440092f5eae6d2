"""Relay throughput and enqueue latency against raw limits measured in the same run.

    .venv/bin/python -m bench.relay_bench [--rows 20000] [--rounds 2] [--tx 2000]

1. Throughput: outbox rows → confirmed in a quorum queue, 1 KiB payloads. The relay
   (``relay.Relay``) against the raw limit of the same work written directly with asyncpg
   and aio-pika: claim a batch, publish it with pipelined confirms, mark it published.
2. Latency that ``enqueue`` adds to a one-row domain transaction (p50/p99), the two kinds
   of transaction interleaved so drift hits both equally.

Needs PostgreSQL and RabbitMQ (ACCORD_PG_DSN's server, ACCORD_AMQP_URL); creates and
drops its own database and broker names.
"""

from __future__ import annotations

import argparse
import asyncio
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
from relay import Relay, RelayConfig, enqueue
from relay import sql as relay_sql
from schemas import migrate
from schemas.catalog import default_catalog
from schemas.events import Event, encode_payload
from schemas.settings import load_settings
from schemas.topology import Topology, WorkflowQueue, declare
from schemas.wire import to_amqp

BATCH = 200
CATALOG = default_catalog()

RAW_CLAIM = """
UPDATE relay.outbox SET lease_token = $2, lease_expires_at = now() + interval '30 s'
WHERE id IN (SELECT id FROM relay.outbox WHERE state = 'pending'
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, event_id, tenant, operation_id, type, version, authority_epoch, digest,
          body, occurred_at
"""
RAW_MARK = """
UPDATE relay.outbox SET state = 'published', published_at = now(), lease_token = NULL
WHERE id = ANY($1::bigint[]) AND lease_token = $2
"""
RESET = """
UPDATE relay.outbox SET state = 'pending', published_at = NULL, lease_token = NULL,
       lease_expires_at = NULL, attempts = 0, publish_id = NULL
"""


def event(n: int) -> Event:
    # ~1 KiB JSON body
    return Event(
        tenant="bench",
        operation_id=f"op-{n}",
        type="report.accepted",
        version=1,
        payload={"report_id": f"r{n}", "subject": "x" * 990},
    )


async def fill(conn: asyncpg.Connection, rows: int) -> None:
    records = []
    for n in range(rows):
        e = event(n)
        records.append(
            (
                e.event_id,
                e.tenant,
                e.operation_id,
                e.type,
                e.version,
                e.authority_epoch,
                CATALOG.digest(e),
                encode_payload(e),
                None,
                e.occurred_at,
            )
        )
    columns = [
        "event_id",
        "tenant",
        "operation_id",
        "type",
        "version",
        "authority_epoch",
        "digest",
        "body",
        "trace",
        "occurred_at",
    ]
    await conn.copy_records_to_table(
        "outbox", schema_name="relay", records=records, columns=columns
    )
    await conn.execute("VACUUM ANALYZE relay.outbox")


async def raw_relay(dsn: str, url: str, exchange_name: str, total: int) -> float:
    """The raw limit: claim, publish with pipelined confirms, mark. Rows per second."""
    conn = await asyncpg.connect(dsn)
    amqp = await aio_pika.connect(url)
    channel = await amqp.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(exchange_name)
    done = 0
    start = time.perf_counter()
    while done < total:
        token = uuid.uuid4()
        rows = await conn.fetch(RAW_CLAIM, BATCH, token)

        async def one(r: asyncpg.Record) -> None:
            msg = to_amqp(
                Event.model_construct(
                    tenant=r["tenant"],
                    operation_id=r["operation_id"],
                    type=r["type"],
                    version=r["version"],
                    authority_epoch=r["authority_epoch"],
                    payload={},
                    event_id=r["event_id"],
                    occurred_at=r["occurred_at"],
                ),
                r["body"],
                digest=r["digest"],
                publish_id=str(uuid.uuid4()),
            )
            await exchange.publish(
                aio_pika.Message(
                    msg.body,
                    headers=msg.headers,
                    content_type=msg.content_type,
                    message_id=msg.message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                msg.routing_key,
                mandatory=True,
                timeout=10,
            )

        await asyncio.gather(*(one(r) for r in rows))
        await conn.execute(RAW_MARK, [r["id"] for r in rows], token)
        done += len(rows)
    elapsed = time.perf_counter() - start
    await amqp.close()
    await conn.close()
    return total / elapsed


async def accord_relay(dsn: str, url: str, exchange_name: str, total: int) -> float:
    relay = Relay(
        RelayConfig(pg_dsn=dsn, amqp_url=url, exchange=exchange_name, batch=BATCH, poll_s=0.05)
    )
    conn = await asyncpg.connect(dsn)
    start = time.perf_counter()
    elapsed = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        while relay.stats.published < total:  # noqa: ASYNC110 (the relay task's counter)
            await anyio.sleep(0.002)
        elapsed = time.perf_counter() - start
        relay.stop()
    await conn.close()
    return total / elapsed


async def enqueue_latency(dsn: str, n: int) -> dict[str, list[float]]:
    """Per-transaction latency of four interleaved one-row domain transactions.

    ``plain``: the domain INSERT alone. ``round_trip``: plus a bare ``SELECT 1`` (the floor
    of any second statement). ``raw_insert``: plus the outbox INSERT with precomputed
    arguments (the floor of a one-statement outbox). ``enqueue``: plus ``relay.enqueue``.
    """
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE IF NOT EXISTS bench_domain (id bigserial, note text)")
    domain = "INSERT INTO bench_domain (note) VALUES ($1)"

    async def plain(e: Event) -> None:
        async with conn.transaction():
            await conn.execute(domain, e.operation_id)

    async def round_trip(e: Event) -> None:
        async with conn.transaction():
            await conn.execute(domain, e.operation_id)
            await conn.fetchval("SELECT 1")

    async def raw_insert(e: Event) -> None:
        body, digest = encode_payload(e), CATALOG.digest(e)
        async with conn.transaction():
            await conn.execute(domain, e.operation_id)
            await conn.fetchval(
                relay_sql.ENQUEUE, e.event_id, e.tenant, e.operation_id, e.type, e.version,
                e.authority_epoch, digest, body, None, e.occurred_at,
            )  # fmt: skip

    async def with_enqueue(e: Event) -> None:
        async with conn.transaction():
            await conn.execute(domain, e.operation_id)
            await enqueue(conn, e)

    kinds = {
        "plain": plain,
        "round_trip": round_trip,
        "raw_insert": raw_insert,
        "enqueue": with_enqueue,
    }
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(n + 100):
        for kind, run in kinds.items():
            e = event(i * 10 + len(samples[kind]))
            t0 = time.perf_counter()
            await run(e)
            if i >= 100:  # warm-up: prepared statements, caches
                samples[kind].append(time.perf_counter() - t0)
    await conn.close()
    return samples


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1e6


async def main(rows: int, rounds: int, tx: int) -> dict[str, Any]:
    settings = load_settings()
    name = f"accord_bench_{uuid.uuid4().hex[:8]}"
    admin_dsn = urlunsplit(urlsplit(settings.pg_dsn)._replace(path="/postgres"))
    dsn = urlunsplit(urlsplit(settings.pg_dsn)._replace(path=f"/{name}"))
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    topo = Topology(
        f"bench{uuid.uuid4().hex[:6]}", (WorkflowQueue("report", ("report.accepted.v1",)),)
    )
    amqp = await aio_pika.connect(settings.amqp_url)
    channel = await amqp.channel()
    queues = await declare(channel, topo)
    results: dict[str, Any] = {"rows": rows, "batch": BATCH}
    try:
        conn = await asyncpg.connect(dsn)
        await migrate.migrate(conn)
        await fill(conn, rows)
        raw: list[float] = []
        ours: list[float] = []
        for _ in range(rounds):
            for label, fn, sink in (("raw", raw_relay, raw), ("relay", accord_relay, ours)):
                await conn.execute(RESET)
                await conn.execute("VACUUM relay.outbox")
                await queues["report"].purge()
                rate = await fn(dsn, settings.amqp_url, topo.exchange, rows)
                sink.append(rate)
                print(f"  {label:6s} {rate:8.0f} rows/s")
        await queues["report"].purge()
        await conn.close()
        results["raw_rows_per_s"] = max(raw)
        results["relay_rows_per_s"] = max(ours)
        results["throughput_ratio"] = max(ours) / max(raw)
        for label, values in (await enqueue_latency(dsn, tx)).items():
            results[f"{label}_p50_us"] = pct(values, 50)
            results[f"{label}_p99_us"] = pct(values, 99)
        for label in ("round_trip", "raw_insert", "enqueue"):
            for q in ("p50", "p99"):
                results[f"{label}_adds_{q}"] = (
                    results[f"{label}_{q}_us"] / results[f"plain_{q}_us"] - 1
                )
    finally:
        exchanges, names = topo.names()
        for q in names:
            await channel.queue_delete(q)
        for x in exchanges:
            await channel.exchange_delete(x)
        await amqp.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tx", type=int, default=2000)
    args = parser.parse_args()
    results = runtime.run(main, args.rows, args.rounds, args.tx)
    print(json.dumps(results, indent=2))
    print(
        f"relay/raw throughput: {results['throughput_ratio']:.2f} "
        f"(relay {results['relay_rows_per_s']:.0f}/s, "
        f"raw {results['raw_rows_per_s']:.0f}/s; goal >= 0.8)"
    )
    print(
        f"enqueue adds p50 {results['enqueue_adds_p50']:+.1%} "
        f"(p50 {results['plain_p50_us']:.0f} → {results['enqueue_p50_us']:.0f} µs; goal <= +15%), "
        f"p99 {results['enqueue_adds_p99']:+.1%} "
        f"({results['plain_p99_us']:.0f} → {results['enqueue_p99_us']:.0f} µs)"
    )
    print(
        f"floors at p50: any second statement (SELECT 1) {results['round_trip_adds_p50']:+.1%}, "
        f"the bare outbox INSERT {results['raw_insert_adds_p50']:+.1%}"
    )


if __name__ == "__main__":
    cli()
