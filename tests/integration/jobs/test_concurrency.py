"""Eight concurrent workers with batch claims over many jobs: every job succeeds exactly
once, nothing is claimed twice, and every publish passed the fence."""

from __future__ import annotations

import json

import anyio
import asyncpg
import pytest

from accord.jobs import Lease, Store, sql
from tests.integration.jobs.conftest import OWNER, TENANT, WORKFLOW, Jobs
from tests.support import scaled

JOBS = scaled(20_000, 100_000)
WORKERS = 8
BATCH = 50


async def worker(pool: asyncpg.Pool, claimed: list[Lease]) -> None:
    async def manifest_for(store: Store, lease: Lease) -> None:
        async def callback(tx: asyncpg.Connection) -> None:
            await Store.record_result(tx, lease, str(lease.attempt_id), "x")

        await store.publish(lease, callback)

    async with pool.acquire() as conn:
        store = Store(conn)  # a worker keeps its connection
        while leases := await store.claim(WORKFLOW, OWNER, lease_s=120, limit=BATCH):
            claimed.extend(leases)
            for lease in leases:
                await manifest_for(store, lease)


@pytest.mark.timeout(300)
async def test_eight_workers_each_job_succeeds_exactly_once(jobs: Jobs, pg_dsn: str) -> None:
    async with jobs.pool.acquire() as conn, conn.transaction():
        await conn.executemany(
            sql.SUBMIT,
            [(TENANT, WORKFLOW, f"op-{i}", f"d-{i}", json.dumps({"i": i}), 5) for i in range(JOBS)],
        )
    pool = await asyncpg.create_pool(
        pg_dsn, min_size=WORKERS, max_size=WORKERS, server_settings={"synchronous_commit": "off"}
    )
    assert pool is not None
    claimed: list[Lease] = []
    try:
        with anyio.fail_after(280):
            async with anyio.create_task_group() as tg:
                for _ in range(WORKERS):
                    tg.start_soon(worker, pool, claimed)
    finally:
        await pool.close()
    assert len(claimed) == JOBS
    assert len({le.job_id for le in claimed}) == JOBS  # no double claim
    assert len({le.attempt_id for le in claimed}) == JOBS
    summary = await jobs.pool.fetchrow(
        "SELECT count(*) FILTER (WHERE state = 'succeeded') AS ok,"
        " count(*) FILTER (WHERE generation = 1 AND attempts = 1) AS once,"
        " (SELECT count(*) FROM jobs.results) AS results,"
        " (SELECT count(*) FROM jobs.results r JOIN jobs.jobs j USING (job_id)"
        "  WHERE r.object_key = j.attempt_id::text) AS fenced"
        " FROM jobs.jobs"
    )
    assert dict(summary) == {"ok": JOBS, "once": JOBS, "results": JOBS, "fenced": JOBS}
