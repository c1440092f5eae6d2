"""Claim → fenced publish throughput of the jobs store for no-op jobs, against the raw limit
and PgQueuer, same machine, same run.

    .venv/bin/python -m bench.jobs_bench [--jobs 20000] [--workers 8] [--batch 50] [--rounds 1]

Each variant drains the same number of no-op jobs with the same number of workers and the
same claim batch size, on its own fresh database, synchronous_commit on (the server default).
Each variant's tables are analyzed once filled, as autovacuum leaves them after a backlog
arrives (statistics that say nothing runs), so no plan changes in mid-run:

* ``raw``: asyncpg, one ``UPDATE … FOR UPDATE SKIP LOCKED`` claim per batch, then one
  autocommit ``UPDATE … SET state = 'done' WHERE id = $1`` per job. No fence, no lease check:
  the floor any claim/complete loop pays.
* ``accord``: ``Store.claim(limit=batch)`` then ``Store.publish(lease, callback)`` per job with
  a no-op database callback: BEGIN, fence, callback, fence again + succeeded, COMMIT.
* ``raw-tx``: context for ``accord`` (not the goal's baseline): the raw loop with the same
  transaction shape, BEGIN, lock the row (``FOR NO KEY UPDATE``), UPDATE, COMMIT per job.
* ``accord-nocb``: ``Store.publish(lease)`` without a callback: the fence and the transition
  are one statement.
* ``pgqueuer``: PgQueuer 1.6.0 (installed from PyPI into its own virtualenv under var/bench,
  never into the project), its QueueManager in drain mode with a no-op entrypoint, one
  manager per worker. It batches its completions; accord commits each publish.

With ``--decompose``, two more variants say where ``accord-nocb``'s gap to ``raw`` lies
(experiments, not products: neither fences anything):

* ``table``: the raw loop's two statements spelled on ``jobs.jobs`` (the claim stamps owner,
  attempt id, generation, epoch and lease; the complete is a bare ``UPDATE`` by id): what the
  job row itself costs.
* ``unfenced``: ``Store.claim`` then that bare ``UPDATE`` per job: ``accord-nocb`` without
  its fence.

With ``--worker``, the bench runs the shipped worker instead (bench/jobs_worker.py): ``raw``
and ``accord`` (the loop) over ``--jobs``, then ``worker``: ``accord.jobs.runner.Worker``
with ``--workers`` slots, its pool, journal file, heartbeats and result objects, over
``--worker-jobs`` jobs that each record one effect (an in-process provider), put one result
object and publish its manifest row. It prints jobs/s and the worker's CPU per job next to
the loops, the ratios to them, and the per-call cost of the store's seam and of a pool
round trip. With ``--decompose`` it adds what the worker replaced, each alone, to show each
gain: ``worker-pooled``, whose job calls each take a pool connection (no held connection),
and ``worker-2commit``, whose objects are written as before (a temporary file fsynced, then
linked, then its directory fsynced: two journal commits per object).

Prints jobs/s per variant and the ratio to ``raw`` measured in the same round. Each product
runs next to its baseline, and every second round runs in reverse order, so that a drifting
machine favours neither side of a ratio; the figure is each ratio's median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg

from accord.jobs import Store, sql
from accord.runtime import run
from accord.schemas import migrate
from bench import jobs_worker

ROOT = Path(__file__).resolve().parents[1]
PGQUEUER_VENV = ROOT / "var" / "bench" / "venv-pgqueuer"
PGQUEUER_VERSION = "1.6.0"
WORKFLOW, OWNER = "bench", "bench-owner"

RAW_SETUP = """
CREATE TABLE bench_raw (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state text NOT NULL DEFAULT 'queued',
    owner text,
    lease_expires_at timestamptz,
    payload jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX bench_raw_queued ON bench_raw (id) WHERE state = 'queued';
"""
RAW_FILL = "INSERT INTO bench_raw (payload) SELECT '{}'::jsonb FROM generate_series(1, $1)"
RAW_CLAIM = """
UPDATE bench_raw r SET state = 'running', owner = $1,
       lease_expires_at = now() + interval '60 seconds'
FROM (SELECT id FROM bench_raw WHERE state = 'queued' ORDER BY id LIMIT $2
      FOR UPDATE SKIP LOCKED) c
WHERE r.id = c.id RETURNING r.id
"""
RAW_COMPLETE = "UPDATE bench_raw SET state = 'done', lease_expires_at = NULL WHERE id = $1"
RAW_LOCK = "SELECT id FROM bench_raw WHERE id = $1 AND owner = $2 FOR NO KEY UPDATE"
RAW_COMPLETE_MANY = (
    "UPDATE bench_raw SET state = 'done', lease_expires_at = NULL WHERE id = ANY($1::bigint[])"
)

# --decompose: the raw loop's statements on the job table (experiments; no fence).
TABLE_CLAIM = """
UPDATE jobs.jobs j SET state = 'running', owner = $1, attempt_id = gen_random_uuid(), epoch = 1,
       generation = j.generation + 1, attempts = j.attempts + 1,
       lease_expires_at = now() + interval '60 seconds'
FROM (SELECT job_id FROM jobs.jobs
      WHERE workflow = $2 AND state = 'queued' AND run_after <= now()
      ORDER BY workflow, run_after, job_id LIMIT $3 FOR UPDATE SKIP LOCKED) c
WHERE j.job_id = c.job_id RETURNING j.job_id
"""
TABLE_COMPLETE = (
    "UPDATE jobs.jobs SET state = 'succeeded', lease_expires_at = NULL WHERE job_id = $1"
)

PGQUEUER_SCRIPT = r"""
import asyncio, json, sys, time
import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode

async def main(dsn, n, workers, batch):
    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    for start in range(0, n, 5000):
        k = min(5000, n - start)
        await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
    await conn.close()

    async def one():
        c = await asyncpg.connect(dsn)
        qm = QueueManager(Queries(AsyncpgDriver(c)))

        @qm.entrypoint("noop")
        async def noop(job):
            return None

        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain,
                     dequeue_timeout=__import__("datetime").timedelta(seconds=0.2))
        await c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(workers)))
    elapsed = time.perf_counter() - t0
    c = await asyncpg.connect(dsn)
    left = await c.fetchval("SELECT count(*) FROM pgqueuer")
    await c.close()
    print(json.dumps({"elapsed": elapsed, "left": left}))

try:
    import uvloop
    uvloop.install()
except ImportError:
    pass
asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
"""


def with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


async def fresh_database(admin_dsn: str) -> str:
    name = f"accord_bench_jobs_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = with_database(admin_dsn, name)
    conn = await asyncpg.connect(dsn)
    try:
        await migrate.migrate(conn)
    finally:
        await conn.close()
    return dsn


async def drop_database(admin_dsn: str, dsn: str) -> None:
    name = urlsplit(dsn).path.lstrip("/")
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def drain(workers: int, loop: Callable[[], Awaitable[int]]) -> tuple[float, int]:
    """Run ``workers`` copies of ``loop`` (each returns jobs done); elapsed seconds, total."""
    done: list[int] = []

    async def one() -> None:
        done.append(await loop())

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(one)
    return time.perf_counter() - started, sum(done)


async def bench_raw(
    dsn: str, n: int, workers: int, batch: int, *, batched: bool = False, tx: bool = False
) -> tuple[float, int]:
    pool = await asyncpg.create_pool(dsn, min_size=workers, max_size=workers)
    assert pool is not None
    try:
        await pool.execute(RAW_SETUP)
        await pool.execute(RAW_FILL, n)
        await pool.execute("ANALYZE bench_raw")

        async def loop() -> int:
            me, count = uuid.uuid4().hex, 0
            async with pool.acquire() as conn:
                while ids := await conn.fetch(RAW_CLAIM, me, batch):
                    if batched:
                        await conn.execute(RAW_COMPLETE_MANY, [row["id"] for row in ids])
                    elif tx:
                        for row in ids:
                            async with conn.transaction():
                                await conn.fetchval(RAW_LOCK, row["id"], me)
                                await conn.execute(RAW_COMPLETE, row["id"])
                    else:
                        for row in ids:
                            await conn.execute(RAW_COMPLETE, row["id"])
                    count += len(ids)
            return count

        return await drain(workers, loop)
    finally:
        await pool.close()


async def noop(tx: Any) -> None:
    return None


async def bench_accord(
    dsn: str, n: int, workers: int, batch: int, *, mode: str
) -> tuple[float, int]:
    """``mode``: callback, nocb or batch (the products); table or unfenced (--decompose)."""
    pool = await asyncpg.create_pool(dsn, min_size=workers, max_size=workers)
    assert pool is not None
    try:
        store = Store(pool)
        await store.register_workflow(WORKFLOW, OWNER)
        async with pool.acquire() as conn, conn.transaction():
            await conn.executemany(
                sql.SUBMIT, [("t", WORKFLOW, f"op{i}", "d", "{}", 5) for i in range(n)]
            )
        await pool.execute("ANALYZE jobs.jobs, jobs.tenants, jobs.effects")

        async def one_batch(conn: asyncpg.Connection, mine: Store) -> int:
            """Claim one batch and complete it; the number of jobs done (0: drained)."""
            if mode == "table":
                rows = await conn.fetch(TABLE_CLAIM, OWNER, WORKFLOW, batch)
                for row in rows:
                    await conn.execute(TABLE_COMPLETE, row["job_id"])
                return len(rows)
            leases = await mine.claim(WORKFLOW, OWNER, lease_s=60, limit=batch)
            if mode == "batch":
                published = await mine.publish_many(leases)
                assert not published.refused, published.refused
            elif mode == "unfenced":
                for lease in leases:
                    await conn.execute(TABLE_COMPLETE, lease.job_id)
            else:
                for lease in leases:
                    await mine.publish(lease, noop if mode == "callback" else None)
            return len(leases)

        async def loop() -> int:
            count = 0
            # Like the raw loop, each worker keeps its own connection.
            async with pool.acquire() as conn:
                mine = Store(conn)
                while done := await one_batch(conn, mine):
                    count += done
            return count

        elapsed, done = await drain(workers, loop)
        ok = await pool.fetchval("SELECT count(*) FROM jobs.jobs WHERE state = 'succeeded'")
        assert ok == n == done, (ok, n, done)
        return elapsed, done
    finally:
        await pool.close()


def ensure_pgqueuer_venv() -> Path:
    """var/bench/venv-pgqueuer with pgqueuer==1.6.0 and its asyncpg driver (pip, from PyPI),
    created once. The driver is an extra: plain ``pgqueuer`` does not bring asyncpg."""
    python = PGQUEUER_VENV / "bin" / "python"
    probe = [str(python), "-c", "import asyncpg, pgqueuer; print(pgqueuer.__version__)"]
    if python.exists():
        done = subprocess.run(probe, capture_output=True, text=True, check=False)
        if done.stdout.strip() == PGQUEUER_VERSION:
            return python
    PGQUEUER_VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(PGQUEUER_VENV)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            f"pgqueuer[asyncpg]=={PGQUEUER_VERSION}",
            "uvloop",
        ],
        check=True,
    )
    return python


async def bench_pgqueuer(
    python: Path, dsn: str, n: int, workers: int, batch: int
) -> tuple[float, int]:
    done = await anyio.run_process(
        [str(python), "-c", PGQUEUER_SCRIPT, dsn, str(n), str(workers), str(batch)], check=True
    )
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert result["left"] == 0, result
    return float(result["elapsed"]), n


async def main(args: argparse.Namespace) -> None:
    admin = os.environ.get("ACCORD_PG_DSN_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
    if args.worker:
        await main_worker(args, admin)
        return
    python = None if args.skip_pgqueuer else ensure_pgqueuer_venv()
    n, w, b = args.jobs, args.workers, args.batch
    print(f"jobs bench: {n} no-op jobs, {w} workers, claim batch {b}, rounds {args.rounds}")
    ratios: dict[str, list[float]] = {}
    for rnd in range(1, args.rounds + 1):
        # Each product runs next to the baseline its ratio divides by.
        variants: dict[str, Callable[[str], Awaitable[tuple[float, int]]]] = {
            "raw": lambda d: bench_raw(d, n, w, b),
            "accord-nocb": lambda d: bench_accord(d, n, w, b, mode="nocb"),
            "accord": lambda d: bench_accord(d, n, w, b, mode="callback"),
            "raw-tx": lambda d: bench_raw(d, n, w, b, tx=True),
            "raw-batch": lambda d: bench_raw(d, n, w, b, batched=True),
            "accord-batch": lambda d: bench_accord(d, n, w, b, mode="batch"),
        }
        if python is not None:
            variants["pgqueuer"] = lambda d: bench_pgqueuer(python, d, n, w, b)
        if args.decompose:
            variants["table"] = lambda d: bench_accord(d, n, w, b, mode="table")
            variants["unfenced"] = lambda d: bench_accord(d, n, w, b, mode="unfenced")
        # Even rounds run in reverse order, so a machine that drifts during a round (this one
        # swings by ±15%) favours neither side of a ratio over the rounds.
        order = list(variants) if rnd % 2 else list(reversed(variants))
        rates: dict[str, float] = {}
        for name in order:
            variant = variants[name]
            dsn = await fresh_database(admin)
            try:
                elapsed, done = await variant(dsn)
            finally:
                await drop_database(admin, dsn)
            rates[name] = done / elapsed
        for name in variants:
            rate = rates[name]
            base = "raw-batch" if name.endswith("batch") or name == "pgqueuer" else "raw"
            ratio = rate / rates[base]
            ratios.setdefault(f"{name} / {base}", []).append(ratio)
            print(f"round {rnd}  {name:<13} {rate:8.0f} jobs/s  {ratio:5.2f} x {base}")
        # Context, not the goal: the callback path against a raw loop of the same shape.
        print(f"round {rnd}  accord / raw-tx = {rates['accord'] / rates['raw-tx']:.2f}")
        if "pgqueuer" in rates:
            for name in ("accord", "accord-nocb", "accord-batch"):
                print(f"round {rnd}  {name} / pgqueuer = {rates[name] / rates['pgqueuer']:.2f}")
                ratios.setdefault(f"{name} / pgqueuer", []).append(rates[name] / rates["pgqueuer"])
    # Rounds swing with the machine; the ratio's median and range over the rounds is the figure.
    for key, values in ratios.items():
        if not key.startswith(("raw", "pgqueuer")):
            low, mid, high = min(values), statistics.median(values), max(values)
            print(f"over {len(values)} rounds  {key:<26} median {mid:.2f}  ({low:.2f}-{high:.2f})")


async def main_worker(args: argparse.Namespace, admin: str) -> None:
    """The shipped worker next to the loops (see the module docstring, ``--worker``)."""
    n, nw, w, b = args.jobs, args.worker_jobs, args.workers, args.batch
    print(
        f"jobs bench --worker: loops over {n} no-op jobs; the worker over {nw} jobs"
        f" (effect, object, publish); {w} workers/slots, claim batch {b}, rounds {args.rounds}"
    )
    ratios: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    for rnd in range(1, args.rounds + 1):
        variants: dict[str, Callable[[str], Awaitable[tuple[float, int, float]]]] = {
            "raw": lambda d: _no_cpu(bench_raw(d, n, w, b)),
            "accord": lambda d: _no_cpu(bench_accord(d, n, w, b, mode="callback")),
            "worker": lambda d: jobs_worker.bench_worker(d, nw, w, b),
        }
        if args.decompose:
            variants["worker-pooled"] = lambda d: jobs_worker.bench_worker(d, nw, w, b, pooled=True)
            variants["worker-2commit"] = lambda d: jobs_worker.bench_worker(
                d, nw, w, b, objects=jobs_worker.TwoCommitStore
            )
        order = list(variants) if rnd % 2 else list(reversed(variants))
        rates: dict[str, float] = {}
        for name in order:
            dsn = await fresh_database(admin)
            try:
                elapsed, done, cpu = await variants[name](dsn)
            finally:
                await drop_database(admin, dsn)
            rates[name] = done / elapsed
            if cpu:
                cpus.setdefault(name, []).append(1000 * cpu / done)
        for name in variants:
            cpu_note = f"  CPU {cpus[name][-1]:5.2f} ms/job" if name in cpus else ""
            print(f"round {rnd}  {name:<13} {rates[name]:8.0f} jobs/s{cpu_note}")
        for name in (v for v in variants if v.startswith("worker")):
            for base in ("raw", "accord"):
                ratio = rates[name] / rates[base]
                ratios.setdefault(f"{name} / {base}", []).append(ratio)
                print(f"round {rnd}  {name} / {base} = {ratio:.3f}")
        for other, what in (("worker-pooled", "held connection"), ("worker-2commit", "object")):
            if other in rates:
                gain = rates["worker"] / rates[other]
                ratios.setdefault(f"worker / {other}", []).append(gain)
                print(f"round {rnd}  worker / {other} = {gain:.2f} (the {what} alone)")
    for key, values in [*ratios.items(), *((f"{k} CPU ms/job", v) for k, v in cpus.items())]:
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"over {len(values)} rounds  {key:<26} median {mid:.3f}  ({low:.3f}-{high:.3f})")
    dsn = await fresh_database(admin)
    try:
        for name, us in (await jobs_worker.seam_costs(dsn)).items():
            print(f"per call  {name:<24} {us:7.2f} us")
    finally:
        await drop_database(admin, dsn)


async def _no_cpu(run: Awaitable[tuple[float, int]]) -> tuple[float, int, float]:
    elapsed, done = await run
    return elapsed, done, 0.0


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--skip-pgqueuer", action="store_true")
    parser.add_argument(
        "--worker", action="store_true", help="run the shipped Worker next to the loops"
    )
    parser.add_argument("--worker-jobs", type=int, default=2000)
    parser.add_argument(
        "--decompose", action="store_true", help="also run the table and unfenced experiments"
    )
    run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
