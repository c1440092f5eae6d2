"""The worker on real PostgreSQL and the provider simulator: the report job end to end,
heartbeats, deadlines, a lease lost to a blocked event loop, and SIGTERM-style stops."""

from __future__ import annotations

import errno
import json
import os
import time

import anyio
import asyncpg
import pytest

from accord import observe
from accord.demo import DEFAULT_OWNER, EFFECT_KEY, WORKFLOW, report, report_handler
from accord.demo.provider import Fault
from accord.jobs import FenceLost, JobState, Store, submit
from accord.jobs.errors import JournalBroken
from accord.jobs.models import Lease
from accord.jobs.runner import (
    Ending,
    Handler,
    JobContext,
    Success,
    Worker,
    WorkerConfig,
    attempts,
    open_journal,
    scan_journal,
)
from accord.jobs.runner.endings import Finished
from accord.schemas import telemetry
from tests.integration.runner.conftest import TENANT, Rig, running, wait_for

pytestmark = pytest.mark.timeout(60)


async def _register(rig: Rig, workflow: str) -> None:
    await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=True)


def _succeeded(rig: Rig, job_id: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return await rig.state(job_id) == JobState.SUCCEEDED

    return check


async def test_report_job_publishes_report_row_manifest_and_event(rig: Rig) -> None:
    job_id = await rig.submit_report("r1", "quarterly numbers")
    worker = rig.worker({WORKFLOW: (report_handler(rig.client), 30.0)})
    async with running(worker):
        await wait_for(_succeeded(rig, job_id))
    published = await report(rig.pool, TENANT, "r1")
    assert published is not None and (published.job_id, published.generation) == (job_id, 1)
    # the provider's own evidence: one accepted request, the receipt the report names
    evidence = rig.provider.evidence()
    assert [e.receipt_id for e in evidence] == [published.provider_receipt]
    assert await rig.effects(job_id) == [(EFFECT_KEY, 1, "succeeded", published.provider_receipt)]
    # the manifest row makes exactly the report's object authoritative
    manifest = await rig.pool.fetch("SELECT job_id, object_key FROM jobs.results")
    assert [(r["job_id"], r["object_key"]) for r in manifest] == [(job_id, published.object_key)]
    body = json.loads(rig.objects.get(published.object_key))
    assert body["provider_receipt"] == published.provider_receipt and body["generation"] == 1
    # the domain row and both events, in the outbox
    assert await rig.pool.fetchval("SELECT state FROM demo.submissions") == "published"
    events = await rig.pool.fetch(
        "SELECT type, operation_id FROM relay.outbox ORDER BY id",
    )
    assert [(e["type"], e["operation_id"]) for e in events] == [
        ("report.accepted", "report:r1"),
        ("report.published", "report:r1"),
    ]
    # the journal: claim, effect begin, effect outcome, publish, in that order
    records = scan_journal(rig.journal_path()).records
    assert [r["type"] for r in records] == ["claim", "effect_begin", "effect_outcome", "publish"]
    assert records[2]["receipt"] == published.provider_receipt
    assert records[3]["object_key"] == published.object_key
    assert worker.stats.endings == {"published": 1}


async def test_several_workers_and_classes_side_by_side_each_job_runs_once(rig: Rig) -> None:
    await _register(rig, "tally")
    runs: list[tuple[str, int]] = []

    async def tally(ctx: JobContext) -> None:
        runs.append((ctx.lease.operation_id, ctx.lease.generation))
        await anyio.sleep(0.01)

    def counted(handler: Handler, box: dict[str, int]) -> Handler:
        async def run(ctx: JobContext) -> None:
            box["now"] += 1
            box["max"] = max(box["max"], box["now"])
            try:
                await handler(ctx)
            finally:
                box["now"] -= 1

        return run

    reports = [await rig.submit_report(f"r{i}") for i in range(6)]
    tallies = [await rig.submit_job(f"t{i}", "tally") for i in range(12)]
    boxes = [{"now": 0, "max": 0}, {"now": 0, "max": 0}]
    one, two = (
        rig.worker(
            {
                WORKFLOW: (counted(report_handler(rig.client), box), 30.0),
                "tally": (counted(tally, box), 30.0),
            },
            journal=name,
            concurrency=concurrency,
        )
        for name, concurrency, box in (("w1", 3, boxes[0]), ("w2", 2, boxes[1]))
    )
    async with running(one), running(two):

        async def all_done() -> bool:
            done = await rig.pool.fetchval(
                "SELECT count(*) FROM jobs.jobs WHERE state = 'succeeded'"
            )
            return bool(done == len(reports) + len(tallies))

        await wait_for(all_done)
    assert sorted(runs) == sorted((f"t{i}", 1) for i in range(12))
    assert len(rig.provider.evidence()) == len(reports)
    assert await rig.pool.fetchval("SELECT count(*) FROM demo.reports") == len(reports)
    assert one.stats.claimed + two.stats.claimed == len(reports) + len(tallies)
    # two classes share each worker's slots: never more at once than its concurrency
    assert boxes[0]["max"] <= 3 and boxes[1]["max"] <= 2


async def test_heartbeat_keeps_a_long_handler_s_lease(rig: Rig) -> None:
    await _register(rig, "long")
    job_id = await rig.submit_job("op-long", "long")

    async def long(ctx: JobContext) -> None:
        await anyio.sleep(2.5)  # two and a half leases
        await ctx.publish()

    # rescue runs every 0.2 s in the same process: only the renewals keep the job ours
    worker = rig.worker({"long": (long, 30.0)}, lease_s=1.0, rescue_every_s=0.2)
    async with running(worker):
        await wait_for(_succeeded(rig, job_id))
    row = await rig.job(job_id)
    assert (row["generation"], row["attempts"]) == (1, 1)
    # at most every third of the lease: no more than 2.5 s / (1 s / 3) renewals (+1 slack)
    assert 4 <= worker.stats.renewals <= 8
    assert worker.stats.rescued == {}


async def test_a_lease_lost_to_a_blocked_loop_cannot_publish_the_reclaim_can(rig: Rig) -> None:
    await _register(rig, "hog")
    job_id = await rig.submit_job("op-hog", "hog")
    published: list[int] = []

    async def hog(ctx: JobContext) -> None:
        if ctx.lease.generation == 1:
            # Blocks the event loop past the lease: the heartbeat cannot run.
            time.sleep(1.3)  # noqa: ASYNC251 - the point of the test
        with anyio.CancelScope(shield=True):  # finish the work whatever the deadline says
            await ctx.publish()
        published.append(ctx.lease.generation)

    worker = rig.worker({"hog": (hog, 30.0)}, lease_s=1.0, rescue_every_s=0.1)
    async with running(worker):
        await wait_for(_succeeded(rig, job_id))
    endings = sorted((f.generation, f.ending) for f in worker.stats.recent)
    # the stale attempt's publish was refused; the attempt that re-claimed it published
    assert endings == [(1, Ending.FENCE_LOST), (3, Ending.PUBLISHED)]
    assert published == [3]
    assert (await rig.job(job_id))["generation"] == 3  # claim, rescue, claim


async def test_handler_deadline_cancels_and_requeues(rig: Rig) -> None:
    await _register(rig, "slow")
    control = await rig.submit_job("op-quick", "slow", sleep_s=0.05)
    job_id = await rig.submit_job("op-stuck", "slow", sleep_s=60)
    started: dict[int, float] = {}

    async def slow(ctx: JobContext) -> None:
        started[ctx.lease.generation] = anyio.current_time()
        if ctx.lease.generation == 1:
            await anyio.sleep(float(ctx.payload["sleep_s"]))

    worker = rig.worker({"slow": (slow, 0.5)}, lease_s=5.0)
    async with running(worker):
        await wait_for(_succeeded(rig, control))  # control: inside the deadline
        await wait_for(_succeeded(rig, job_id))
    stuck = [f for f in worker.stats.recent if f.job_id == job_id]
    assert [(f.generation, f.ending, f.state, f.reason) for f in stuck] == [
        (1, Ending.DEADLINE, JobState.QUEUED, "deadline"),
        (2, Ending.PUBLISHED, JobState.SUCCEEDED, None),
    ]
    assert (await rig.job(job_id))["attempts"] == 2


async def test_handler_error_is_retried_then_poisoned(rig: Rig) -> None:
    await _register(rig, "flaky")
    async with rig.pool.acquire() as conn, conn.transaction():
        done = await submit(
            conn, tenant=TENANT, workflow="flaky", operation_id="f1", digest="d", max_attempts=2
        )

    async def flaky(ctx: JobContext) -> None:
        raise ValueError("boom")

    worker = rig.worker({"flaky": (flaky, 5.0)})
    async with running(worker):

        async def poisoned() -> bool:
            return await rig.state(done.job_id) == JobState.POISON

        await wait_for(poisoned)
    row = await rig.job(done.job_id)
    assert (row["attempts"], row["last_error"]) == (2, "handler:ValueError")


async def test_stop_lets_in_flight_work_finish_and_claims_nothing_new(rig: Rig) -> None:
    await _register(rig, "steady")
    first = await rig.submit_job("s1", "steady")
    entered = anyio.Event()

    async def steady(ctx: JobContext) -> None:
        entered.set()
        await anyio.sleep(0.5)

    worker = rig.worker({"steady": (steady, 30.0)}, grace_s=10.0)
    async with anyio.create_task_group() as tg:
        await tg.start(_run, worker)
        await entered.wait()
        worker.stop()
        later = await rig.submit_job("s2", "steady")
    worker.journal.close()
    assert await rig.state(first) == JobState.SUCCEEDED
    assert await rig.state(later) == JobState.QUEUED


def _finished_total(workflow: str, ending: str) -> float:
    labels = {"workflow": workflow, "ending": ending}
    return observe.REGISTRY.get_sample_value("accord_jobs_finished_total", labels) or 0.0


async def test_stop_past_grace_records_the_interrupted_effect_unknown(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """...and the attempt's ending reaches its span and accord_jobs_finished_total{ending=
    "stopped"}, as any other ending does (before, a stop recorded the give-up only)."""
    ended: list[Finished] = []
    monkeypatch.setattr(attempts, "end_span", lambda span, finished: ended.append(finished))
    stopped_before = _finished_total(WORKFLOW, "stopped")
    rig.provider.set_fault(Fault.SLOW, delay_s=30)
    job_id = await rig.submit_report("r-stop")
    worker = rig.worker({WORKFLOW: (report_handler(rig.client), 60.0)}, grace_s=0.3)

    async def dispatched() -> bool:
        return bool(await rig.effects(job_id)) and len(rig.provider.evidence()) == 1

    async with anyio.create_task_group() as tg:
        await tg.start(_run, worker)
        await wait_for(dispatched)
        worker.stop()
    worker.journal.close()
    assert await rig.effects(job_id) == [(EFFECT_KEY, 1, "unknown", None)]
    row = await rig.job(job_id)
    assert (row["state"], row["last_error"]) == (JobState.UNKNOWN, "worker_stopped")
    assert [(f.ending, f.state) for f in worker.stats.recent] == [
        (Ending.STOPPED, JobState.UNKNOWN)
    ]
    assert [(f.ending, f.state) for f in ended] == [(Ending.STOPPED, JobState.UNKNOWN)]
    assert _finished_total(WORKFLOW, "stopped") == stopped_before + 1


class _TraceWaits(Store):
    """A store whose attempt-trace write (the attempt's first round trip while tracing)
    waits until the test lets it go."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.entered = anyio.Event()

    async def note_trace(
        self,
        lease: Lease,
        carrier: dict[str, str],
        effect_key: str | None = None,
        seq: int | None = None,
    ) -> bool:
        if effect_key is None:
            self.entered.set()
            await anyio.sleep_forever()
        return await super().note_trace(lease, carrier, effect_key, seq)


async def test_a_stop_before_the_handler_begins_gives_the_job_back_at_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop that cancels an attempt before its handler began (in its first round trip,
    keeping its trace) requeues the job at once, worker_stopped, instead of leaving it
    running until its 30 s lease runs out; the next worker then runs it (control)."""
    trace_id, span_id = "ab" * 16, "cd" * 8
    monkeypatch.setattr(
        telemetry, "span_headers", lambda span: {"traceparent": f"00-{trace_id}-{span_id}-01"}
    )
    monkeypatch.setattr(telemetry, "exporting", lambda: True)
    await _register(rig, "traced")
    job_id = await rig.submit_job("tr1", "traced")
    ran: list[int] = []

    async def traced(ctx: JobContext) -> None:
        ran.append(ctx.lease.generation)

    store = _TraceWaits(rig.pool, backoff_base_s=0.0)
    stopped = Worker(
        WorkerConfig(owner=DEFAULT_OWNER, lease_s=30.0, poll_s=0.05, rescue_every_s=None),
        store=store,
        journal=open_journal(rig.journal_path("w1"), "w1"),
        objects=rig.objects,
        pool=rig.pool,
    )
    stopped.register("traced", traced, timeout_s=10.0)
    async with anyio.create_task_group() as tg:
        await tg.start(_run, stopped)
        with anyio.fail_after(10):
            await store.entered.wait()
        stopped.stop(now=True)
    stopped.journal.close()
    row = await rig.job(job_id)
    assert (row["state"], row["last_error"]) == (JobState.QUEUED, "worker_stopped")
    assert ran == []
    assert [(f.ending, f.state) for f in stopped.stats.recent] == [
        (Ending.STOPPED, JobState.QUEUED)
    ]
    # Control: given back, not lost: the next worker claims it and its handler runs.
    async with running(rig.worker({"traced": (traced, 10.0)}, journal="w2")):
        await wait_for(_succeeded(rig, job_id))
    assert ran == [2]


async def _run(worker, *, task_status) -> None:  # type: ignore[no-untyped-def]
    await worker.run(task_status=task_status)


async def test_publish_after_losing_the_fence_raises_fence_lost(rig: Rig) -> None:
    await _register(rig, "plain")
    job_id = await rig.submit_job("p1", "plain")
    [lease] = await rig.store.claim("plain", DEFAULT_OWNER, lease_s=30)
    await rig.store.cancel(job_id, reason="test")
    ctx = JobContext(lease, store=rig.store, objects=rig.objects, journal=_no_journal)
    with pytest.raises(FenceLost):
        await ctx.publish()
    assert not ctx.published


async def _no_journal(record: object) -> None:
    return None


async def test_postgresql_cutting_the_workers_connections_loses_no_job(rig: Rig) -> None:
    """The server terminates every connection of the worker's pool three times while jobs run.
    The worker keeps going: write-backs that were cut are retried, or their leases expire and
    rescue returns the work; every job ends succeeded (tally has no effects, so a rerun is
    allowed) and the worker is still running at the end."""
    await _register(rig, "tally")
    runs: list[str] = []

    async def tally(ctx: JobContext) -> None:
        await anyio.sleep(0.02)
        runs.append(ctx.lease.operation_id)

    jobs = [await rig.submit_job(f"t{i}", "tally") for i in range(60)]
    worker = rig.worker({"tally": (tally, 30.0)}, concurrency=4, rescue_every_s=0.2)
    admin = await asyncpg.connect(rig.pg_dsn)
    others = (
        "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'"
    )
    try:
        async with running(worker):
            for cut in range(3):
                await wait_for(lambda n=cut: _at_least(runs, 10 * (n + 1)))
                await admin.execute(f"SELECT pg_terminate_backend(pid) {others}")

            async def all_succeeded() -> bool:  # on the admin connection: never cut
                done = await admin.fetchval(
                    "SELECT count(*) FROM jobs.jobs WHERE state = 'succeeded'"
                )
                return bool(done == len(jobs))

            await wait_for(all_succeeded, within=60)
        # running() re-raises whatever ended the worker: it survived the cuts on its own
    finally:
        await admin.close()
    assert set(runs) == {f"t{i}" for i in range(60)}


async def _at_least(runs: list[str], n: int) -> bool:
    return len(runs) >= n


async def test_a_journal_whose_fsync_failed_stops_the_worker_before_it_claims_more(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _register(rig, "mailer")
    sent: list[int] = []

    async def mailer(ctx: JobContext) -> None:
        async def send() -> Success:
            sent.append(ctx.lease.job_id)
            return Success(f"sent-{ctx.lease.job_id}")

        await ctx.effect("mail.send", {"to": ctx.payload["to"]}, send)

    first = await rig.submit_job("m1", "mailer", to="a")
    worker = rig.worker({"mailer": (mailer, 10.0)}, concurrency=1)
    failure: list[BaseException] = []
    ended = anyio.Event()

    async def run() -> None:
        try:
            await worker.run()
        except BaseException as exc:  # noqa: BLE001 - the test reads it below
            failure.append(exc)
        finally:
            ended.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await wait_for(_succeeded(rig, first))  # control: a healthy journal, a job done

            def failing_fsync(fd: int) -> None:
                raise OSError(errno.EIO, "simulated fsync failure")

            monkeypatch.setattr(os, "fsync", failing_fsync)
            second = await rig.submit_job("m2", "mailer", to="b")
            third = await rig.submit_job("m3", "mailer", to="c")
            with anyio.fail_after(20):  # the worker ends on its own: nobody stops it
                await ended.wait()
    finally:
        monkeypatch.undo()
        worker.journal.close()
    # The first write after the fault broke the journal (the first job's noted records, or
    # the second's claim or effect begin, whichever group went first) and the worker ended.
    assert isinstance(_leaf(failure[0]), JournalBroken), failure
    assert sent == [first]  # nothing dispatched after the fault
    assert await rig.state(second) == JobState.QUEUED
    endings = [f.ending for f in worker.stats.recent]
    if endings == [Ending.PUBLISHED]:  # broken before the second was claimed
        assert (await rig.job(second))["attempts"] == 0
    else:  # claimed, its begin not journaled: never dispatched, not the job's failure
        assert endings == [Ending.PUBLISHED, Ending.STOPPED], endings
        assert (await rig.job(second))["last_error"] == "journal_broken"
        assert await rig.effects(second) in ([], [("mail.send", 1, "failed_before_dispatch", None)])
    assert (await rig.job(third))["attempts"] == 0  # claimed by nobody: the worker stopped


async def test_a_job_the_broken_journal_cancelled_is_recorded_as_the_journal_s_fault(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job waiting in its handler, not on an append, when another job's append breaks the
    journal: the worker ends and cancels it, and its attempt says journal_broken (the same
    reason as the job whose append failed), not an ordinary shutdown's worker_stopped."""
    await rig.store.register_workflow("waiter", DEFAULT_OWNER, effects_enabled=True)
    await _register(rig, "mailer")
    waiting = anyio.Event()

    async def waiter(ctx: JobContext) -> None:
        waiting.set()
        await anyio.sleep_forever()

    async def mailer(ctx: JobContext) -> None:
        async def send() -> Success:
            return Success("sent")

        await ctx.effect("mail.send", {"to": ctx.payload["to"]}, send)

    held = await rig.submit_job("w1", "waiter")
    worker = rig.worker({"waiter": (waiter, 30.0), "mailer": (mailer, 10.0)}, concurrency=2)
    failure: list[BaseException] = []
    try:
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                try:
                    await worker.run()
                except BaseException as exc:  # noqa: BLE001 - the test reads it below
                    failure.append(exc)

            tg.start_soon(run)
            with anyio.fail_after(20):
                await waiting.wait()  # the held job is in its handler, journal healthy

            def failing_fsync(fd: int) -> None:
                raise OSError(errno.EIO, "simulated fsync failure")

            monkeypatch.setattr(os, "fsync", failing_fsync)
            await rig.submit_job("m1", "mailer", to="a")
    finally:
        monkeypatch.undo()
        worker.journal.close()
    assert isinstance(_leaf(failure[0]), JournalBroken), failure
    row = await rig.job(held)
    assert (row["state"], row["last_error"]) == (JobState.QUEUED, "journal_broken")
    assert Ending.STOPPED in [f.ending for f in worker.stats.recent if f.job_id == held]


def _leaf(error: BaseException) -> BaseException:
    """The one error inside (nested) exception groups."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


async def test_a_busy_database_delays_the_claims_and_never_ends_the_worker(rig: Rig) -> None:
    """A claim the database cancels (here its lock_timeout, while an operator's transaction
    holds the class's registration row; a deadlock or a statement_timeout alike) is tried
    again with the backoff: the worker lives, and claims the job once the lock is gone.
    Before, the error ended the worker (and recorded its effects in flight unknown).
    Control: it claims and runs a job before the lock."""
    await _register(rig, "busy")
    ran: list[str] = []

    async def busy(ctx: JobContext) -> None:
        ran.append(ctx.lease.operation_id)

    pool = await asyncpg.create_pool(
        rig.pg_dsn, min_size=1, max_size=12, server_settings={"lock_timeout": "100ms"}
    )
    assert pool is not None
    worker = Worker(
        WorkerConfig(owner=DEFAULT_OWNER, lease_s=30.0, poll_s=0.05, rescue_every_s=None),
        store=Store(pool),
        journal=open_journal(rig.journal_path("busy"), "busy"),
        objects=rig.objects,
        pool=pool,
    )
    worker.register("busy", busy, timeout_s=10.0)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(_run, worker)
            first = await rig.submit_job("b1", "busy")
            await wait_for(_succeeded(rig, first))  # control
            async with rig.pool.acquire() as holder, holder.transaction():
                await holder.execute(
                    "SELECT 1 FROM jobs.workflows WHERE workflow = 'busy' FOR UPDATE"
                )
                second = await rig.submit_job("b2", "busy")
                await anyio.sleep(1.0)  # claims cancelled by the lock timeout meanwhile
                assert await rig.state(second) == JobState.QUEUED
            await wait_for(_succeeded(rig, second))
            worker.stop()
    finally:
        worker.journal.close()
        await pool.close()
    assert ran == ["b1", "b2"]
