"""Fixtures for authority and repair: one pool per principal on this test's database.

The principals are the NOLOGIN roles of migration 0006; each pool sets ``role`` at
connection start (as `accord repair` does), on the test's superuser DSN.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from accord.jobs import FileLedger, Lease, Store, submit
from accord.jobs.repair import REPAIR_ROLE, WORKER_ROLE

WORKFLOW = "report"
OWNER = "accord-worker"
TENANT = "acme"


async def role_pool(dsn: str, role: str | None) -> asyncpg.Pool:
    settings = {"synchronous_commit": "off"}
    if role is not None:
        settings["role"] = role
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4, server_settings=settings)
    assert pool is not None
    return pool


@dataclass
class Principals:
    """The owner (migrating superuser), worker and repair principals on one database."""

    dsn: str
    owner: asyncpg.Pool
    worker: asyncpg.Pool
    repair: asyncpg.Pool
    store: Store  # the worker's store (role accord_worker)

    async def submit(
        self, operation_id: str, *, tenant: str = TENANT, max_attempts: int = 5
    ) -> int:
        async with self.worker.acquire() as conn, conn.transaction():
            done = await submit(
                conn,
                tenant=tenant,
                workflow=WORKFLOW,
                operation_id=operation_id,
                digest=f"d-{operation_id}",
                max_attempts=max_attempts,
            )
        return done.job_id

    async def claim(self, lease_s: float = 60.0, limit: int = 10) -> list[Lease]:
        return await self.store.claim(WORKFLOW, OWNER, lease_s=lease_s, limit=limit)

    async def claim_one(self, lease_s: float = 60.0) -> Lease:
        leases = await self.claim(lease_s, limit=1)
        assert len(leases) == 1, leases
        return leases[0]

    async def state(self, job_id: int) -> str:
        state: str = await self.owner.fetchval(
            "SELECT state FROM jobs.jobs WHERE job_id = $1", job_id
        )
        return state

    async def expire(self, job_id: int) -> None:
        """Expire the job's lease without sleeping (test-only owner write)."""
        await self.owner.execute(
            "UPDATE jobs.jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE job_id = $1 AND state = 'running'",
            job_id,
        )


async def open_principals(dsn: str) -> Principals:
    owner = await role_pool(dsn, None)
    worker = await role_pool(dsn, WORKER_ROLE)
    repair = await role_pool(dsn, REPAIR_ROLE)
    store = Store(worker, backoff_base_s=0.0)
    # Registration is administrative: the owner (migrating role) registers, never the worker.
    await Store(owner).register_workflow(WORKFLOW, OWNER, effects_enabled=True)
    return Principals(dsn, owner, worker, repair, store)


async def close_principals(p: Principals) -> None:
    for pool in (p.worker, p.repair, p.owner):
        await pool.close()


@pytest.fixture
async def principals(pg_dsn: str) -> AsyncIterator[Principals]:
    p = await open_principals(pg_dsn)
    yield p
    await close_principals(p)


@pytest.fixture
def ledger(tmp_path: Path) -> FileLedger:
    return FileLedger(tmp_path / "authority.ledger")
