"""Fixtures for the worker: a store over this test's database, a provider simulator with
its own evidence file, a journal and an object directory, and a running worker."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from accord.demo import DEFAULT_OWNER, WORKFLOW, accept_submission, register_demo
from accord.demo.catalog import demo_catalog
from accord.demo.provider import ProviderClient, ProviderServer
from accord.jobs import Store, submit
from accord.jobs import retention as jobs_retention
from accord.jobs.models import Lease
from accord.jobs.retention import Pruned
from accord.jobs.runner import (
    Handler,
    LocalDirStore,
    Worker,
    WorkerConfig,
    open_journal,
)
from tests import support

TENANT = "acme"
CATALOG = demo_catalog()


@dataclass
class Rig:
    """Everything a worker needs, on this test's database and directories."""

    pg_dsn: str
    pool: asyncpg.Pool
    store: Store
    provider: ProviderServer
    client: ProviderClient
    objects: LocalDirStore
    journal_dir: Path
    workers: list[Worker] = field(default_factory=list)

    def journal_path(self, name: str = "w1") -> Path:
        return self.journal_dir / f"{name}.journal"

    async def submit_report(
        self, report_id: str, subject: str = "quarterly numbers", *, tenant: str = TENANT
    ) -> int:
        """What accept + the report consumer do, in one transaction: the domain row, the
        outbox row and the job (submitted exactly as accord.workflows submits it)."""
        async with self.pool.acquire() as conn, conn.transaction():
            event = await accept_submission(conn, tenant, report_id, subject)
            done = await submit(
                conn,
                tenant=tenant,
                workflow=WORKFLOW,
                operation_id=event.operation_id,
                digest=CATALOG.digest(event),
                payload=dict(event.payload),
            )
        return done.job_id

    async def submit_job(self, operation_id: str, workflow: str, **payload: Any) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            done = await submit(
                conn,
                tenant=TENANT,
                workflow=workflow,
                operation_id=operation_id,
                digest=f"d-{operation_id}",
                payload=payload,
            )
        return done.job_id

    async def job(self, job_id: int) -> asyncpg.Record:
        row: asyncpg.Record = await self.pool.fetchrow(
            "SELECT state, generation, attempts, last_error, lease_expires_at"
            " FROM jobs.jobs WHERE job_id = $1",
            job_id,
        )
        return row

    async def prune_past_retention(self, job_ids: list[int]) -> Pruned:
        """Age ``job_ids`` and their effect records 30 days (past the guards, test-only
        writes) and run one retention batch of a day's retention."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute(
                "UPDATE jobs.jobs SET updated_at = now() - interval '30 days'"
                " WHERE job_id = ANY($1)",
                job_ids,
            )
            await conn.execute(
                "UPDATE jobs.effects SET begun_at = now() - interval '30 days',"
                " finished_at = now() - interval '30 days' WHERE job_id = ANY($1)",
                job_ids,
            )
        async with self.pool.acquire() as conn, conn.transaction():
            return await jobs_retention.prune(
                conn, retention_s=86400.0, audit_retention_s=86400.0, limit=100
            )

    async def state(self, job_id: int) -> str:
        return str((await self.job(job_id))["state"])

    async def effects(self, job_id: int) -> list[tuple[str, int, str, str | None]]:
        rows = await self.pool.fetch(
            "SELECT effect_key, seq, state, receipt FROM jobs.effects WHERE job_id = $1"
            " ORDER BY effect_key, seq",
            job_id,
        )
        return [(r["effect_key"], r["seq"], r["state"], r["receipt"]) for r in rows]

    def worker(
        self,
        handlers: dict[str, tuple[Handler, float]],
        *,
        journal: str = "w1",
        owner: str = DEFAULT_OWNER,
        **config: Any,
    ) -> Worker:
        options: dict[str, Any] = {"lease_s": 3.0, "poll_s": 0.05, "rescue_every_s": None}
        options.update(config)
        worker = Worker(
            WorkerConfig(owner=owner, **options),
            store=self.store,
            journal=open_journal(self.journal_path(journal), journal),
            objects=self.objects,
            pool=self.pool,
        )
        for workflow, (handler, timeout_s) in handlers.items():
            worker.register(workflow, handler, timeout_s=timeout_s)
        self.workers.append(worker)
        return worker


class CountingStore(Store):
    """A store that counts its claims and the jobs each took (the copies ``Store.hold``
    makes count with it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sizes: list[int] = []

    @property
    def claims(self) -> int:
        return len(self.sizes)

    async def claim(self, *args: Any, **kwargs: Any) -> list[Lease]:
        leases = await super().claim(*args, **kwargs)
        self.sizes.append(len(leases))
        return leases


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    """Run the worker in the background; on exit stop it (grace applies) and wait for it."""
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(_run, worker)
            yield worker
            worker.stop()
    finally:
        worker.journal.close()


async def _run(worker: Worker, *, task_status: Any) -> None:
    await worker.run(task_status=task_status)


#: Poll the database (the truth) until a predicate holds; these tests fail after 20 s.
wait_for = functools.partial(support.wait_for, within=20)


@pytest.fixture
async def rig(pg_dsn: str, tmp_path: Path) -> AsyncIterator[Rig]:
    pool = await asyncpg.create_pool(
        pg_dsn, min_size=1, max_size=12, server_settings={"synchronous_commit": "off"}
    )
    assert pool is not None
    store = Store(pool, backoff_base_s=0.0)
    await register_demo(store)
    try:
        async with ProviderServer(tmp_path / "provider.db") as provider:
            client = ProviderClient(provider.url, timeout_s=5.0)
            yield Rig(
                pg_dsn,
                pool,
                store,
                provider,
                client,
                LocalDirStore(tmp_path / "objects"),
                tmp_path / "journal",
            )
    finally:
        await pool.close()
