"""A publish's result object (``JobContext.publish(object_key=...)``): its jobs.results
manifest row is written by the fenced succeeded statement itself (jobs.succeed_with_result),
so it exists exactly when the job succeeded. The current lease's publish writes it (control);
a stale lease's writes nothing; a callback recording the same key adds nothing, another key
is refused (ResultMismatch) and a key that is not a content address is refused before
anything is written (ObjectKeyInvalid); without ``object_key`` the callback's
``record_result`` writes the row through its own fence, as before."""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from accord.demo import DEFAULT_OWNER
from accord.jobs import FenceLost, JobState
from accord.jobs.errors import (
    ObjectKeyInvalid,
    ObjectNotFound,
    ObjectStoreUnavailable,
    ResultMismatch,
)
from accord.jobs.models import Lease
from accord.jobs.runner import Ending, JobContext
from accord.jobs.runner.objects import collect_garbage
from accord.schemas.db import Tx
from tests.integration.runner.conftest import Rig, running, wait_for
from tests.unit.test_objects import age

pytestmark = pytest.mark.timeout(60)

WORKFLOW = "plain"


async def _journal(record: object) -> None:
    return None


async def _claimed(rig: Rig, operation_id: str) -> tuple[int, JobContext]:
    job_id = await rig.submit_job(operation_id, WORKFLOW)
    [lease] = await rig.store.claim(WORKFLOW, DEFAULT_OWNER, lease_s=30)
    assert lease.job_id == job_id
    return job_id, _context(rig, lease)


def _context(rig: Rig, lease: Lease) -> JobContext:
    return JobContext(lease, store=rig.store, objects=rig.objects, journal=_journal)


async def _manifest(pool: asyncpg.Pool, job_id: int) -> list[tuple[str, str]]:
    rows = await pool.fetch(
        "SELECT object_key, content_digest FROM jobs.results WHERE job_id = $1", job_id
    )
    return [(r["object_key"], r["content_digest"]) for r in rows]


@pytest.fixture
async def plain(rig: Rig) -> Rig:
    await rig.pool.execute("CREATE TABLE public.marks (job_id bigint PRIMARY KEY)")
    await rig.store.register_workflow(WORKFLOW, DEFAULT_OWNER, effects_enabled=True)
    return rig


def _mark(job_id: int, record: tuple[JobContext, str] | None = None):  # type: ignore[no-untyped-def]
    """A callback writing a domain row, and recording ``record``'s key through its context."""

    async def callback(tx: Tx) -> None:
        await tx.execute("INSERT INTO public.marks (job_id) VALUES ($1)", job_id)
        if record is not None:
            ctx, key = record
            await ctx.record_result(tx, key)

    return callback


async def test_the_current_lease_s_publish_writes_the_manifest_in_its_succeeded_statement(
    plain: Rig,
) -> None:
    rig = plain
    key = rig.objects.put(b"the report")
    job_id, ctx = await _claimed(rig, "with-callback")
    await ctx.publish(_mark(job_id), object_key=key)
    assert ctx.published and await rig.state(job_id) == JobState.SUCCEEDED
    assert await _manifest(rig.pool, job_id) == [(key, key.removeprefix("sha256-"))]
    # no callback: the publish is that one statement, and it writes the row too
    alone, ctx = await _claimed(rig, "alone")
    await ctx.publish(object_key=key)
    assert await rig.state(alone) == JobState.SUCCEEDED
    assert await _manifest(rig.pool, alone) == [(key, key.removeprefix("sha256-"))]
    # a callback that records the same key through its context adds no second row
    same, ctx = await _claimed(rig, "same")
    await ctx.publish(_mark(same, (ctx, key)), object_key=key)
    assert await _manifest(rig.pool, same) == [(key, key.removeprefix("sha256-"))]


async def test_a_stale_lease_s_publish_writes_no_manifest_and_nothing_of_its_callback(
    plain: Rig,
) -> None:
    rig = plain
    key = rig.objects.put(b"a plausible report")
    job_id, stale = await _claimed(rig, "stale")
    await rig.store.cancel(job_id, reason="test")
    with pytest.raises(FenceLost) as lost:
        await stale.publish(_mark(job_id), object_key=key)
    assert lost.value.fields["failed_check"] == "generation"
    with pytest.raises(FenceLost):
        await stale.publish(object_key=key)  # the one-statement form, refused alike
    assert not stale.published
    assert await _manifest(rig.pool, job_id) == []
    assert await rig.pool.fetchval("SELECT count(*) FROM public.marks") == 0
    assert await rig.state(job_id) == JobState.CANCELED


async def test_another_key_recorded_in_the_callback_is_refused_and_rolls_back(
    plain: Rig,
) -> None:
    rig = plain
    named, other = rig.objects.put(b"named"), rig.objects.put(b"other")
    job_id, ctx = await _claimed(rig, "mismatch")
    with pytest.raises(ResultMismatch) as refused:
        await ctx.publish(_mark(job_id, (ctx, other)), object_key=named)
    assert refused.value.fields == {"job_id": job_id, "published": named, "recorded": other}
    assert not ctx.published and await rig.state(job_id) == JobState.RUNNING
    assert await _manifest(rig.pool, job_id) == []
    assert await rig.pool.fetchval("SELECT count(*) FROM public.marks") == 0
    # the lease still holds the job: the corrected publish goes through
    await ctx.publish(_mark(job_id, (ctx, named)), object_key=named)
    assert await _manifest(rig.pool, job_id) == [(named, named.removeprefix("sha256-"))]


async def test_an_object_key_that_is_not_a_content_address_is_refused_before_any_write(
    plain: Rig,
) -> None:
    rig = plain
    job_id, ctx = await _claimed(rig, "bad-key")
    with pytest.raises(ObjectKeyInvalid):
        await ctx.publish(_mark(job_id), object_key="results/report.json")
    assert not ctx.published and await rig.state(job_id) == JobState.RUNNING
    assert await rig.pool.fetchval("SELECT count(*) FROM public.marks") == 0


async def test_without_object_key_the_callback_s_record_result_writes_through_its_fence(
    plain: Rig,
) -> None:
    rig = plain
    key = rig.objects.put(b"recorded in the callback")
    job_id, ctx = await _claimed(rig, "callback-records")
    await ctx.publish(_mark(job_id, (ctx, key)))
    assert await _manifest(rig.pool, job_id) == [(key, key.removeprefix("sha256-"))]
    # and a stale lease's record_result is refused by that fence, called on its own (its
    # publish would be refused earlier, by the publish's fence)
    stale_id, stale = await _claimed(rig, "callback-stale")
    await rig.store.cancel(stale_id, reason="test")
    async with rig.pool.acquire() as conn:
        with pytest.raises(FenceLost):
            async with conn.transaction():
                await stale.record_result(conn, key)
    with pytest.raises(FenceLost):
        await stale.publish(_mark(stale_id, (stale, key)))
    assert await _manifest(rig.pool, stale_id) == []


async def test_the_worker_fails_a_handler_naming_two_results_without_a_retry(plain: Rig) -> None:
    """A handler defect is permanent: the job fails at once (control: the same handler
    naming one result succeeds), with nothing of the refused publish written."""
    rig = plain

    async def handler(ctx: JobContext) -> None:
        named = await ctx.put_object(ctx.payload["named"].encode())
        recorded = await ctx.put_object(ctx.payload["recorded"].encode())
        await ctx.publish(_mark(ctx.lease.job_id, (ctx, recorded)), object_key=named)

    good = await rig.submit_job("good", WORKFLOW, named="a", recorded="a")
    bad = await rig.submit_job("bad", WORKFLOW, named="a", recorded="b")
    worker = rig.worker({WORKFLOW: (handler, 30.0)})
    async with running(worker):

        async def settled() -> bool:
            return {await rig.state(good), await rig.state(bad)} <= {"succeeded", "failed"}

        await wait_for(settled)
    assert await rig.state(good) == JobState.SUCCEEDED
    assert await rig.state(bad) == JobState.FAILED
    job = await rig.job(bad)
    assert job["attempts"] == 1 and job["last_error"] == "result_mismatch"
    assert await _manifest(rig.pool, bad) == []
    assert await rig.pool.fetchval("SELECT array_agg(job_id) FROM public.marks") == [good]
    assert worker.stats.endings == {str(Ending.PUBLISHED): 1, str(Ending.FAILED): 1}


async def test_a_publish_restarts_its_object_s_age_so_a_run_longer_than_the_retention_keeps_it(
    plain: Rig,
) -> None:
    """A handler may run longer than the collector's retention after its put: a publish
    naming the object restarts its age first (as a callback's record_result does), so a
    collection during the publish keeps it, and no manifest names a missing object. Control:
    an object aged alike that nothing names is collected by the same pass. Collected before
    the publish, the object is refused (ObjectNotFound) and nothing is written: the job is
    retried, and its handler puts it again."""
    rig = plain
    retention = 60.0
    collected: list[str] = []

    def collecting(job_id: int, record: tuple[JobContext, str] | None = None):  # type: ignore[no-untyped-def]
        """A callback recording ``record`` (if any), then a collector's pass."""

        async def callback(tx: Tx) -> None:
            await _mark(job_id, record)(tx)
            collected.extend(collect_garbage(rig.objects, set(), retention))

        return callback

    for how in ("object_key", "record_result"):
        key = rig.objects.put(f"a long run's report ({how})".encode())
        stray = rig.objects.put(f"nothing names it ({how})".encode())
        age(rig.objects, key, 3600)
        age(rig.objects, stray, 3600)
        job_id, ctx = await _claimed(rig, f"long-run-{how}")
        if how == "object_key":
            await ctx.publish(collecting(job_id), object_key=key)
        else:
            await ctx.publish(collecting(job_id, (ctx, key)))
        assert collected == [stray]
        collected.clear()
        assert rig.objects.get(key) == f"a long run's report ({how})".encode()
        assert await _manifest(rig.pool, job_id) == [(key, key.removeprefix("sha256-"))]

    gone = rig.objects.put(b"collected while its handler ran")
    age(rig.objects, gone, 3600)
    job_id, ctx = await _claimed(rig, "collected")
    assert collect_garbage(rig.objects, set(), retention) == [gone]
    with pytest.raises(ObjectNotFound):
        await ctx.publish(_mark(job_id), object_key=gone)
    with pytest.raises(ObjectNotFound):
        await ctx.publish(_mark(job_id, (ctx, gone)))
    assert not ctx.published and await rig.state(job_id) == JobState.RUNNING
    assert await _manifest(rig.pool, job_id) == []
    assert (
        await rig.pool.fetchval("SELECT count(*) FROM public.marks WHERE job_id = $1", job_id) == 0
    )


async def test_a_publish_tried_again_restarts_its_object_s_age_at_each_try(plain: Rig) -> None:
    """A publish whose try the server cancels (a statement timeout: tried again) may commit
    a later try a lease or more after the first; each try restarts the object's age, so a
    collection during the later try keeps it. Before, only the first try did, and the
    manifest row could name an object the collector had removed meanwhile."""
    rig = plain
    retention = 60.0
    key = rig.objects.put(b"a report whose publish was tried again")
    collected: list[str] = []
    tries = 0
    job_id, ctx = await _claimed(rig, "tried-again")

    async def callback(tx: Tx) -> None:
        nonlocal tries
        tries += 1
        if tries == 1:
            age(rig.objects, key, 3600)  # the next try comes long after this one's start
            await tx.execute("SET LOCAL statement_timeout = '10ms'")
            await tx.execute("SELECT pg_sleep(1)")  # QueryCanceledError: tried again
        await _mark(job_id)(tx)
        collected.extend(collect_garbage(rig.objects, set(), retention))

    await ctx.publish(callback, object_key=key)
    assert tries == 2 and collected == []
    assert rig.objects.get(key) == b"a report whose publish was tried again"
    assert await _manifest(rig.pool, job_id) == [(key, key.removeprefix("sha256-"))]
    assert await rig.state(job_id) == JobState.SUCCEEDED


async def test_an_object_store_that_fails_is_not_tried_again_until_the_deadline(
    plain: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk under the object store failing (a permission, a read-only or broken file
    system) at a publish's refresh is the store's error, typed, raised at once: not an OSError
    the publish's retry takes for a lost connection and tries again until the handler's
    deadline (control: the publish tried again for a lost database answer, above)."""
    rig = plain
    key = rig.objects.put(b"on a disk that fails")
    job_id, ctx = await _claimed(rig, "disk-fails")

    def broken(key: str) -> None:
        raise PermissionError(13, "Permission denied", key)

    monkeypatch.setattr(rig.objects, "touch", broken)
    with anyio.fail_after(5), pytest.raises(ObjectStoreUnavailable):
        await ctx.publish(_mark(job_id), object_key=key)
    assert not ctx.published and await rig.state(job_id) == JobState.RUNNING
    assert await _manifest(rig.pool, job_id) == []
