"""submit: in the caller's transaction, idempotent, digest-checked, never resetting state."""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from accord.jobs import JobConflict, JobState, submit
from accord.schemas.errors import NotInTransaction
from tests.integration.jobs.conftest import TENANT, WORKFLOW, Jobs


async def test_submit_needs_the_callers_transaction(pg: asyncpg.Connection) -> None:
    async with pg.transaction():  # control
        done = await submit(pg, tenant=TENANT, workflow=WORKFLOW, operation_id="a", digest="d")
    assert done.created and done.state is JobState.QUEUED
    with pytest.raises(NotInTransaction):
        await submit(pg, tenant=TENANT, workflow=WORKFLOW, operation_id="b", digest="d")


async def test_submit_rolls_back_with_the_caller(pg: asyncpg.Connection) -> None:
    with pytest.raises(RuntimeError):
        async with pg.transaction():
            await submit(pg, tenant=TENANT, workflow=WORKFLOW, operation_id="a", digest="d")
            raise RuntimeError("domain change failed")
    assert await pg.fetchval("SELECT count(*) FROM jobs.jobs") == 0


async def test_same_operation_twice_is_one_job(pg: asyncpg.Connection) -> None:
    async with pg.transaction():
        first = await submit(pg, tenant=TENANT, workflow=WORKFLOW, operation_id="a", digest="d")
        again = await submit(pg, tenant=TENANT, workflow=WORKFLOW, operation_id="a", digest="d")
    assert first.created and not again.created and first.job_id == again.job_id
    # the same operation id under another tenant or workflow class is another job
    async with pg.transaction():
        other = await submit(pg, tenant="other", workflow=WORKFLOW, operation_id="a", digest="d")
        other_wf = await submit(pg, tenant=TENANT, workflow="x", operation_id="a", digest="d")
    assert len({first.job_id, other.job_id, other_wf.job_id}) == 3


async def test_same_operation_other_digest_is_a_typed_conflict(pg: asyncpg.Connection) -> None:
    async with pg.transaction():
        await submit(pg, tenant=TENANT, workflow=WORKFLOW, operation_id="a", digest="d1")
    with pytest.raises(JobConflict) as info:
        async with pg.transaction():
            await submit(pg, tenant=TENANT, workflow=WORKFLOW, operation_id="a", digest="d2")
    assert info.value.fields["existing_digest"] == "d1"
    assert info.value.fields["submitted_digest"] == "d2"


@pytest.mark.parametrize("state", [s.value for s in JobState])
async def test_resubmitting_never_resets_the_state(jobs: Jobs, state: str) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    # Put the job in each state directly (running is where the claim left it).
    if state != "running":
        await jobs.pool.execute(
            "UPDATE jobs.jobs SET state = $2, lease_expires_at = NULL WHERE job_id = $1",
            job_id,
            state,
        )
    before = await jobs.pool.fetchrow("SELECT * FROM jobs.jobs WHERE job_id = $1", job_id)
    again = await jobs.submit("a")
    after = await jobs.pool.fetchrow("SELECT * FROM jobs.jobs WHERE job_id = $1", job_id)
    assert again == job_id and dict(before) == dict(after)
    assert lease.generation == after["generation"]


async def test_concurrent_submits_of_one_operation_make_one_job(jobs: Jobs) -> None:
    ids: list[int] = []

    async def one() -> None:
        ids.append(await jobs.submit("race"))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(one)
    assert len(set(ids)) == 1 and len(ids) == 4
    assert await jobs.pool.fetchval("SELECT count(*) FROM jobs.jobs") == 1
