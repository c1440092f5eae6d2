"""The attempt's held connection (``Store.hold``): a job's fenced calls share one pool
connection; a call that fails gives it back (reset, or discarded) so the next call starts
clean; a connection cut between calls is replaced, one cut in a call is ConnectionLost at the
seam; concurrent calls do not queue behind it. Each of those holds for a hold on the pool's
store and on a store that keeps its connections between holds (``Store.keeping``), whose
publishes reset what their callback left on the session (``jobs.clean_session``), so that
no session state crosses from one job to the next. The worker keeps them: it pays no pool
round trip per job (one per call before held connections, one per job before keeping)."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest
from opentelemetry import trace

from accord import observe
from accord.demo import DEFAULT_OWNER
from accord.jobs import JobState, Store, sql
from accord.jobs import publish as publish_module
from accord.jobs.models import Lease
from accord.jobs.runner import JobContext, Success, Worker, WorkerConfig, open_journal
from accord.jobs.runner import attempts as attempts_module
from accord.jobs.runner import context as context_module
from accord.schemas import telemetry
from accord.schemas.errors import ConfigError, ConnectionLost
from tests.integration.runner.conftest import CountingStore, Rig, running, wait_for

pytestmark = pytest.mark.timeout(60)
PLAIN = "plain"
WORKER_SLOTS = 3


async def _leases(rig: Rig, n: int, workflow: str = PLAIN) -> list[Lease]:
    await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=True)
    for i in range(n):
        await rig.submit_job(f"{workflow}-{i}", workflow)
    leases = await rig.store.claim(workflow, DEFAULT_OWNER, lease_s=30, limit=n)
    assert len(leases) == n
    return leases


class _Pids:
    """A publish callback that notes which backend ran it."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def __call__(self, tx: Any) -> None:
        self.seen.append(await tx.fetchval("SELECT pg_backend_pid()"))


@pytest.fixture(params=["pool", "kept"])
async def source(request: pytest.FixtureRequest, rig: Rig) -> AsyncIterator[Store]:
    """The store whose holds a test takes: the pool's, or one keeping connections."""
    if request.param == "pool":
        yield rig.store
        return
    async with rig.store.keeping() as kept:
        yield kept


async def test_calls_share_one_connection_and_a_failed_call_gives_it_back(
    rig: Rig, source: Store
) -> None:
    first, second, third = await _leases(rig, 3)
    pids = _Pids()

    async def boom(tx: Any) -> None:
        await pids(tx)
        raise ValueError("the callback failed")

    async with source.hold() as held:
        await held.publish(first, pids)
        await held.renew(second, 30)
        await held.publish(second, pids)
        assert pids.seen[0] == pids.seen[1]  # one connection for the sequence
        with pytest.raises(ValueError):
            await held.publish(third, boom)  # rolled back; the connection went back
        await held.publish(third, pids)
    assert [await rig.state(lease.job_id) for lease in (first, second, third)] == [
        JobState.SUCCEEDED
    ] * 3


async def test_a_call_cancelled_in_its_transaction_leaves_no_lock_and_no_aborted_tx(
    rig: Rig, source: Store
) -> None:
    # Control: a bare connection cancelled inside a transaction is left in the aborted
    # transaction; reused as it is, its next statement fails.
    conn = await asyncpg.connect(rig.pg_dsn)
    try:
        with anyio.move_on_after(0.2):
            async with conn.transaction():
                await conn.execute("SELECT pg_sleep(5)")
        with pytest.raises(asyncpg.InFailedSQLTransactionError):
            await conn.fetchval("SELECT 1")
    finally:
        conn.terminate()

    [lease] = await _leases(rig, 1)

    async def stuck(tx: Any) -> None:
        await tx.execute("SELECT pg_sleep(5)")  # inside the fenced transaction: row locked

    async with source.hold() as held:
        with anyio.move_on_after(0.3) as scope:
            await held.publish(lease, stuck)
        assert scope.cancelled_caught
        # the cancelled transaction's row lock is gone: a renewal through the pool passes
        with anyio.fail_after(3):
            lease = await rig.store.renew(lease, 30)
        await held.publish(lease)  # the held store's next call starts clean
    assert await rig.state(lease.job_id) == JobState.SUCCEEDED


async def test_a_cut_between_calls_is_replaced_a_cut_in_a_call_is_connection_lost(
    rig: Rig, source: Store
) -> None:
    # Control: a store over one bare connection whose backend is cut: ConnectionLost.
    bare = await asyncpg.connect(rig.pg_dsn)
    try:
        await rig.pool.execute("SELECT pg_terminate_backend($1)", bare.get_server_pid())
        with pytest.raises(ConnectionLost):
            await Store(bare).probe()
    finally:
        bare.terminate()

    first, second, third = await _leases(rig, 3)
    pids = _Pids()

    async def cut_myself(tx: Any) -> None:
        await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    async with source.hold() as held:
        await held.publish(first, pids)
        await rig.pool.execute("SELECT pg_terminate_backend($1)", pids.seen[0])
        await anyio.sleep(0.3)  # the client reads the server's goodbye
        await held.publish(second, pids)  # on a fresh connection
        assert pids.seen[1] != pids.seen[0]
        with pytest.raises(ConnectionLost):  # mapped at the seam, whatever asyncpg said
            await held.publish(third, cut_myself)
        await held.publish(third, pids)  # and the next call takes another connection
    assert [await rig.state(lease.job_id) for lease in (first, second, third)] == [
        JobState.SUCCEEDED
    ] * 3


async def test_concurrent_calls_do_not_queue_behind_the_held_connection(
    rig: Rig, source: Store
) -> None:
    leases = await _leases(rig, 2)
    pids = _Pids()

    async def slow(tx: Any) -> None:
        await pids(tx)
        await tx.execute("SELECT pg_sleep(0.5)")

    async with source.hold() as held:
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for lease in leases:
                tg.start_soon(held.publish, lease, slow)
        elapsed = time.monotonic() - started
    assert len(set(pids.seen)) == 2  # the second call took its own pool connection
    assert elapsed < 0.9  # side by side, not one after the other


# -- connections kept between holds ---------------------------------------------------------


class _Dirty:
    """A publish callback that leaves session state behind (it commits with the publish):
    a setting, a session advisory lock, a LISTEN and a cursor WITH HOLD."""

    async def __call__(self, tx: Any) -> None:
        await tx.execute("SET work_mem = '7MB'")
        await tx.execute("SELECT pg_advisory_lock(4242)")
        await tx.execute("LISTEN accord_left_behind")
        await tx.execute("DECLARE left_behind CURSOR WITH HOLD FOR SELECT 1")


class _Session:
    """A publish callback that reads its session: backend, setting, locks, LISTENs, cursors."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, int, int, int]] = []

    async def __call__(self, tx: Any) -> None:
        row = await tx.fetchrow(
            "SELECT pg_backend_pid() AS pid, current_setting('work_mem') AS work_mem,"
            " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            "  AND pid = pg_backend_pid()) AS locks,"
            " (SELECT count(*) FROM pg_listening_channels()) AS listens,"
            " (SELECT count(*) FROM pg_cursors WHERE name <> '') AS cursors"
        )
        self.seen.append(tuple(row.values()))  # type: ignore[arg-type]


async def _dirty_then_read(
    store: Store, rig: Rig, workflow: str
) -> tuple[int, tuple[int, str, int, int, int]]:
    """One hold publishes with the dirty callback, the next reads its session: the first
    hold's backend and what the second saw."""
    first, second = await _leases(rig, 2, workflow)
    pids, read = _Pids(), _Session()

    async def dirty(tx: Any) -> None:
        await pids(tx)
        await _Dirty()(tx)

    async with store.hold() as held:
        await held.publish(first, dirty)
    async with store.hold() as held:
        await held.publish(second, read)
    return pids.seen[0], read.seen[0]


async def test_a_kept_connection_carries_no_session_state_to_the_next_job(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Control: kept without the reset in the publish's last statement, the next hold gets
    # the same backend with everything the first job's callback left.
    plain = publish_module.one

    async def unclean(conn: Any, lease: Lease, result: Any = None, *, clean: bool = False) -> None:
        await plain(conn, lease, result)

    with monkeypatch.context() as patched:
        patched.setattr(publish_module, "one", unclean)
        async with rig.store.keeping() as kept:
            found = await _dirty_then_read(kept, rig, "unclean")
    pid, (again, work_mem, locks, listens, cursors) = found
    assert again == pid
    assert (work_mem, locks, listens, cursors) == ("7MB", 1, 1, 1)

    # The same backend serves the next job, and it starts as a fresh pool connection would.
    fresh = await rig.pool.fetchval("SELECT current_setting('work_mem')")
    assert fresh != "7MB"
    async with rig.store.keeping() as kept:
        pid, (again, work_mem, locks, listens, cursors) = await _dirty_then_read(kept, rig, "clean")
    assert again == pid  # kept: no release, no reset round trip
    assert (work_mem, locks, listens, cursors) == (fresh, 0, 0, 0)


async def test_keeping_gives_every_connection_back_and_a_failed_publish_keeps_none(
    rig: Rig,
) -> None:
    pool = await asyncpg.create_pool(rig.pg_dsn, min_size=1, max_size=4)
    assert pool is not None
    try:
        store = Store(pool)
        first, second = await _leases(rig, 2)
        pids = _Pids()

        async def dirty_then_fail(tx: Any) -> None:
            await pids(tx)
            await _Dirty()(tx)
            raise ValueError("the callback failed")

        async with store.keeping() as kept:
            async with kept.hold() as held:
                with pytest.raises(ValueError):
                    await held.publish(first, dirty_then_fail)
            # the failed call's connection went back to the pool (rolled back and reset)
            assert pool.get_idle_size() == pool.get_size()
            async with kept.hold() as held:
                await held.publish(second, pids)
            # the clean one is kept, out of the pool, until the store is left
            assert pool.get_idle_size() == pool.get_size() - 1
        assert pool.get_idle_size() == pool.get_size()
    finally:
        await pool.close()


async def test_a_kept_connection_idle_past_the_limit_goes_back_to_the_pool(rig: Rig) -> None:
    pool = await asyncpg.create_pool(rig.pg_dsn, min_size=1, max_size=4)
    assert pool is not None
    leases = iter(await _leases(rig, 12))

    async def publish_one(kept: Store, callback: Any = None) -> None:
        async with kept.hold() as held:
            await held.publish(next(leases), callback or _Pids())

    async def failing(tx: Any) -> None:
        raise RuntimeError("the callback failed")

    async def kept_after_a_pause(idle_s: float, *, then_fails: bool = False) -> int:
        """Two holds side by side (two kept), a pause of 0.3 s with no job, one more hold
        (whose publish fails with ``then_fails``: its connection goes back to the pool, kept
        by nobody): how many connections the store keeps out of the pool then."""
        async with Store(pool).keeping(idle_s=idle_s) as kept:
            async with anyio.create_task_group() as tg:
                tg.start_soon(publish_one, kept)
                tg.start_soon(publish_one, kept)
            assert pool.get_size() - pool.get_idle_size() == 2
            await anyio.sleep(0.3)
            if then_fails:
                with pytest.raises(RuntimeError):
                    await publish_one(kept, failing)
            else:
                await publish_one(kept)  # takes the newer, keeps it again
            out = pool.get_size() - pool.get_idle_size()
        assert pool.get_idle_size() == pool.get_size()  # every one back on exit
        return out

    try:
        assert await kept_after_a_pause(60.0) == 2  # control: within the limit, both kept
        assert await kept_after_a_pause(0.2) == 1  # past it, the unused one went back
        assert await kept_after_a_pause(60.0, then_fails=True) == 1  # control: the other kept
        # past it, the hold gave back every one idle past the limit before taking one
        assert await kept_after_a_pause(0.2, then_fails=True) == 0
    finally:
        await pool.close()


@pytest.mark.parametrize("idle_s", [-1.0, float("nan"), float("inf")])
async def test_a_bad_idle_limit_is_refused_before_anything_is_kept(rig: Rig, idle_s: float) -> None:
    async with rig.store.keeping(idle_s=0.0):  # control: zero keeps nothing idle, and works
        pass
    with pytest.raises(ConfigError, match="idle limit"):
        async with rig.store.keeping(idle_s=idle_s):
            pass


# -- the worker ---------------------------------------------------------------------------


class _Pooled(Store):
    """Control: the store before held connections (each call takes a pool connection)."""

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[Store]:
        yield self


class _Unkept(Store):
    """Control: the store before kept connections (each hold gives its connection back)."""

    @contextlib.asynccontextmanager
    async def keeping(self) -> AsyncIterator[Store]:
        yield self


class _CountedPooled(CountingStore, _Pooled):
    pass


class _CountedUnkept(CountingStore, _Unkept):
    pass


async def _resets(
    rig: Rig,
    store_class: type[CountingStore],
    name: str,
    n: int,
    statements: Counter[str] | None = None,
) -> tuple[int, int, int]:
    """Pool releases (each one a reset round trip), the start's excluded, claims, and the
    claims that took jobs, for ``n`` jobs of three fenced calls each (begin, finish effect,
    publish). ``statements``: counts every statement the worker's connections ran, by text."""
    resets = 0

    async def counting_reset(conn: Any) -> None:
        nonlocal resets
        resets += 1
        await conn.reset()

    async def logging_init(conn: Any) -> None:
        if statements is not None:
            conn.add_query_logger(lambda record: statements.update([record.query]))

    pool = await asyncpg.create_pool(
        rig.pg_dsn, min_size=1, max_size=12, reset=counting_reset, init=logging_init
    )
    assert pool is not None
    try:
        store = store_class(pool)
        await store.register_workflow(name, DEFAULT_OWNER, effects_enabled=True)
        jobs = [await rig.submit_job(f"{name}-{i}", name) for i in range(n)]

        async def handler(ctx: JobContext) -> None:
            async def call() -> Success:
                return Success(receipt="r")

            await ctx.effect("k", {}, call)
            await ctx.publish()

        worker = Worker(
            WorkerConfig(
                owner=DEFAULT_OWNER,
                lease_s=30.0,
                poll_s=0.05,
                rescue_every_s=None,
                concurrency=WORKER_SLOTS,
            ),
            store=store,
            journal=open_journal(rig.journal_path(name), name),
            objects=rig.objects,
            pool=pool,
        )
        worker.register(name, handler, timeout_s=10.0)
        async with running(worker):

            async def done() -> bool:
                states = {await rig.state(job) for job in jobs}
                return states == {JobState.SUCCEEDED}

            await wait_for(done)
        # 2: the registration and its check at the worker's start (an empty journal: no read)
        return resets - 2, store.claims, sum(1 for size in store.sizes if size)
    finally:
        await pool.close()


def _untraced(monkeypatch: pytest.MonkeyPatch, *, measuring: bool) -> None:
    """No tracing (an earlier test in the same process may have installed a tracer
    provider), and metrics served or not, whatever an earlier test left."""
    for module in (attempts_module, context_module):
        monkeypatch.setattr(module, "_TRACER", trace.NoOpTracer())
    monkeypatch.setattr(telemetry, "tracing_on", lambda: False)
    monkeypatch.setattr(observe, "measuring", lambda: measuring)


async def test_the_worker_pays_no_pool_round_trip_per_job(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Counted without the reads that run only while tracing or serving metrics.
    _untraced(monkeypatch, measuring=False)
    n = 12
    pooled, pooled_claims, _ = await _resets(rig, _CountedPooled, "pooled", n)
    held, held_claims, _ = await _resets(rig, _CountedUnkept, "held", n)
    kept, kept_claims, _ = await _resets(rig, CountingStore, "kept", n)
    # control: every fenced call and every claim took and reset a pool connection
    assert (pooled - pooled_claims) / n >= 3.0
    # control: one hold per attempt, given back once; the claim loop keeps one connection
    # for all of its claims and gives it back once, at the stop
    assert held_claims > 1
    assert n <= held - 1 <= n + 1
    # kept between attempts: given back at the stop only, one per slot at most, whatever n
    assert kept_claims > 1
    assert kept - 1 <= WORKER_SLOTS < n


async def test_while_measuring_each_job_s_context_comes_with_its_claim(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Serving metrics, the submit-to-finish histogram needs each job's submit time: it
    comes with the claim (0036), so every job is observed and the worker runs exactly the
    statements it runs without metrics (before, one read more per claim that took jobs), on
    the claim loop's connection with no pool round trip per claim."""
    n = 15  # at least five claims take jobs (three slots), more than the slots' releases
    quiet: Counter[str] = Counter()
    _untraced(monkeypatch, measuring=False)
    await _resets(rig, CountingStore, "context_quiet", n, quiet)
    measured: Counter[str] = Counter()
    _untraced(monkeypatch, measuring=True)
    before = _latency_count("context_held")
    held, held_claims, held_took = await _resets(rig, CountingStore, "context_held", n, measured)
    assert _latency_count("context_held") - before == n
    # the same statements as without metrics, but for how often an empty claim polled (and
    # now and then read the registration to say why it was empty)
    for polled in (sql.CLAIM, sql.REGISTRATION):
        del quiet[polled], measured[polled]
    assert measured == quiet, measured - quiet
    # on the claim loop's connection: the slots' connections at the stop, nothing per claim
    assert held_took > 1 and held_claims > 1
    assert held - 1 <= WORKER_SLOTS < n


def _latency_count(workflow: str) -> float:
    """Jobs of ``workflow`` the submit-to-finish histogram observed so far."""
    value = observe.REGISTRY.get_sample_value(
        "accord_job_succeeded_latency_seconds_count", {"workflow": workflow}
    )
    return value or 0.0
