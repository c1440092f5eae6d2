"""The worker's claim loop asks the database only when asking can find work: a slot freed
while every slot was taken claims at once (or, with a claim linger, after it: the slots
freeing meanwhile share that claim); a slot freed after a claim that found fewer jobs than
free slots waits for the poll (no empty claim per finished job)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio
import pytest

from accord.demo import DEFAULT_OWNER, WORKFLOW, report_handler
from accord.jobs import AuthorityGate, FileLedger, JobState, LedgerEntry, Store, authority_watch
from accord.jobs.runner import Handler, JobContext, Worker, WorkerConfig, open_journal
from accord.schemas.db import create_pool
from tests.integration.ops.proxy import Proxy
from tests.integration.runner.conftest import CountingStore, Rig, running, wait_for

pytestmark = pytest.mark.timeout(60)
POLL_S = 3.0


async def _done(ctx: JobContext) -> None:
    await ctx.publish()


async def _staggered(ctx: JobContext) -> None:
    """Job k of each four finishes 2 s + k * 20 ms after its claim."""
    await anyio.sleep(2.0 + ctx.payload["k"] % 4 * 0.02)
    await ctx.publish()


def _worker(
    rig: Rig,
    store: CountingStore,
    name: str,
    concurrency: int,
    linger_s: float = 0.0,
    handler: Handler = _done,
) -> Worker:
    worker = Worker(
        WorkerConfig(
            owner=DEFAULT_OWNER,
            concurrency=concurrency,
            poll_s=POLL_S,
            claim_linger_s=linger_s,
            rescue_every_s=None,
        ),
        store=store,
        journal=open_journal(rig.journal_path(name), name),
        objects=rig.objects,
        pool=rig.pool,
    )
    worker.register(name, handler, timeout_s=10.0)
    return worker


async def _all_succeeded(rig: Rig, jobs: list[int]) -> bool:
    return {await rig.state(job) for job in jobs} == {JobState.SUCCEEDED}


async def test_a_slot_freed_while_all_were_taken_claims_at_once(rig: Rig) -> None:
    store = CountingStore(rig.pool)
    await store.register_workflow("full", DEFAULT_OWNER, effects_enabled=True)
    jobs = [await rig.submit_job(f"full-{i}", "full") for i in range(10)]
    worker = _worker(rig, store, "full", concurrency=2)
    started = anyio.current_time()
    async with running(worker):
        await wait_for(lambda: _all_succeeded(rig, jobs))
        elapsed = anyio.current_time() - started
    # Two slots, ten jobs: each freed slot claimed the next job at once. Waiting for the
    # poll instead would take four polls (12 s) at least.
    assert elapsed < POLL_S
    assert store.claims >= 5
    assert worker.stats.claims == store.claims


async def test_a_slot_freed_after_a_short_claim_waits_for_the_poll(rig: Rig) -> None:
    store = CountingStore(rig.pool)
    await store.register_workflow("short", DEFAULT_OWNER, effects_enabled=True)
    jobs = [await rig.submit_job(f"short-{i}", "short") for i in range(4)]
    worker = _worker(rig, store, "short", concurrency=8)
    async with running(worker):
        await wait_for(lambda: _all_succeeded(rig, jobs))
        await anyio.sleep(0.5)
        # One claim took all four (fewer than the eight free slots): the four slots they
        # freed asked nothing more before the poll.
        assert store.claims == 1
        assert worker.stats.claimed == 4
        assert worker.stats.claims == 1  # the count on the worker's stop line


@pytest.mark.parametrize("linger_s", [0.0, 0.3])
async def test_with_a_claim_linger_the_slots_freeing_meanwhile_share_one_claim(
    rig: Rig, linger_s: float
) -> None:
    store = CountingStore(rig.pool)
    name = "staggered"
    await store.register_workflow(name, DEFAULT_OWNER, effects_enabled=True)
    jobs = [await rig.submit_job(f"staggered-{k}", name, k=k) for k in range(12)]
    worker = _worker(rig, store, name, concurrency=4, linger_s=linger_s, handler=_staggered)
    async with running(worker):
        await wait_for(lambda: _all_succeeded(rig, jobs))
    assert worker.stats.claimed == 12
    took = [size for size in store.sizes if size]
    if linger_s:
        # Four at a time: each claim after the first waited out the linger (a tenth of the
        # jobs' 2 s: 0.2 s), by which time the slots of the four jobs before (done within
        # 60 ms of each other, give or take their publishes on a loaded machine) were all
        # free. (With 1 s jobs the 40 ms margin was lost once on a machine with one core
        # busy elsewhere: [4, 3, 1, 3, 1].)
        assert took == [4, 4, 4]
    else:
        # Control: each slot freed while all were taken claimed at once, mostly one job.
        assert took[0] == 4 and len(took) >= 8


async def _drain(
    rig: Rig, name: str, n: int, *, concurrency: int, linger_s: float
) -> tuple[float, CountingStore]:
    """N no-op jobs of class ``name`` through one worker: the seconds it took, its store."""
    store = CountingStore(rig.pool)
    await store.register_workflow(name, DEFAULT_OWNER, effects_enabled=True)
    jobs = [await rig.submit_job(f"{name}-{i}", name) for i in range(n)]
    worker = _worker(rig, store, name, concurrency=concurrency, linger_s=linger_s)
    started = anyio.current_time()
    async with running(worker):
        await wait_for(lambda: _all_succeeded(rig, jobs))
        return anyio.current_time() - started, store


async def test_one_slot_never_lingers(rig: Rig) -> None:
    """With one slot nothing else can free during a linger: each job is claimed as soon as
    the one before it ended, whatever the linger (here 1 s: five jobs would take 4 s more)."""
    elapsed, store = await _drain(rig, "single", 5, concurrency=1, linger_s=1.0)
    assert elapsed < 2.0, elapsed
    assert [size for size in store.sizes if size] == [1, 1, 1, 1, 1]


async def test_short_jobs_linger_a_tenth_of_their_time_at_most(rig: Rig) -> None:
    """A linger of 1 s, but jobs that take milliseconds: a freed slot waits a tenth of that at
    most, so 24 jobs on 4 slots take well under the 5 s that five whole lingers would."""
    elapsed, _ = await _drain(rig, "brief", 24, concurrency=4, linger_s=1.0)
    assert elapsed < 2.5, elapsed


class HeldLedger(FileLedger):
    """A ledger whose reads this test can hold: an authority check then waits in its first
    step, and the gate stays shut until the test lets it go on."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.released = anyio.Event()
        self.released.set()

    def hold(self) -> None:
        self.released = anyio.Event()

    async def read(self) -> dict[str, LedgerEntry]:
        await self.released.wait()
        return await super().read()


async def test_claims_wait_for_an_authority_check_after_a_lost_database(
    rig: Rig, tmp_path: Path
) -> None:
    """The worker as `accord worker` composes it: PostgreSQL through a proxy of this test's
    own, a pool that reports its new connections to the gate, the authority watch on the
    same pool (its checks held here at will, through the ledger they read first). Control:
    it claims and publishes a report. Then, twice, a report submitted once the database
    answers again stays queued while the check that began after the loss is held, and is
    published once that check passes:
    1. a long cut: the claim loop's own claims fail and shut the gate;
    2. a restart while the worker idles (the proxy drops every connection and lets new ones
       through at once): no call fails, the claims' connection is silently replaced, and
       the new connection shuts the gate before a claim can use it (before, the next claim
       ran on it at once)."""
    proxy = Proxy.of(rig.pg_dsn)
    gate = AuthorityGate()
    ledger = HeldLedger(tmp_path / "authority.ledger")
    # min_size 0: no floor for the pool to restore by itself after the restart (asyncpg
    # reconnects up to it in the background), so the claims' own silent reconnect is what
    # must shut the gate, before the claim that would run on it.
    pool = await create_pool(
        proxy.url(rig.pg_dsn), min_size=0, max_size=12, init=gate.connection_opened
    )
    worker = Worker(
        WorkerConfig(owner=DEFAULT_OWNER, lease_s=3.0, poll_s=0.2, rescue_every_s=None),
        store=Store(pool, backoff_base_s=0.0),
        journal=open_journal(rig.journal_path(), "w1"),
        objects=rig.objects,
        pool=pool,
        authority=gate,
    )
    worker.register(WORKFLOW, report_handler(rig.client), timeout_s=30.0)

    async def shut() -> bool:
        return not gate.is_open()

    async def published(report_id: str) -> None:
        job_id = await rig.submit_report(report_id)
        await wait_for(lambda: _state_is(rig, job_id, JobState.SUCCEEDED))

    async def waits_for_the_check(report_id: str) -> None:
        job_id = await rig.submit_report(report_id)
        await anyio.sleep(1.5)  # the worker idles and its database answers
        assert await rig.state(job_id) == JobState.QUEUED
        ledger.released.set()  # the held check goes on and passes
        await wait_for(lambda: _state_is(rig, job_id, JobState.SUCCEEDED))

    try:
        async with anyio.create_task_group() as tg:
            watch = partial(authority_watch, gate=gate)
            await tg.start(watch, pool, ledger, 60.0)  # a check now, then only after a loss
            async with running(worker):
                await published("r1")  # control
                ledger.hold()
                proxy.cut()
                await wait_for(shut)
                proxy.restore()
                await waits_for_the_check("r2")
                await published("r3")  # control again
                ledger.hold()
                await anyio.sleep(0.5)  # idle: the claim loop naps between empty claims
                proxy.cut()
                proxy.restore()
                await waits_for_the_check("r4")
            tg.cancel_scope.cancel()
    finally:
        await pool.close()
        proxy.close()


async def _state_is(rig: Rig, job_id: int, state: JobState) -> bool:
    return await rig.state(job_id) == state
