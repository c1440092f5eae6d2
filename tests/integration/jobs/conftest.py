"""Fixtures for the jobs module: a store over a pool on this test's fresh database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from accord.jobs import Lease, Store, submit

WORKFLOW = "report"
OWNER = "accord-worker"
TENANT = "acme"


@dataclass
class Jobs:
    """The store under test plus the pool it runs on, and small helpers."""

    store: Store
    pool: asyncpg.Pool

    async def submit(
        self,
        operation_id: str,
        *,
        tenant: str = TENANT,
        workflow: str = WORKFLOW,
        digest: str | None = None,
        max_attempts: int = 5,
    ) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            done = await submit(
                conn,
                tenant=tenant,
                workflow=workflow,
                operation_id=operation_id,
                digest=digest or f"d-{operation_id}",
                max_attempts=max_attempts,
            )
        return done.job_id

    async def claim_one(self, lease_s: float = 30.0) -> Lease:
        leases = await self.store.claim(WORKFLOW, OWNER, lease_s=lease_s)
        assert len(leases) == 1
        return leases[0]

    async def expire(self, job_id: int) -> None:
        """Make the job's lease expired without sleeping (test-only direct write)."""
        await self.pool.execute(
            "UPDATE jobs.jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE job_id = $1 AND state = 'running'",
            job_id,
        )

    async def state(self, job_id: int) -> str:
        state: str = await self.pool.fetchval(
            "SELECT state FROM jobs.jobs WHERE job_id = $1", job_id
        )
        return state


@pytest.fixture
async def jobs(pg_dsn: str) -> AsyncIterator[Jobs]:
    # These tests are about visibility and locking, not durability across a crash, so commits
    # need not wait for the WAL flush (synchronous_commit=off keeps every other semantic).
    pool = await asyncpg.create_pool(
        pg_dsn, min_size=1, max_size=4, server_settings={"synchronous_commit": "off"}
    )
    assert pool is not None
    store = Store(pool, backoff_base_s=0.0)
    await store.register_workflow(WORKFLOW, OWNER, effects_enabled=True)
    yield Jobs(store, pool)
    await pool.close()
