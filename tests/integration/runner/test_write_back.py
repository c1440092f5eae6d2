"""An attempt's fenced write-backs under a lost connection or a read-only server (a review of
the worker under PostgreSQL faults, on a cluster of its own): each is tried again on a fresh
connection while the lease lasts, so a call that succeeded does not end ``unknown`` for a
person to resume, and the stale attempt still cannot write."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from accord.demo import DEFAULT_OWNER
from accord.jobs import EffectNotPending, EffectState, FenceLost, JobState
from accord.jobs.runner import JobContext, Success, write_back
from tests.integration.runner.conftest import Rig, running, wait_for

pytestmark = pytest.mark.timeout(90)

# Every client backend of the test's database but the caller's: the worker's held and pooled
# connections among them (the database is this test's own).
CUT_OTHERS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend'"
)


STATE = "SELECT state FROM jobs.jobs WHERE job_id = $1"
READ_ONLY = "default_transaction_read_only"


def _state(rig: Rig, job_id: int, state: JobState) -> Any:
    async def reached() -> bool:
        return await rig.state(job_id) == state

    return reached


async def test_an_outcome_whose_connection_was_cut_is_written_on_a_new_one(
    rig: Rig, pg_dsn: str
) -> None:
    """The call succeeded; the backend writing its outcome is cut while the statement waits
    (on a row lock the test holds). Before: the outcome was given up at that first lost
    connection (logged, the effect left pending), the publish refused (EffectsUnresolved) and
    the job made unknown, for a provider lookup to find again what the worker knew. Now it is
    written on a new connection."""
    await rig.store.register_workflow("lossy", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-lossy", "lossy")
    admin = await asyncpg.connect(pg_dsn)  # not the worker's: outside its pool
    locked = anyio.Event()
    cut: list[int] = []

    async def send() -> Success:
        await admin.execute("BEGIN")
        await admin.execute("SELECT 1 FROM jobs.effects WHERE job_id = $1 FOR UPDATE", job_id)
        locked.set()
        return Success("r-1")

    async def lossy(ctx: JobContext) -> None:
        await ctx.effect("pay", {}, send)
        await ctx.publish()

    async def cutter() -> None:
        await locked.wait()
        waiting = (
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%finish_effect%' AND datname = current_database()"
        )
        probe = await asyncpg.connect(pg_dsn)
        try:

            async def blocked() -> bool:
                pid = await probe.fetchval(waiting)
                if pid is not None:
                    cut.append(await probe.fetchval("SELECT pg_terminate_backend($1)", pid))
                return bool(cut)

            await wait_for(blocked)
        finally:
            await probe.close()
        await admin.execute("COMMIT")

    try:
        worker = rig.worker({"lossy": (lossy, 30.0)}, lease_s=10.0)
        async with running(worker), anyio.create_task_group() as tg:
            tg.start_soon(cutter)
            await wait_for(_state(rig, job_id, JobState.SUCCEEDED))
    finally:
        await admin.close()
    assert cut == [True]  # the outcome's statement was cut, waiting on the lock
    assert await rig.effects(job_id) == [("pay", 1, "succeeded", "r-1")]


async def test_a_publish_whose_connection_was_cut_is_tried_again(rig: Rig) -> None:
    """The publish's transaction loses its connection (the callback cuts its own backend):
    nothing of it committed, and it is tried again on a new connection under the same lease,
    the callback run again. Before: the job went unknown with its effect succeeded."""
    await rig.store.register_workflow("cut", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-cut", "cut")
    runs: list[int] = []

    async def callback(tx: Any) -> None:
        runs.append(await tx.fetchval("SELECT pg_backend_pid()"))
        if len(runs) == 1:
            await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    async def handler(ctx: JobContext) -> None:
        await ctx.effect("pay", {}, _receipt)
        await ctx.publish(callback)

    worker = rig.worker({"cut": (handler, 30.0)}, lease_s=10.0)
    async with running(worker):
        await wait_for(_state(rig, job_id, JobState.SUCCEEDED))
    assert len(runs) == 2 and runs[0] != runs[1]
    assert worker.stats.endings["published"] == 1


async def test_a_callback_s_own_client_error_is_not_tried_again(rig: Rig, tmp_path: Path) -> None:
    """A callback whose own I/O fails (an OSError, which DB_RETRY_LATER holds for a lost
    socket) on a connection still open: its own fault, raised to the handler at once, the
    callback run once per attempt, the job given up with that error (control above: a cut
    connection is tried again). A retry would run it until the deadline and blame that."""
    await rig.store.register_workflow("own", DEFAULT_OWNER)
    job_id = await rig.submit_job("op-own", "own")
    runs: list[int] = []
    raised: list[BaseException] = []
    tmp = tmp_path

    async def callback(tx: Any) -> None:
        runs.append(1)
        await tx.execute("SELECT 1")
        (tmp / "no-such-dir" / "template").read_text()  # FileNotFoundError: an OSError

    async def handler(ctx: JobContext) -> None:
        try:
            await ctx.publish(callback)
        except Exception as exc:
            raised.append(exc)
            raise

    worker = rig.worker({"own": (handler, 30.0)}, lease_s=10.0)
    async with running(worker):

        async def given_up() -> bool:
            return worker.stats.endings["failed"] >= 1

        await wait_for(given_up, within=20)
    # each attempt (the job is retried: a handler error) ran the callback once and failed
    assert len(runs) == len(raised) == worker.stats.endings["failed"]
    assert all(isinstance(exc, FileNotFoundError) for exc in raised)
    assert await rig.job(job_id) is not None


async def _receipt() -> Success:
    return Success("r-2")


async def test_a_publish_committed_before_its_answer_was_lost_is_told_by_its_job(
    rig: Rig,
) -> None:
    """When the answer to a publish is lost after its commit, the next try is refused on the
    job's state; the job's row tells it apart: succeeded at this lease's generation is this
    attempt's publish (nobody else's runs at it). Control: a job refused for another reason
    (failed, or taken by a later attempt) is not taken for published."""
    await rig.store.register_workflow("told", DEFAULT_OWNER)
    first = await rig.submit_job("op-told-1", "told")
    [lease] = await rig.store.claim("told", DEFAULT_OWNER, lease_s=30)
    assert lease.job_id == first
    await rig.store.publish(lease)
    with pytest.raises(FenceLost) as refused:
        await rig.store.publish(lease)  # the try after a lost answer
    assert refused.value.fields["failed_check"] == "state"
    assert await write_back.published_before(rig.store, lease)
    second = await rig.submit_job("op-told-2", "told")
    [other] = await rig.store.claim("told", DEFAULT_OWNER, lease_s=30)
    assert other.job_id == second
    await rig.store.fail(other, "handler", retry=False)
    assert not await write_back.published_before(rig.store, other)  # control: failed


async def test_an_outcome_committed_before_its_answer_was_lost_is_told_by_its_record(
    rig: Rig,
) -> None:
    """The same for an effect's outcome: the next try is refused as not pending, and this
    attempt's record holding that outcome says the earlier try committed. Control: another
    outcome, or the record of another attempt, is not taken for it."""
    await rig.store.register_workflow("rec", DEFAULT_OWNER, effects_enabled=True)
    await rig.submit_job("op-rec", "rec")
    [lease] = await rig.store.claim("rec", DEFAULT_OWNER, lease_s=30)
    seq = await rig.store.begin_effect(lease, "pay", "intent")
    await rig.store.finish_effect(lease, "pay", EffectState.SUCCEEDED, receipt="r")
    with pytest.raises(EffectNotPending):  # the try after a lost answer
        await rig.store.finish_effect(lease, "pay", EffectState.SUCCEEDED, receipt="r")
    assert await write_back.recorded_before(rig.store, lease, "pay", seq, "succeeded")
    assert not await write_back.recorded_before(rig.store, lease, "pay", seq, "unknown")
    other = dataclasses.replace(lease, attempt_id=uuid.uuid4())
    assert not await write_back.recorded_before(rig.store, other, "pay", seq, "succeeded")


async def test_a_give_up_committed_before_its_answer_was_lost_is_told_by_its_job(
    rig: Rig,
) -> None:
    """A give-up (``fail``) whose answer is lost after its commit: the next try is refused
    as no longer running; the job at this lease's generation, not running, with this
    give-up's reason is its doing, and its state is the attempt's ending (before, counted
    fence_lost with no state). Control: another reason, or a later generation (rescue,
    cancel), is not taken for it."""
    await rig.store.register_workflow("gave", DEFAULT_OWNER)
    await rig.submit_job("op-gave", "gave")
    [lease] = await rig.store.claim("gave", DEFAULT_OWNER, lease_s=30)
    assert await rig.store.fail(lease, "handler_error", retry=False) is JobState.FAILED
    with pytest.raises(FenceLost) as refused:
        await rig.store.fail(lease, "handler_error", retry=False)  # the try after a lost answer
    assert refused.value.fields["failed_check"] == "state"
    assert await write_back.given_up_before(rig.store, lease, "handler_error") is JobState.FAILED
    assert await write_back.given_up_before(rig.store, lease, "timeout") is None
    later = dataclasses.replace(lease, generation=lease.generation + 1)
    assert await write_back.given_up_before(rig.store, later, "handler_error") is None


async def test_a_read_only_server_delays_the_heartbeat_and_the_worker_goes_on(
    rig: Rig, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A server answering every write read-only (25006: a standby, or a primary stepping
    down during a failover). Before: the heartbeat's ReadOnlySQLTransactionError ended the
    worker, every job in flight with it. Now a renewal is retried at the next beat, and the
    job publishes once writes are taken again."""
    await rig.store.register_workflow("ro", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-ro", "ro")
    database = await rig.pool.fetchval("SELECT current_database()")
    release = anyio.Event()
    began = anyio.Event()

    async def handler(ctx: JobContext) -> None:
        began.set()
        await release.wait()
        await ctx.publish()

    admin = await asyncpg.connect(pg_dsn)
    try:
        worker = rig.worker({"ro": (handler, 60.0)}, lease_s=6.0)
        async with running(worker):
            await began.wait()
            await admin.execute(f'ALTER DATABASE "{database}" SET {READ_ONLY} = on')
            await admin.fetchval(CUT_OTHERS)  # new connections: read-only
            await anyio.sleep(3)  # a beat or two (every lease/3 s) meets the read-only server
            assert await admin.fetchval(STATE, job_id) == "running"  # the worker goes on
            await admin.execute(f'ALTER DATABASE "{database}" RESET {READ_ONLY}')
            await admin.fetchval(CUT_OTHERS)
            release.set()

            async def published() -> bool:  # on the test's own connection: the pool's were cut
                return bool(await admin.fetchval(STATE, job_id) == "succeeded")

            await wait_for(published)
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" RESET {READ_ONLY}')
        await admin.close()
    assert worker.stats.endings["published"] == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("renew failed" in m and "ReadOnlySQLTransactionError" in m for m in said)
