"""Retention (migration 0023): storage per million events with retention on and off, and what
the pruner costs the jobs that run beside it.

    .venv/bin/python -m bench.retention_bench [--events 2000] [--windows 4] [--backlog 45000]
                                              [--seconds 3] [--rounds 2] [--batch 200]

Storage: each event leaves the rows the demo pipeline writes for it, through the shipped code
(enqueue, the relay's settle as one UPDATE, the consumer's inbox reserve and jobs.submit, the
worker's claim, effect begin/finish, result manifest and fenced publish); no broker. ``off``
keeps every row of ``--events`` events and scales to a million. ``on`` runs the same events
in ``--windows`` windows with a retention of ``RETENTION_S`` seconds: after each window it
waits out the retention, prunes every table in bounded batches (outbox, inbox, deliveries,
jobs with their keys, effects and results) and runs VACUUM as autovacuum would, so what the
database holds at the end is one window of rows plus free space it reuses (index pages freed by
one window are reused by the next: the size levels off after two windows). Sizes are
``pg_total_relation_size`` (heap, indexes, TOAST) of every table after a VACUUM.

Cost: ``--backlog`` finished jobs (each with an effect record and a result manifest row) that
are past the retention, and queued jobs that 4 workers claim and publish one at a time
(``Store.claim`` + ``Store.publish``) for ``--seconds``: ``alone`` runs the workers only,
``paced`` adds the worker's prune loop as it ships (batches of ``--batch``; after a full batch
a pause as long as the batch took), ``greedy`` the same batches back to back (the worst case).
Prints prune batch p50/p99 and jobs pruned/s, claim latency p50/p99 and jobs/s, and the ratio
of each to ``alone``, the variants' order reversed every second round so that a drifting
machine favours none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg

from accord.consumers import Consumer, Delivery, reserve
from accord.consumers import sql as consumer_sql
from accord.demo.catalog import demo_catalog
from accord.jobs import EffectState, Store, submit
from accord.jobs import retention as jobs_retention
from accord.relay import outbox
from accord.relay import sql as relay_sql
from accord.runtime import run
from accord.schemas.events import Event
from bench.jobs_bench import drop_database, fresh_database

CATALOG = demo_catalog()
TENANT, WORKFLOW, OWNER = "acme", "report", "bench-owner"
RETENTION_S = 2.0
BATCH = 200  # the default of jobs_prune_batch
WORKERS = 4
QUEUED_JOBS = 30_000
TABLES = (
    "relay.outbox",
    "consumers.inbox",
    "consumers.deliveries",
    "jobs.operations",
    "jobs.jobs",
    "jobs.effects",
    "jobs.results",
    "jobs.pruned_attempts",  # tombstones: one per pruned attempt, one more retention (0054)
)
SIZES = """
SELECT t AS name, (SELECT reltuples FROM pg_class WHERE oid = t::regclass)::bigint AS estimate,
       pg_total_relation_size(t::regclass) AS bytes
FROM unnest($1::text[]) AS t
"""
MARK_PUBLISHED = (
    "UPDATE relay.outbox SET state = 'published', published_at = now(), publish_id = $2"
    " WHERE id = $1"
)


# -- storage --------------------------------------------------------------------------------


def event(n: int) -> Event:
    payload = {"report_id": f"r{n}", "subject": "quarterly numbers"}
    return Event(
        tenant=TENANT,
        operation_id=f"report:{n}",
        type="report.accepted",
        version=1,
        payload=payload,
    )


async def one_event(conn: asyncpg.Connection, store: Store, consumer: Consumer, n: int) -> None:
    """The rows one event leaves, written as the pipeline writes them."""
    accepted = event(n)
    async with conn.transaction():
        row_id = await outbox.enqueue(conn, accepted, catalog=CATALOG)
    await conn.execute(MARK_PUBLISHED, row_id, str(uuid.uuid4()))  # the relay's settle
    async with conn.transaction():
        assert await reserve(conn, consumer, accepted, Delivery(publish_id=str(row_id)))
        await submit(
            conn,
            tenant=TENANT,
            workflow=WORKFLOW,
            operation_id=accepted.operation_id,
            digest=CATALOG.digest(accepted),
            payload=dict(accepted.payload),
        )
    # Any queued job: another task may have taken this event's job (each takes one per event).
    leases = await store.claim(WORKFLOW, OWNER, lease_s=60, limit=1)
    while not leases:
        await anyio.sleep(0.001)
        leases = await store.claim(WORKFLOW, OWNER, lease_s=60, limit=1)
    [lease] = leases
    await store.begin_effect(lease, "provider.create_report", f"intent-{n}")
    await store.finish_effect(
        lease, "provider.create_report", EffectState.SUCCEEDED, receipt=f"rcpt-{n}"
    )

    async def manifest(tx: Any) -> None:
        await Store.record_result(tx, lease, f"sha256-{uuid.uuid4().hex * 2}", "sha256:digest")

    await store.publish(lease, manifest)


async def process(dsn: str, first: int, count: int, tasks: int = 4) -> None:
    consumer = Consumer(WORKFLOW, CATALOG, replay_window_s=3600.0)
    numbers = iter(range(first, first + count))

    async def loop() -> None:
        # Sizes do not depend on when commits reach the disk: spare the fsync per commit.
        conn = await asyncpg.connect(dsn, server_settings={"synchronous_commit": "off"})
        try:
            store = Store(conn)
            for n in numbers:
                await one_event(conn, store, consumer, n)
        finally:
            await conn.close()

    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(loop)


async def prune_all(conn: asyncpg.Connection) -> dict[str, int]:
    """Every pruner, in bounded batches until each comes back short; then VACUUM."""
    removed = {"outbox": 0, "inbox": 0, "deliveries": 0, "jobs": 0}
    statements = {  # each with its arguments after the retention and the batch
        "outbox": (relay_sql.PRUNE, ()),
        "inbox": (consumer_sql.PRUNE_INBOX, (WORKFLOW,)),
        "deliveries": (consumer_sql.PRUNE_DELIVERIES, (WORKFLOW,)),
    }
    for name, (statement, args) in statements.items():
        while True:
            if name == "outbox":  # it answers its count (SELECT count(*) FROM gone)
                done = int(await conn.fetchval(statement, RETENTION_S, BATCH, *args))
            else:  # a DELETE's command tag
                done = int((await conn.execute(statement, RETENTION_S, BATCH, *args)).split()[-1])
            removed[name] += done
            if done < BATCH:
                break
    while True:
        async with conn.transaction():
            pruned = await jobs_retention.prune(
                conn, retention_s=RETENTION_S, audit_retention_s=RETENTION_S, limit=BATCH
            )
        removed["jobs"] += pruned.jobs
        if not pruned.full(BATCH):
            break
    await conn.execute(f"VACUUM {', '.join(TABLES)}")  # what autovacuum does between batches
    return removed


async def sizes(conn: asyncpg.Connection) -> dict[str, tuple[int, int]]:
    """(rows, bytes) of each table, after the VACUUM autovacuum would have run by then (the
    dead versions a job's updates leave would otherwise make the figure depend on timing)."""
    await conn.execute(f"VACUUM ANALYZE {', '.join(TABLES)}")
    out: dict[str, tuple[int, int]] = {}
    for row in await conn.fetch(SIZES, list(TABLES)):
        rows = await conn.fetchval(f"SELECT count(*) FROM {row['name']}")  # noqa: S608 - constants
        out[row["name"]] = (rows, row["bytes"])
    return out


async def storage(admin: str, events: int, windows: int) -> None:
    footprint: dict[str, dict[str, tuple[int, int]]] = {}
    for mode in ("off", "on"):
        dsn = await fresh_database(admin)
        try:
            conn = await asyncpg.connect(dsn)
            await Store(conn).register_workflow(WORKFLOW, OWNER, effects_enabled=True)
            started = time.perf_counter()
            if mode == "off":
                await process(dsn, 0, events)
            else:
                per = events // windows
                for w in range(windows):
                    await process(dsn, w * per, per)
                    if w == windows - 1:
                        break  # the last window is inside the retention: it stays
                    await anyio.sleep(RETENTION_S + 0.2)  # the whole window is past it now
                    await prune_all(conn)
            footprint[mode] = await sizes(conn)
            print(f"storage {mode}: {events} events in {time.perf_counter() - started:.1f} s")
            await conn.close()
        finally:
            await drop_database(admin, dsn)
    per = events // windows
    print(f"\nstorage per table ({events} events; on = {windows} windows of {per}, one kept)")
    print(
        f"  {'table':<22}{'off rows':>10}{'off MB':>9}{'on rows':>9}{'on MB':>8}"
        f"{'off GB/1M ev':>14}"
    )
    totals = {"off": [0, 0], "on": [0, 0]}
    for table in TABLES:
        (r_off, b_off), (r_on, b_on) = footprint["off"][table], footprint["on"][table]
        totals["off"][0] += r_off
        totals["off"][1] += b_off
        totals["on"][0] += r_on
        totals["on"][1] += b_on
        print(
            f"  {table:<22}{r_off:>10}{b_off / 1e6:>9.2f}{r_on:>9}{b_on / 1e6:>8.2f}"
            f"{b_off / events * 1e6 / 1e9:>14.3f}"
        )
    (rows_off, bytes_off), (rows_on, bytes_on) = totals["off"], totals["on"]
    print(
        f"  {'total':<22}{rows_off:>10}{bytes_off / 1e6:>9.2f}{rows_on:>9}{bytes_on / 1e6:>8.2f}"
        f"{bytes_off / events * 1e6 / 1e9:>14.3f}"
    )
    print(
        f"retention off: {rows_off / events:.1f} rows and {bytes_off / events:.0f} bytes per"
        f" event = {rows_off / events:.1f} M rows, {bytes_off / events * 1e6 / 1e9:.2f} GB"
        " per million events, growing with every event"
    )
    print(
        f"retention on: holds {rows_on} rows ({rows_on / per:.1f} per event of the window"
        f" kept), {bytes_on / 1e6:.2f} MB = {bytes_on / per:.0f} bytes per retained event"
        f" ({bytes_on / per / (bytes_off / events):.2f} x the bytes of a row set kept"
        f" without pruning: free space VACUUM left for reuse); {bytes_on / bytes_off:.2f} x"
        f" the storage of retention off after {windows} windows"
    )


# -- cost -------------------------------------------------------------------------------------

BACKLOG = """
WITH o AS (
    INSERT INTO jobs.operations (tenant, workflow, operation_id, job_id)
    SELECT 'acme', 'report', 'old-' || $2 || '-' || i, nextval('jobs.jobs_job_id_seq')
    FROM generate_series(1, $1) i RETURNING *
), j AS (
    INSERT INTO jobs.jobs (job_id, tenant, workflow, operation_id, digest, payload, state,
                           generation, attempts, owner, attempt_id, epoch, created_at, updated_at)
    OVERRIDING SYSTEM VALUE
    SELECT job_id, tenant, workflow, operation_id, 'sha256:d',
           '{"report_id": "r", "subject": "quarterly numbers"}', 'succeeded', 1, 1, 'bench-owner',
           gen_random_uuid(), 1, now() - interval '30 days', now() - interval '30 days'
    FROM o RETURNING job_id, attempt_id
), e AS (
    INSERT INTO jobs.effects (tenant, job_id, effect_key, seq, intent_digest, state, receipt,
                              attempt_id, generation, begun_at, finished_at)
    SELECT 'acme', job_id, 'provider.create_report', 1, 'sha256:i', 'succeeded', 'rcpt',
           attempt_id, 1, now() - interval '30 days', now() - interval '30 days'
    FROM j RETURNING job_id
)
INSERT INTO jobs.results (job_id, tenant, object_key, content_digest, created_at)
SELECT job_id, 'acme', 'sha256-' || md5(job_id::text) || md5(job_id::text), 'sha256:x',
       now() - interval '30 days'
FROM e
"""
QUEUED = """
WITH o AS (
    INSERT INTO jobs.operations (tenant, workflow, operation_id, job_id)
    SELECT 'acme', 'report', 'new-' || $2 || '-' || i, nextval('jobs.jobs_job_id_seq')
    FROM generate_series(1, $1) i RETURNING *
)
INSERT INTO jobs.jobs (job_id, tenant, workflow, operation_id, digest, payload)
OVERRIDING SYSTEM VALUE
SELECT job_id, tenant, workflow, operation_id, 'sha256:d',
       '{"report_id": "r", "subject": "quarterly numbers"}'
FROM o
"""


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def workload(dsn: str, seconds: float, *, pruner: str, batch: int) -> dict[str, float]:
    """4 workers claiming and publishing one job at a time for ``seconds``, and beside them
    no pruner (``alone``), the worker's prune loop (``paced``: after a full batch, a pause as
    long as the batch took) or batches back to back (``greedy``)."""
    claims: list[float] = []
    batches: list[float] = []
    done = [0, 0]  # jobs published, jobs pruned

    async def worker() -> None:
        conn = await asyncpg.connect(dsn)
        store = Store(conn, backoff_base_s=0.0)
        try:
            while True:
                started = time.perf_counter()
                leases = await store.claim(WORKFLOW, OWNER, lease_s=60, limit=1)
                claims.append(time.perf_counter() - started)
                for lease in leases:
                    await store.publish(lease)
                    done[0] += 1
        finally:
            await conn.close()

    async def prune() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            while True:
                started = time.perf_counter()
                async with conn.transaction():
                    pruned = await jobs_retention.prune(
                        conn, retention_s=86400.0, audit_retention_s=86400.0, limit=batch
                    )
                took = time.perf_counter() - started
                batches.append(took)
                done[1] += pruned.jobs
                if not pruned.full(batch):
                    await anyio.sleep(0.05)
                elif pruner == "paced":
                    await anyio.sleep(took)
        finally:
            await conn.close()

    with anyio.move_on_after(seconds):
        async with anyio.create_task_group() as tg:
            for _ in range(WORKERS):
                tg.start_soon(worker)
            if pruner != "alone":
                tg.start_soon(prune)
    return {
        "claim_p50": pct(claims, 0.5) * 1e3,
        "claim_p99": pct(claims, 0.99) * 1e3,
        "jobs_s": done[0] / seconds,
        "prune_p50": pct(batches, 0.5) * 1e3,
        "prune_p99": pct(batches, 0.99) * 1e3,
        "pruned_s": done[1] / seconds,
    }


async def cost(admin: str, backlog: int, seconds: float, rounds: int, batch: int) -> None:
    dsn = await fresh_database(admin)
    try:
        conn = await asyncpg.connect(dsn)
        await Store(conn).register_workflow(WORKFLOW, OWNER, effects_enabled=True)
        await conn.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
        started = time.perf_counter()
        for start in range(0, backlog, 10_000):
            await conn.execute(BACKLOG, min(10_000, backlog - start), str(start))
        await conn.execute(QUEUED, QUEUED_JOBS, "q")
        await conn.execute("VACUUM ANALYZE jobs.jobs, jobs.operations, jobs.effects, jobs.results")
        print(
            f"\ncost: {backlog} expired finished jobs (an effect and a result each), "
            f"{QUEUED_JOBS} queued, filled in {time.perf_counter() - started:.1f} s; "
            f"{WORKERS} workers claim + publish, {seconds:g} s per run, prune batch {batch}"
        )
        variants = ("alone", "paced", "greedy")
        figures: dict[str, list[float]] = {}
        for rnd in range(1, rounds + 1):
            order = variants if rnd % 2 else tuple(reversed(variants))
            results = {v: await workload(dsn, seconds, pruner=v, batch=batch) for v in order}
            alone = results["alone"]
            for name in variants:
                r = results[name]
                line = (
                    f"round {rnd} {name:<6}: claim p50 {r['claim_p50']:5.2f} ms"
                    f" p99 {r['claim_p99']:6.2f} ms, {r['jobs_s']:4.0f} jobs/s"
                )
                if name != "alone":
                    line += (
                        f"; prune batch p50 {r['prune_p50']:5.1f} ms p99 {r['prune_p99']:5.1f}"
                        f" ms, {r['pruned_s']:4.0f} jobs pruned/s"
                    )
                    for key in ("claim_p50", "claim_p99", "jobs_s"):
                        figures.setdefault(f"{name} {key} / alone", []).append(r[key] / alone[key])
                    for key in ("prune_p50", "prune_p99", "pruned_s"):
                        figures.setdefault(f"{name} {key}", []).append(r[key])
                print(line)
        left = await conn.fetchval(
            "SELECT count(*) FROM jobs.jobs WHERE updated_at < now() - interval '1 day'"
        )
        print(f"expired finished jobs left after the runs: {left}")
        for key, values in figures.items():
            low, mid, high = min(values), statistics.median(values), max(values)
            print(f"over {rounds} rounds  {key:<28} median {mid:8.2f}  ({low:.2f}-{high:.2f})")
        await conn.close()
    finally:
        await drop_database(admin, dsn)


async def main(args: argparse.Namespace) -> None:
    admin = os.environ.get("ACCORD_PG_DSN_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
    steps: list[Callable[[], Awaitable[None]]] = []
    if not args.skip_storage:
        steps.append(lambda: storage(admin, args.events, args.windows))
    if not args.skip_cost:
        steps.append(lambda: cost(admin, args.backlog, args.seconds, args.rounds, args.batch))
    for step in steps:
        await step()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--backlog", type=int, default=45_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=BATCH, help="the cost phase's prune batch")
    parser.add_argument("--skip-storage", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
