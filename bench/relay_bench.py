"""Relay throughput and enqueue latency against raw limits measured in the same run.

    .venv/bin/python -m bench.relay_bench [--rows 20000] [--rounds 2] [--tx 1000]
                                          [--latency-rounds 3] [--latency-only]
    .venv/bin/python -m bench.relay_bench --trickle 250 [--rows 2500]
    .venv/bin/python -m bench.relay_bench --producers 8 [--rounds 2]

1. Throughput: outbox rows → confirmed in a quorum queue, 1 KiB payloads. The relay
   (``relay.Relay``) against the raw limit of the same work written directly with asyncpg
   and aio-pika: claim a batch, publish it with pipelined confirms, mark it published.
2. Latency that ``enqueue`` adds to a one-row domain transaction (p50/p99), against two
   baselines: the old toy (an unindexed two-column table) and a realistic domain row
   shaped like demo.submissions (a primary key, a CHECK, a few columns), each with a 1 KiB
   event; and the realistic row with the event the demo enqueues for it (``demo``: about
   60 bytes of payload), which tells the row's size from the row's existence. All kinds of
   transaction are interleaved so drift hits them equally; each figure is the median over
   rounds of that round's percentile. Also the WAL each statement writes.
3. ``--trickle RATE`` (alone): what the relay's CPU per event is at a steady trickle, the way
   a service's events reach it, against the same relay draining a backlog of as many rows
   in the same run. Another process commits ``--rows`` events at RATE a second, one
   transaction and one NOTIFY each (the demo's ~60-byte payload); the relay runs in this
   process with its defaults (two loops, 10 ms linger), so its CPU is this process's
   (utime + stime) from the first event to the last publish. Also printed: events per
   claim that found rows (cycle), claims per event, and the publish lag (``published_at -
   enqueued_at``, the database clock) at p50 and p99. Per event, a cycle's fixed part (the
   wake-up, two statements and their commits) is shared by the few events a linger
   gathers at a trickle and by a whole batch in a backlog.
4. ``--producers K`` (alone): the commit rate of K producer processes, each committing
   one-row enqueue transactions as fast as it can (3 s per kind, interleaved over
   ``--rounds``, a connection LISTENing as a relay's would), against the same INSERT
   without a wake-up: every commit notifying (no relay promised), and with a relay's awake
   promise in force (relay.awake), when enqueue skips its NOTIFY. A notifying commit
   holds a global lock through its WAL flush, so notifying producers share no flush.

Needs PostgreSQL and RabbitMQ (ACCORD_PG_DSN's server, ACCORD_AMQP_URL); creates and
drops its own database and broker names.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import statistics
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import anyio
import asyncpg

from accord import runtime
from accord.demo.catalog import demo_catalog
from accord.relay import Relay, RelayConfig, enqueue, enqueue_joined, outbox, prepare
from accord.relay import sql as relay_sql
from accord.schemas import migrate
from accord.schemas.events import Event, encode_payload
from accord.schemas.settings import load_settings
from accord.schemas.topology import Topology, WorkflowQueue, declare
from accord.schemas.wire import to_amqp

BATCH = 200
CATALOG = demo_catalog()

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
WHERE operation_id NOT LIKE 'backoff-%'
"""

# A backlog of pending rows waiting out a retry backoff for a day (what a broker outage
# followed by retries leaves behind), $1 rows.
BACKLOG = """
INSERT INTO relay.outbox (event_id, tenant, operation_id, type, version, digest, body,
                          occurred_at, attempts, last_reason, lease_expires_at)
SELECT gen_random_uuid(), 'acme', 'backoff-' || i, 'report.accepted', 1, 'd', '\\x7b7d',
       now(), 3, 'timeout', now() + interval '1 day'
FROM generate_series(1, $1) i
"""


#: The subject of the realistic domain row, which the ``demo`` domain's event carries too.
SUBJECT = "quarterly report for the board"


def event(n: int, subject: str = "x" * 990) -> Event:
    # ~1 KiB JSON body by default; the demo's own payload with ``subject=SUBJECT``
    return Event(
        tenant="bench",
        operation_id=f"op-{n}",
        type="report.accepted",
        version=1,
        payload={"report_id": f"r{n}", "subject": subject},
    )


async def fill(conn: asyncpg.Connection, rows: int, subject: str | None = None) -> None:
    records = []
    for n in range(rows):
        e = event(n) if subject is None else event(n, subject)
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
                    headers=dict(msg.headers),
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


TRICKLE_LAG = """
SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM published_at - enqueued_at))
FROM relay.outbox WHERE state = 'published'
"""


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _enqueue_steadily(dsn: str, rate: float, n: int) -> None:
    """(Another process.) Commit ``n`` demo-sized events at ``rate`` a second, each alone."""

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        start = time.perf_counter()
        for i in range(n):
            async with conn.transaction():
                await enqueue(conn, event(10**8 + i, SUBJECT), catalog=CATALOG)
            await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.perf_counter()))
        await conn.close()

    runtime.run(go)


# The producers' kinds: the outbox INSERT without a wake-up (their raw limit), then enqueue's
# own statement with every commit notifying, and with a relay's awake promise in force.
BARE_ENQUEUE = relay_sql.ENQUEUE.replace(f", {relay_sql.WAKE}", "")
PRODUCER_KINDS = {
    "bare": (BARE_ENQUEUE, "-infinity"),
    "notify": (relay_sql.ENQUEUE, "-infinity"),
    "promised": (relay_sql.ENQUEUE, "infinity"),
}


def _produce(dsn: str, query: str, start_at: float, seconds: float, out: Any) -> None:
    """(Another process.) Commit one outbox row per transaction from ``start_at`` (wall
    clock) for ``seconds``; put how many."""

    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        rest = outbox_args(event(0, SUBJECT))[1:]
        statement = await conn.prepare(query)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        done, end = 0, start_at + seconds
        while time.time() < end:
            async with conn.transaction():
                await statement.fetchval(uuid.uuid4(), *rest)
            done += 1
        await conn.close()
        out.put(done)

    runtime.run(go)


async def producers(dsn: str, k: int, seconds: float, rounds: int) -> dict[str, Any]:
    """``k`` producer processes, each committing one-row enqueues as fast as it can, for
    ``seconds`` per kind, the kinds interleaved over ``rounds``; a connection LISTENs, as a
    relay's would. Best round of each kind, in commits per second."""
    listener = await asyncpg.connect(dsn)
    heard = 0

    def hear(*_: Any) -> None:
        nonlocal heard
        heard += 1

    await listener.add_listener(relay_sql.NOTIFY_CHANNEL, hear)
    rates: dict[str, list[float]] = {kind: [] for kind in PRODUCER_KINDS}
    context = multiprocessing.get_context("spawn")
    for _ in range(rounds):
        for kind, (query, until) in PRODUCER_KINDS.items():
            await listener.execute("UPDATE relay.awake SET until = $1::text::timestamptz", until)
            await listener.execute("TRUNCATE relay.outbox")
            out = context.Queue()
            start_at = time.time() + 2.0  # after every process has connected and prepared
            procs = [
                context.Process(target=_produce, args=(dsn, query, start_at, seconds, out))
                for _ in range(k)
            ]
            for proc in procs:
                proc.start()
            counts = [await anyio.to_thread.run_sync(out.get) for _ in procs]
            for proc in procs:
                proc.join()
            rates[kind].append(sum(counts) / seconds)
            print(f"  {k} producers, {kind:8s} {rates[kind][-1]:8.0f} commits/s")
    await listener.close()
    best = {kind: max(values) for kind, values in rates.items()}
    return {
        "producers": k,
        "producer_seconds": seconds,
        "notifications_heard": heard,
        **{f"producers_{kind}_per_s": rate for kind, rate in best.items()},
        "producers_notify_ratio": best["notify"] / best["bare"],
        "producers_promised_ratio": best["promised"] / best["bare"],
    }


async def _relay_cpu(dsn: str, url: str, exchange: str, n: int, rate: float) -> dict[str, float]:
    """One relay, until it has published ``n`` events: filled up front (``rate`` 0) or
    trickled in by another process."""
    relay = Relay(RelayConfig(pg_dsn=dsn, amqp_url=url, exchange=exchange))
    conn = await asyncpg.connect(dsn)
    feeder = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            await anyio.sleep(1.0)  # connected, listening, found nothing
            if not rate:
                await fill(conn, n, SUBJECT)
                relay.wake()
            else:
                feeder = multiprocessing.get_context("spawn").Process(
                    target=_enqueue_steadily, args=(dsn, rate, n)
                )
                feeder.start()
            cpu, claims, cycles = _cpu_s(), relay.stats.claims, relay.stats.cycles
            while relay.stats.published < n:  # noqa: ASYNC110 (the relay task's counter)
                await anyio.sleep(0.01)
            cpu = _cpu_s() - cpu
            claims, cycles = relay.stats.claims - claims, relay.stats.cycles - cycles
            relay.stop()
        p50, p99 = await conn.fetchval(TRICKLE_LAG)
        await conn.execute("DELETE FROM relay.outbox")
    finally:
        await conn.close()
        if feeder is not None:
            feeder.join()
    return {
        "cpu_us_per_event": cpu / n * 1e6,
        "events_per_cycle": n / cycles,
        "claims_per_event": claims / n,
        "lag_p50_ms": p50 * 1e3,
        "lag_p99_ms": p99 * 1e3,
    }


async def trickle(dsn: str, url: str, topo: Topology, rate: float, n: int) -> dict[str, Any]:
    """The relay's CPU per event at a steady ``rate`` and draining a backlog of ``n``."""
    channel = await (amqp := await aio_pika.connect(url)).channel()
    queues = await declare(channel, topo)
    results: dict[str, Any] = {"trickle_rate": rate, "trickle_events": n}
    for label, r in (("backlog", 0.0), ("trickle", rate)):
        for key, value in (await _relay_cpu(dsn, url, topo.exchange, n, r)).items():
            results[f"{label}_{key}"] = value
        await queues["report"].purge()
    await amqp.close()
    results["trickle_cpu_ratio"] = (
        results["trickle_cpu_us_per_event"] / results["backlog_cpu_us_per_event"]
    )
    return results


DOMAINS = {
    # The old toy baseline: an unindexed two-column table.
    "toy": (
        "CREATE TABLE IF NOT EXISTS bench_toy (id bigserial, note text)",
        "INSERT INTO bench_toy (note) VALUES ($1)",
    ),
    # A realistic domain row, shaped like demo.submissions: a primary key, a CHECK and a
    # few short columns (the subject is kept short so the baseline is not inflated).
    "real": (
        """CREATE TABLE IF NOT EXISTS bench_submissions (
            tenant text NOT NULL, report_id text NOT NULL, subject text NOT NULL,
            operation_id text NOT NULL, event_id uuid NOT NULL,
            state text NOT NULL DEFAULT 'accepted' CHECK (state IN ('accepted', 'published')),
            accepted_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tenant, report_id))""",
        f"""INSERT INTO bench_submissions (tenant, report_id, subject, operation_id, event_id)
           VALUES ($1, $2, '{SUBJECT}', $3, $4)""",  # noqa: S608 - a constant, no value
    ),
}
# The same realistic row, with the event the demo enqueues for it (report.accepted: the
# report id and the same subject, about 60 bytes of payload) instead of a 1 KiB one.
DOMAINS["demo"] = DOMAINS["real"]
KINDS = (
    "plain",
    "round_trip",
    "raw_insert",
    "enqueue",
    "enqueue_prepared",
    "joined_sql",
    "joined",
    "joined_prepared",
)


def domain_args(domain: str, e: Event) -> tuple[Any, ...]:
    if domain == "toy":
        return (e.operation_id,)
    return (e.tenant, e.operation_id, e.operation_id, e.event_id)


def outbox_args(e: Event) -> tuple[Any, ...]:
    return outbox.enqueue_args(e, CATALOG.digest(e), encode_payload(e), None)


async def one_round(
    conn: asyncpg.Connection, domain: str, kinds: tuple[str, ...], n: int, seq: list[int]
) -> dict[str, list[float]]:
    """One round of interleaved one-row domain transactions, one sample per kind in turn.

    ``plain``: the domain INSERT alone. ``round_trip``: plus a bare ``SELECT 1`` (the floor
    of any second statement). ``raw_insert``: plus the ENQUEUE statement, its arguments
    computed before the clock starts (the floor of a one-statement outbox).
    ``enqueue``: plus ``relay.enqueue`` (event ids are the ``Event`` default, UUIDv7).
    ``joined_sql``: the joined statement alone, its outbox arguments computed before the
    clock starts (the floor of the joined form: its SQL, no Python preparation).
    ``joined``: ``relay.enqueue_joined``: the domain INSERT (with RETURNING) and the outbox
    row in one statement, instead of the plain INSERT. ``enqueue_prepared`` and
    ``joined_prepared``: the same two with the event ``relay.prepare``d before the clock
    starts (validation, body and digest before the transaction; its cost is
    ``bench.enqueue_prep_bench``'s).
    """
    insert = DOMAINS[domain][1]
    joined = insert + " RETURNING 1"
    joined_sql = relay_sql.enqueue_joined(joined, len(domain_args(domain, event(0))))
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(n + 50):
        for kind in kinds:
            seq[0] += 1
            e = event(seq[0], SUBJECT) if domain == "demo" else event(seq[0])
            args = domain_args(domain, e)
            raw = outbox_args(e) if kind in ("raw_insert", "joined_sql") else ()
            ready = prepare(e, catalog=CATALOG) if kind.endswith("_prepared") else e
            t0 = time.perf_counter()
            async with conn.transaction():
                if kind in ("joined", "joined_prepared"):
                    await enqueue_joined(conn, joined, *args, event=ready, catalog=CATALOG)
                elif kind == "joined_sql":
                    await conn.fetch(joined_sql, *args, *raw)
                else:
                    await conn.execute(insert, *args)
                if kind == "round_trip":
                    await conn.fetchval("SELECT 1")
                elif kind == "raw_insert":
                    await conn.fetchval(relay_sql.ENQUEUE, *raw)
                elif kind in ("enqueue", "enqueue_prepared"):
                    await enqueue(conn, ready, catalog=CATALOG)
            if i >= 50:  # warm-up: prepared statements, caches
                samples[kind].append(time.perf_counter() - t0)
    return samples


async def wal_bytes(conn: asyncpg.Connection) -> dict[str, float]:
    """WAL written by each statement of the transaction (EXPLAIN (ANALYZE, WAL), rolled back)."""
    out: dict[str, float] = {}
    e = event(10**9)
    # "demo" is the "real" row again (its event differs: demo_outbox_row below)
    statements = {f"{d}_domain": (DOMAINS[d][1], domain_args(d, e)) for d in ("toy", "real")}
    statements["outbox_row"] = (relay_sql.ENQUEUE, outbox_args(e))
    statements["demo_outbox_row"] = (relay_sql.ENQUEUE, outbox_args(event(10**9 + 1, SUBJECT)))
    tx = conn.transaction()
    await tx.start()
    try:
        for label, (stmt, args) in statements.items():
            plan = json.loads(
                await conn.fetchval(f"EXPLAIN (ANALYZE, WAL, FORMAT JSON) {stmt}", *args)
            )
            out[f"wal_{label}_bytes"] = plan[0]["Plan"].get("WAL Bytes", 0)
            out[f"wal_{label}_fpi"] = plan[0]["Plan"].get("WAL FPI", 0)
    finally:
        await tx.rollback()
    return out


async def enqueue_latency(dsn: str, n: int, rounds: int) -> dict[str, float]:
    """p50/p99 per kind and domain: the median over rounds of each round's percentile."""
    conn = await asyncpg.connect(dsn)
    for create, _ in DOMAINS.values():
        await conn.execute(create)
    p50: dict[str, list[float]] = {}
    p99: dict[str, list[float]] = {}
    seq = [0]
    for r in range(rounds):
        for domain in DOMAINS:
            for kind, values in (await one_round(conn, domain, KINDS, n, seq)).items():
                p50.setdefault(f"{domain}_{kind}", []).append(pct(values, 50))
                p99.setdefault(f"{domain}_{kind}", []).append(pct(values, 99))
        print(
            f"  latency round {r + 1}/{rounds}: "
            + " ".join(f"{k}={v[-1]:.0f}" for k, v in p50.items())
        )
    results: dict[str, float] = {}
    for key in p50:
        results[f"{key}_p50_us"] = statistics.median(p50[key])
        results[f"{key}_p99_us"] = statistics.median(p99[key])
    for domain in DOMAINS:
        for kind in KINDS[1:]:
            for q in ("p50", "p99"):
                base = results[f"{domain}_plain_{q}_us"]
                results[f"{domain}_{kind}_adds_{q}"] = results[f"{domain}_{kind}_{q}_us"] / base - 1
    results.update(await wal_bytes(conn))
    await conn.close()
    return results


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1e6


async def throughput(
    conn: asyncpg.Connection,
    dsn: str,
    url: str,
    topo: Topology,
    rows: int,
    rounds: int,
    backlog: int = 0,
) -> dict[str, float]:
    """Best-of-rounds relay and raw rows per second, the two alternating."""
    channel = await (amqp := await aio_pika.connect(url)).channel()
    queues = await declare(channel, topo)
    await fill(conn, rows)
    raw: list[float] = []
    ours: list[float] = []
    for _ in range(rounds):
        for label, fn, sink in (("raw", raw_relay, raw), ("relay", accord_relay, ours)):
            await conn.execute(RESET)
            await conn.execute("VACUUM relay.outbox")
            await queues["report"].purge()
            rate = await fn(dsn, url, topo.exchange, rows)
            sink.append(rate)
            print(f"  {label:6s} {rate:8.0f} rows/s")
    await queues["report"].purge()
    results = {
        "raw_rows_per_s": max(raw),
        "relay_rows_per_s": max(ours),
        "throughput_ratio": max(ours) / max(raw),
    }
    if backlog:
        # The same relay run beside a backlog in backoff, alternating with an empty run.
        await conn.execute(BACKLOG, backlog)
        await conn.execute("VACUUM ANALYZE relay.outbox")
        beside: list[float] = []
        for _ in range(rounds):
            await conn.execute(RESET)
            await queues["report"].purge()
            rate = await accord_relay(dsn, url, topo.exchange, rows)
            beside.append(rate)
            print(f"  relay beside {backlog} rows in backoff {rate:8.0f} rows/s")
        results.update(
            backlog_rows=backlog,
            relay_beside_backlog_rows_per_s=max(beside),
            backlog_ratio=max(beside) / max(ours),
        )
    await queues["report"].purge()
    await amqp.close()
    return results


async def main(
    rows: int,
    rounds: int,
    tx: int,
    latency_rounds: int,
    latency_only: bool,
    backlog: int,
    trickle_rate: float = 0.0,
    producer_count: int = 0,
) -> Any:
    settings = load_settings()
    name = f"accord_bench_{uuid.uuid4().hex[:8]}"
    admin_dsn = urlunsplit(urlsplit(settings.pg_dsn)._replace(path="/postgres"))
    dsn = urlunsplit(urlsplit(settings.pg_dsn)._replace(path=f"/{name}"))
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    topo = Topology(
        f"bench{uuid.uuid4().hex[:6]}", (WorkflowQueue("report", ("report.accepted.v1",)),)
    )
    results: dict[str, Any] = {"rows": rows, "batch": BATCH, "tx_per_round": tx}
    try:
        conn = await asyncpg.connect(dsn)
        await migrate.migrate(conn)
        if producer_count:
            await conn.close()
            results.update(await producers(dsn, producer_count, 3.0, rounds))
            return results
        if trickle_rate:
            await conn.close()
            results.update(await trickle(dsn, settings.amqp_url, topo, trickle_rate, rows))
            return results
        if not latency_only:
            results.update(
                await throughput(conn, dsn, settings.amqp_url, topo, rows, rounds, backlog)
            )
        await conn.close()
        results.update(await enqueue_latency(dsn, tx, latency_rounds))
    finally:
        if (not latency_only or trickle_rate) and not producer_count:
            amqp = await aio_pika.connect(settings.amqp_url)
            channel = await amqp.channel()
            exchanges, names = topo.names()
            for q in names:
                await channel.queue_delete(q)
            for x in exchanges:
                await channel.exchange_delete(x)
            await amqp.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return results


def report(r: dict[str, Any]) -> None:
    if "producers_notify_ratio" in r:
        print(
            f"{r['producers']} producers, one-row enqueue transactions / the outbox INSERT"
            f" without a wake-up ({r['producers_bare_per_s']:.0f} commits/s):"
            f" every commit notifying {r['producers_notify_ratio']:.2f}"
            f" ({r['producers_notify_per_s']:.0f}/s), a relay's awake promise in force"
            f" {r['producers_promised_ratio']:.2f} ({r['producers_promised_per_s']:.0f}/s)"
        )
        return
    if "trickle_cpu_ratio" in r:
        for label, what in (
            ("backlog", f"draining a backlog of {r['trickle_events']}"),
            ("trickle", f"at a steady {r['trickle_rate']:.0f} events/s"),
        ):
            print(
                f"relay {what}: {r[label + '_cpu_us_per_event']:.0f} µs of CPU per event,"
                f" {r[label + '_events_per_cycle']:.1f} events per cycle,"
                f" {r[label + '_claims_per_event']:.2f} claims per event; publish lag p50"
                f" {r[label + '_lag_p50_ms']:.1f} ms, p99 {r[label + '_lag_p99_ms']:.1f} ms"
            )
        print(f"trickle / backlog, CPU per event: {r['trickle_cpu_ratio']:.2f}")
        return
    if "backlog_ratio" in r:
        print(
            f"relay beside {r['backlog_rows']} rows in backoff / empty: {r['backlog_ratio']:.2f}"
            f" ({r['relay_beside_backlog_rows_per_s']:.0f}/s vs {r['relay_rows_per_s']:.0f}/s;"
            " goal >= 0.9)"
        )
    if "throughput_ratio" in r:
        print(
            f"relay/raw throughput: {r['throughput_ratio']:.2f} "
            f"(relay {r['relay_rows_per_s']:.0f}/s, raw {r['raw_rows_per_s']:.0f}/s; goal >= 0.8)"
        )
    for domain, label in (
        ("toy", "toy domain row"),
        ("real", "realistic domain row"),
        ("demo", "realistic domain row with its own event (the demo's payload, ~60 B)"),
    ):
        d = f"{domain}_"
        print(
            f"{label}: enqueue adds p50 {r[d + 'enqueue_adds_p50']:+.1%} "
            f"({r[d + 'plain_p50_us']:.0f} → {r[d + 'enqueue_p50_us']:.0f} µs; goal <= +15%), "
            f"p99 {r[d + 'enqueue_adds_p99']:+.1%} "
            f"({r[d + 'plain_p99_us']:.0f} → {r[d + 'enqueue_p99_us']:.0f} µs)"
        )
        print(
            f"  joined (one statement) adds p50 {r[d + 'joined_adds_p50']:+.1%}"
            f" ({r[d + 'joined_p50_us']:.0f} µs; goal <= +15%); its SQL alone (the outbox"
            f" arguments computed before the clock) {r[d + 'joined_sql_adds_p50']:+.1%},"
            f" so enqueue's Python in the transaction"
            f" {r[d + 'joined_p50_us'] - r[d + 'joined_sql_p50_us']:.0f} µs"
        )
        print(
            f"  prepared before the transaction (relay.prepare): joined adds p50"
            f" {r[d + 'joined_prepared_adds_p50']:+.1%} (goal <= +15%), enqueue"
            f" {r[d + 'enqueue_prepared_adds_p50']:+.1%}; the Python left in the transaction"
            f" {r[d + 'joined_prepared_p50_us'] - r[d + 'joined_sql_p50_us']:.0f} µs"
        )
        print(
            f"  floors at p50: a second statement (SELECT 1) {r[d + 'round_trip_adds_p50']:+.1%}, "
            f"the bare ENQUEUE statement {r[d + 'raw_insert_adds_p50']:+.1%}"
        )
    wal = ", ".join(
        f"{label} {r[f'wal_{key}_bytes']} B ({r[f'wal_{key}_fpi']} full-page images)"
        for key, label in (
            ("toy_domain", "toy domain"),
            ("real_domain", "realistic domain"),
            ("outbox_row", "outbox row"),
            ("demo_outbox_row", "the demo's outbox row"),
        )
    )
    print(f"WAL per statement: {wal}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tx", type=int, default=1000, help="transactions per kind per round")
    parser.add_argument("--latency-rounds", type=int, default=3)
    parser.add_argument("--latency-only", action="store_true", help="skip the throughput part")
    parser.add_argument(
        "--backlog", type=int, default=0, help="also run beside this many rows in backoff"
    )
    parser.add_argument(
        "--trickle",
        type=float,
        default=0.0,
        help="only: the relay's CPU per event at this steady rate (--rows events) and draining"
        " a backlog of as many",
    )
    parser.add_argument(
        "--producers",
        type=int,
        default=0,
        help="only: this many producer processes' commit rate, enqueues notifying or under a"
        " relay's awake promise, against the INSERT without a wake-up (3 s per kind per round)",
    )
    args = parser.parse_args()
    results = runtime.run(
        main,
        args.rows,
        args.rounds,
        args.tx,
        args.latency_rounds,
        args.latency_only,
        args.backlog,
        args.trickle,
        args.producers,
    )
    print(json.dumps(results, indent=2))
    report(results)


if __name__ == "__main__":
    cli()
