"""The shipped ``Worker`` over N jobs, for ``bench.jobs_bench --worker``.

Each job's handler is the trivial shape of a real one: one effect through an in-process
provider (fenced begin, journaled, dispatched, outcome recorded and journaled), a result
object (``put_object``) and the fenced publish that writes its manifest row
(``record_result``), journaled. The worker is the real one: its pool sized as ``accord
worker`` sizes it, a journal file, heartbeats, a ``LocalDirStore`` on disk, the claim and
rescue loops. It runs in this process; its CPU per job is this process's CPU time
(``time.process_time``: every thread, the fsyncs' too) over the drain, divided by N.

Also measured here, because the worker's calls pay it: the per-call cost of the store's
seam (``jobs.connections.Mapped``, which maps a lost connection to ConnectionLost) and of a pool
acquire/release against a held connection, each around a ``SELECT 1``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from accord.commands.worker import pool_size
from accord.jobs import Store, sql
from accord.jobs.connections import Held, Mapped
from accord.jobs.framing import fsync_dir
from accord.jobs.runner import (
    JobContext,
    LocalDirStore,
    Success,
    Worker,
    WorkerConfig,
    open_journal,
)
from accord.jobs.runner.objects import key_for
from accord.schemas.db import create_pool

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW, OWNER = "bench-worker", "bench-worker-owner"


class PooledStore(Store):
    """The store before held connections (``--decompose``): a job's calls each take a pool
    connection, as every ``Store(pool)`` call does."""

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[Store]:
        yield self


class Published:
    """Counts the handlers' committed publishes; set once ``n`` have."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.all = anyio.Event()

    def one(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.all.set()


class TwoCommitStore(LocalDirStore):
    """The object store before one durable write per object (``--decompose``): a temporary
    file written and fsynced, then linked into place, then its directory fsynced (a second
    journal commit for the link)."""

    def put(self, data: bytes) -> str:
        key = key_for(data)
        final = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            os.utime(final)
            return key
        self._commit(final.parent)
        temp = final.parent / f".{key}.{uuid.uuid4().hex}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, final)
        except FileExistsError:
            pass
        finally:
            temp.unlink()
        fsync_dir(final.parent)
        return key


async def handler(ctx: JobContext, published: Published) -> None:
    """One effect, one result object, the fenced publish naming it."""
    n = ctx.payload["n"]

    async def call() -> Success:  # the in-process provider: answers at once
        return Success(receipt=f"receipt-{n}")

    receipt = await ctx.effect("bench.send", {"n": n}, call)
    key = await ctx.put_object(f"result of job {n}: {receipt.receipt}\n".encode())

    async def manifest(tx: Any) -> None:
        await ctx.record_result(tx, key)

    await ctx.publish(manifest, object_key=key)
    published.one()


async def bench_worker(
    dsn: str,
    n: int,
    concurrency: int,
    batch: int,
    *,
    pooled: bool = False,
    objects: type[LocalDirStore] = LocalDirStore,
) -> tuple[float, int, float]:
    """Drain ``n`` jobs through the shipped Worker; (elapsed s, jobs done, CPU s).
    ``pooled`` and ``objects`` put back what this round of work replaced (``--decompose``)."""
    pool = await create_pool(dsn, min_size=1, max_size=pool_size(concurrency))
    try:
        store = (PooledStore if pooled else Store)(pool)
        await store.register_workflow(WORKFLOW, OWNER, effects_enabled=True)
        async with pool.acquire() as conn, conn.transaction():
            await conn.executemany(
                sql.SUBMIT,
                [("t", WORKFLOW, f"op{i}", "d", f'{{"n": {i}}}', 5) for i in range(n)],
            )
        await pool.execute("ANALYZE jobs.jobs, jobs.tenants, jobs.effects, jobs.results")
        (ROOT / "var" / "bench").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=ROOT / "var" / "bench") as tmp:
            elapsed, cpu = await _drain(
                store, objects(Path(tmp) / "objects"), pool, Path(tmp), n, concurrency, batch
            )
            stored = sum(1 for _ in LocalDirStore(Path(tmp) / "objects").iter())
        done = await pool.fetchval(
            "SELECT count(*) FROM jobs.jobs j JOIN jobs.results r USING (job_id)"
            " WHERE j.state = 'succeeded'"
        )
        assert done == n == stored, (done, n, stored)
        return elapsed, done, cpu
    finally:
        await pool.close()


async def _drain(
    store: Store,
    objects: LocalDirStore,
    pool: asyncpg.Pool,
    tmp: Path,
    n: int,
    concurrency: int,
    batch: int,
) -> tuple[float, float]:
    config = WorkerConfig(
        owner=OWNER, concurrency=concurrency, claim_batch=batch, poll_s=0.05, grace_s=5.0
    )
    journal = open_journal(tmp / "bench.journal", "bench")
    try:
        worker = Worker(config, store=store, journal=journal, objects=objects, pool=pool)
        published = Published(n)
        worker.register(WORKFLOW, functools.partial(handler, published=published), timeout_s=30.0)
        async with anyio.create_task_group() as tg:
            await tg.start(_run, worker)
            started, cpu = time.perf_counter(), time.process_time()
            await published.all.wait()
            elapsed = time.perf_counter() - started
            cpu = time.process_time() - cpu
            worker.stop()
        assert worker.stats.endings["published"] == n, worker.stats.endings
        return elapsed, cpu
    finally:
        journal.close()


async def _run(worker: Worker, *, task_status: Any) -> None:
    await worker.run(task_status=task_status)


async def seam_costs(dsn: str, calls: int = 3000) -> dict[str, float]:
    """Microseconds per call: the seam alone, and a ``SELECT 1`` bare, through the seam on a
    held connection, and through a pool acquire/release (asyncpg resets on release)."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    assert pool is not None
    try:
        async with pool.acquire() as conn:
            held = Held(conn)

            async def seam_only() -> None:
                async with Mapped(held):
                    pass

            async def bare() -> None:
                await conn.fetchval("SELECT 1")

            async def seam() -> None:
                async with Mapped(held) as c:
                    await c.fetchval("SELECT 1")

            figures = {
                "seam alone": await _per_call(seam_only, calls * 10),
                "SELECT 1, bare": await _per_call(bare, calls),
                "SELECT 1, seam + held": await _per_call(seam, calls),
            }

        async def pooled() -> None:
            async with Mapped(pool.acquire()) as c:
                await c.fetchval("SELECT 1")

        figures["SELECT 1, seam + pool"] = await _per_call(pooled, calls)
        return figures
    finally:
        await pool.close()


async def _per_call(step: Any, calls: int) -> float:
    for _ in range(calls // 10):  # warm up
        await step()
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(calls):
            await step()
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6
