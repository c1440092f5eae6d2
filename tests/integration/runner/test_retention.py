"""The worker hosts retention (jobs.retention.prune) beside its rescue loop: bounded batches
back to back while they come back full; a batch another application's foreign key refuses,
or a retention inside a consumer's declared replay horizon, is logged and retried later, and
the worker's jobs run on regardless."""

from __future__ import annotations

import logging

import pytest

from accord.consumers import Consumer, inbox
from accord.demo import DEFAULT_OWNER
from accord.jobs import JobState
from accord.jobs.runner import JobContext
from tests.integration.consumers.support import CATALOG
from tests.integration.runner.conftest import Rig, running, wait_for
from tests.support import LAPSED

pytestmark = pytest.mark.timeout(60)

WORKFLOW = "tidy"
RETENTION_S = 3600.0


async def done(ctx: JobContext) -> None:
    return None


async def old_finished(rig: Rig, n: int) -> list[int]:
    """``n`` jobs run to success long ago (published by the store, then aged)."""
    ids = [await rig.submit_job(f"old-{i}", WORKFLOW) for i in range(n)]
    for lease in await rig.store.claim(WORKFLOW, DEFAULT_OWNER, lease_s=30, limit=n):
        await rig.store.publish(lease)
    await rig.pool.execute(
        "UPDATE jobs.jobs SET updated_at = now() - interval '30 days' WHERE job_id = ANY($1)", ids
    )
    return ids


def worker_for(rig: Rig, **config: object):  # type: ignore[no-untyped-def]
    return rig.worker(
        {WORKFLOW: (done, 5.0)},
        prune_every_s=0.05,
        prune_retention_s=RETENTION_S,
        prune_audit_retention_s=RETENTION_S,
        **config,
    )


async def left(rig: Rig, ids: list[int]) -> int:
    count: int = await rig.pool.fetchval(
        "SELECT count(*) FROM jobs.jobs WHERE job_id = ANY($1)", ids
    )
    return count


async def test_the_worker_prunes_old_finished_jobs_in_bounded_batches(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    await rig.store.register_workflow(WORKFLOW, DEFAULT_OWNER)
    old = await old_finished(rig, 5)
    caplog.set_level(logging.INFO, logger="accord.worker")
    async with running(worker_for(rig, prune_batch=2)):
        fresh = await rig.submit_job("fresh", WORKFLOW)

        async def settled() -> bool:
            return await left(rig, old) == 0 and await rig.state(fresh) == JobState.SUCCEEDED

        await wait_for(settled)
    assert await left(rig, [fresh]) == 1  # control: finished just now, inside the retention
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pruned")]
    assert lines[:3] == ["pruned jobs=2 effects=0 results=0 audit=0 tombstones=0"] * 2 + [
        "pruned jobs=1 effects=0 results=0 audit=0 tombstones=0"
    ]


async def test_a_blocked_prune_is_logged_and_the_worker_keeps_running_its_jobs(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    await rig.store.register_workflow(WORKFLOW, DEFAULT_OWNER)
    [blocked] = await old_finished(rig, 1)
    await rig.pool.execute(
        "CREATE SCHEMA app; CREATE TABLE app.keep (job_id bigint REFERENCES jobs.jobs)"
    )
    await rig.pool.execute("INSERT INTO app.keep VALUES ($1)", blocked)
    caplog.set_level(logging.INFO, logger="accord.worker")
    worker = worker_for(rig)
    async with running(worker):

        def refused() -> bool:
            return any("retention blocked" in r.getMessage() for r in caplog.records)

        async def logged() -> bool:
            return refused()

        await wait_for(logged)
        jobs = [await rig.submit_job(f"new-{i}", WORKFLOW) for i in range(3)]

        async def ran() -> bool:
            states = {await rig.state(job_id) for job_id in jobs}
            return states == {JobState.SUCCEEDED}

        await wait_for(ran)  # retention is blocked, the jobs are not
        assert await left(rig, [blocked]) == 1
        await rig.pool.execute("DROP TABLE app.keep")  # the operator fixes the reference

        async def pruned() -> bool:
            return await left(rig, [blocked]) == 0

        await wait_for(pruned)  # the next attempt goes through
    message = next(r.getMessage() for r in caplog.records if "retention blocked" in r.getMessage())
    assert "constraint='keep_job_id_fkey'" in message and "table='keep'" in message


async def test_a_retention_inside_a_declared_replay_horizon_is_logged_and_retried(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    await rig.store.register_workflow(WORKFLOW, DEFAULT_OWNER)
    [old] = await old_finished(rig, 1)
    async with rig.pool.acquire() as conn:  # a consumer elsewhere keeps a one-day window
        await inbox.declare_window(conn, Consumer("report", CATALOG, 86400.0))
    caplog.set_level(logging.INFO, logger="accord.worker")
    async with running(worker_for(rig)):  # its retention: an hour

        async def logged() -> bool:
            return any("retention blocked" in r.getMessage() for r in caplog.records)

        await wait_for(logged)
        fresh = await rig.submit_job("fresh", WORKFLOW)

        async def ran() -> bool:
            return await rig.state(fresh) == JobState.SUCCEEDED

        await wait_for(ran)  # retention is refused, the jobs are not
        assert await left(rig, [old]) == 1
        async with rig.pool.acquire() as conn:  # the consumer's window shrinks to 50 min
            await inbox.declare_window(conn, Consumer("report", CATALOG, 3000.0))
            # and the day it replaced has run out since (migration 0028 keeps it until then)
            await conn.execute(LAPSED)

        async def pruned() -> bool:
            return await left(rig, [old]) == 0

        await wait_for(pruned)  # the next attempt goes through
    message = next(r.getMessage() for r in caplog.records if "retention blocked" in r.getMessage())
    assert "consumer='report'" in message and "horizon_s=86700.0" in message
