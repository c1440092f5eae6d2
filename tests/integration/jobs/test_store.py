"""The store's short transactions on real PostgreSQL: claim, fence, renew, publish, fail,
rescue, cancel, authority. Every refusal is preceded by its allowed control."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

import anyio
import asyncpg
import pytest

from accord.jobs import (
    EffectState,
    EffectsUnresolved,
    FenceLost,
    InvalidLeaseLength,
    JobNotFound,
    JobState,
    Lease,
    Store,
    sql,
)
from accord.jobs import sql as jobs_sql
from accord.jobs.publish import BatchPublished
from accord.schemas.db import DB_CONNECTION_LOST
from accord.schemas.errors import ConnectionLost
from tests.integration.jobs.conftest import OWNER, TENANT, WORKFLOW, Jobs
from tests.support import wait_for


async def results_row(tx: asyncpg.Connection, lease: Lease) -> None:
    """A publish callback: the fenced manifest row."""
    await Store.locked(tx, lease)  # callbacks may re-check the fence; it is re-entrant
    await Store.record_result(tx, lease, f"results/{lease.job_id}/{lease.attempt_id}", "sha256:x")


def publisher(lease: Lease):  # type: ignore[no-untyped-def]
    async def callback(tx: asyncpg.Connection) -> None:
        await results_row(tx, lease)

    return callback


async def test_claim_sets_a_fresh_lease_from_the_database_clock(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one(lease_s=30)
    row = await jobs.pool.fetchrow(
        "SELECT *, lease_expires_at - now() AS left FROM jobs.jobs WHERE job_id = $1", job_id
    )
    assert (lease.job_id, lease.owner, lease.generation, lease.epoch) == (job_id, OWNER, 1, 1)
    assert row["state"] == "running" and row["attempt_id"] == lease.attempt_id
    assert row["attempts"] == 1 and 25 < row["left"].total_seconds() <= 30
    assert await jobs.store.claim(WORKFLOW, OWNER, lease_s=30) == []  # nothing else is due
    with pytest.raises(InvalidLeaseLength):
        await jobs.store.claim(WORKFLOW, OWNER, lease_s=float("inf"))
    with pytest.raises(InvalidLeaseLength):
        await jobs.store.claim(WORKFLOW, OWNER, lease_s=0)


async def test_a_claim_returns_each_job_s_attempt_context(jobs: Jobs) -> None:
    """The claim returns what the attempt span and the submit-to-finish histogram need,
    as the claimed row holds it (0036): attempts with this claim, how the previous attempt
    ended, the stored trace contexts and the submit time."""
    job_id = await jobs.submit("ctx")
    await jobs.pool.execute(
        'UPDATE jobs.jobs SET trace = \'{"traceparent": "t"}\' WHERE job_id = $1', job_id
    )
    store = Store(jobs.pool, backoff_base_s=0.0)  # the retry due at once
    first = await jobs.claim_one(lease_s=30)
    await store.note_trace(first, {"traceparent": "a1"})
    await store.fail(first, "gave up", retry=True)
    second = await jobs.claim_one(lease_s=30)
    row = await jobs.pool.fetchrow(
        "SELECT trace, attempt_trace, attempts, last_error, created_at FROM jobs.jobs"
        " WHERE job_id = $1",
        job_id,
    )
    assert first.context is not None and first.context["attempts"] == 1
    assert first.context["last_error"] is None and first.context["attempt_trace"] is None
    assert second.context == dict(row)
    assert (row["attempts"], row["last_error"]) == (2, "gave up")
    assert json.loads(row["trace"]) == {"traceparent": "t"}
    assert json.loads(row["attempt_trace"]) == {"traceparent": "a1"}


async def test_batch_claim_takes_distinct_due_jobs_in_order(jobs: Jobs) -> None:
    ids = [await jobs.submit(f"op{i}") for i in range(5)]
    first = await jobs.store.claim(WORKFLOW, OWNER, lease_s=30, limit=3)
    second = await jobs.store.claim(WORKFLOW, OWNER, lease_s=30, limit=3)
    assert [le.job_id for le in first] == ids[:3]
    assert [le.job_id for le in second] == ids[3:]
    assert len({le.attempt_id for le in first + second}) == 5


async def test_publish_then_every_later_write_back_is_refused(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.publish(lease, publisher(lease))  # control
    assert await jobs.state(job_id) == "succeeded"
    assert await jobs.pool.fetchval("SELECT count(*) FROM jobs.results") == 1
    for attempt in (
        jobs.store.publish(lease, publisher(lease)),
        jobs.store.renew(lease, 30),
        jobs.store.fail(lease, "late", retry=True),
    ):
        with pytest.raises(FenceLost) as info:
            await attempt
        assert info.value.failed_check == "state"


async def test_publish_without_callback_is_one_fenced_statement(jobs: Jobs) -> None:
    """One round trip: ``jobs.succeed`` fences and marks in one statement, no BEGIN, no
    separate fence (control: with a callback, the transaction fences around it)."""
    await jobs.submit("a")
    await jobs.submit("b")
    lease, other = await jobs.claim_one(), await jobs.claim_one()
    async with jobs.pool.acquire() as conn:
        queries: list[str] = []
        conn.add_query_logger(lambda record: queries.append(record.query))
        await Store(conn).publish(lease)
        await anyio.sleep(0.01)  # query loggers are called soon after, not during
        assert queries == [jobs_sql.SUCCEED]
        queries.clear()

        async def callback(tx: Any) -> None:
            await tx.execute("SELECT 1")

        await Store(conn).publish(other, callback)
        await anyio.sleep(0.01)
        assert len(queries) > 2 and "SELECT 1" in queries and jobs_sql.SUCCEED not in queries[:1]
    with pytest.raises(FenceLost):
        await jobs.store.publish(lease)


async def test_refused_publish_keeps_nothing_the_callback_wrote(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()

    async def expire_then_write(tx: asyncpg.Connection) -> None:
        await results_row(tx, lease)
        # The lease runs out while the callback works: the second fence must see it.
        await tx.execute(
            "UPDATE jobs.jobs SET lease_expires_at = clock_timestamp() WHERE job_id = $1", job_id
        )

    with pytest.raises(FenceLost) as info:
        await jobs.store.publish(lease, expire_then_write)
    assert info.value.failed_check == "lease_expired"
    assert await jobs.pool.fetchval("SELECT count(*) FROM jobs.results") == 0
    assert await jobs.state(job_id) == "running"


async def test_fence_names_the_field_that_no_longer_matches(jobs: Jobs) -> None:
    await jobs.submit("a")
    lease = await jobs.claim_one()
    cases = {
        "tenant": {"tenant": "other"},
        "operation": {"operation_id": "b"},
        "generation": {"generation": lease.generation + 1},
        "owner": {"owner": "someone-else"},
        "epoch": {"epoch": lease.epoch + 1},
        "missing": {"job_id": -1},
    }
    async with jobs.pool.acquire() as conn, conn.transaction():
        await Store.locked(conn, lease)  # control
    for reason, change in cases.items():
        forged = dataclasses.replace(lease, **change)  # type: ignore[arg-type]
        async with jobs.pool.acquire() as conn, conn.transaction():
            with pytest.raises(FenceLost) as info:
                await Store.locked(conn, forged)
        assert info.value.failed_check == reason
        assert info.value.fields["expected_generation"] == forged.generation


async def test_renew_extends_only_an_unexpired_current_lease(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one(lease_s=5)
    renewed = await jobs.store.renew(lease, 60)  # control
    assert renewed.lease_expires_at > lease.lease_expires_at
    # 60 s from the database clock now, not from the old expiry (which would leave ~65 s)
    left = await jobs.pool.fetchval("SELECT $1::timestamptz - now()", renewed.lease_expires_at)
    assert 55 < left.total_seconds() <= 60
    assert renewed.attempt_id == lease.attempt_id and renewed.generation == lease.generation
    await jobs.expire(job_id)
    with pytest.raises(FenceLost) as info:
        await jobs.store.renew(renewed, 60)
    assert info.value.failed_check == "lease_expired"
    assert await jobs.pool.fetchval(
        "SELECT lease_expires_at < now() FROM jobs.jobs WHERE job_id = $1", job_id
    )


async def test_expired_then_reclaimed_the_old_worker_cannot_publish(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    old = await jobs.claim_one()
    await jobs.expire(job_id)
    report = await jobs.store.rescue()
    assert report.requeued == [job_id]
    new = await jobs.claim_one()
    assert new.generation == old.generation + 2  # rescue +1, claim +1
    with pytest.raises(FenceLost) as info:
        await jobs.store.publish(old, publisher(old))
    assert info.value.failed_check == "generation"
    await jobs.store.publish(new, publisher(new))
    assert await jobs.pool.fetchval("SELECT object_key FROM jobs.results") == (
        f"results/{job_id}/{new.attempt_id}"
    )


async def test_rescue_leaves_live_leases_alone_and_counts_attempts(jobs: Jobs) -> None:
    job_id = await jobs.submit("a", max_attempts=2)
    await jobs.claim_one()
    assert (await jobs.store.rescue()).rescued == ()  # control: an unexpired lease stays
    await jobs.expire(job_id)
    assert (await jobs.store.rescue()).requeued == [job_id]
    await jobs.claim_one()
    await jobs.expire(job_id)
    assert (await jobs.store.rescue()).poisoned == [job_id]
    assert await jobs.store.claim(WORKFLOW, OWNER, lease_s=30) == []
    view = await jobs.store.job(job_id)
    assert view.state is JobState.POISON and view.attempts == 2
    assert view.last_error == "lease_expired"


async def test_rescue_backoff_delays_the_retry(jobs: Jobs) -> None:
    store = Store(jobs.pool, backoff_base_s=3600, backoff_max_s=7200)
    job_id = await jobs.submit("a")
    await jobs.claim_one()
    await jobs.expire(job_id)
    assert (await store.rescue()).requeued == [job_id]
    assert await jobs.store.claim(WORKFLOW, OWNER, lease_s=30) == []
    assert await jobs.pool.fetchval(
        "SELECT run_after > now() + interval '59 minutes' FROM jobs.jobs WHERE job_id = $1",
        job_id,
    )


async def test_backoff_is_capped_for_any_attempt_count(jobs: Jobs) -> None:
    async def backoff_s(attempts: int, base_s: float = 1.0, max_s: float = 300.0) -> float:
        seconds: float = await jobs.pool.fetchval(
            "SELECT extract(epoch FROM jobs.backoff($1, $2, $3))::float8", attempts, base_s, max_s
        )
        return seconds

    # control: the exponential part below the cap
    assert [await backoff_s(n) for n in (0, 1, 2, 3, 9)] == [1, 1, 2, 4, 256]
    assert await backoff_s(10) == 300
    # 2^(attempts-1) alone overflowed "value out of range" from about 1,025 attempts on
    for attempts in (31, 32, 1_025, 1_100, 100_000, 2**31 - 1):
        assert await backoff_s(attempts) == 300
    assert await backoff_s(2**31 - 1, 1e-9, 1e9) == pytest.approx(2**30 * 1e-9)
    # the whole fail path with a huge attempt count: requeued with the capped delay
    job_id = await jobs.submit("many", max_attempts=1_000_000)
    lease = await jobs.claim_one()
    await jobs.pool.execute("UPDATE jobs.jobs SET attempts = 5000 WHERE job_id = $1", job_id)
    capped = Store(jobs.pool, backoff_base_s=1.0, backoff_max_s=300.0)
    assert await capped.fail(lease, "boom", retry=True) is JobState.QUEUED
    assert await jobs.pool.fetchval(
        "SELECT run_after - now() BETWEEN interval '299 s' AND interval '301 s'"
        " FROM jobs.jobs WHERE job_id = $1",
        job_id,
    )


async def test_fail_retry_failed_and_poison(jobs: Jobs) -> None:
    a = await jobs.submit("a", max_attempts=2)
    lease = await jobs.claim_one()
    assert await jobs.store.fail(lease, "boom", retry=True) is JobState.QUEUED
    lease = await jobs.claim_one()
    assert await jobs.store.fail(lease, "boom", retry=True) is JobState.POISON
    b = await jobs.submit("b")
    lease = await jobs.claim_one()
    assert await jobs.store.fail(lease, "bad input", retry=False) is JobState.FAILED
    assert (await jobs.store.job(a)).last_error == "boom"
    assert (await jobs.store.job(b)).state is JobState.FAILED


async def test_cancel_queued_and_running_work(jobs: Jobs) -> None:
    queued = await jobs.submit("q")
    running = await jobs.submit("r")
    await jobs.pool.execute(
        "UPDATE jobs.jobs SET run_after = now() + interval '1 hour' WHERE job_id = $1", queued
    )
    lease = await jobs.claim_one()
    assert lease.job_id == running
    done = await jobs.store.cancel(running, reason="operator")
    assert done.changed and done.state is JobState.CANCELED
    assert done.generation == lease.generation + 1 and not done.unresolved_effects
    with pytest.raises(FenceLost) as info:
        await jobs.store.publish(lease, publisher(lease))
    assert info.value.failed_check == "generation"
    assert (await jobs.store.cancel(queued, reason="operator")).changed
    again = await jobs.store.cancel(queued, reason="operator")
    assert not again.changed and again.state is JobState.CANCELED
    with pytest.raises(JobNotFound):
        await jobs.store.cancel(-1, reason="operator")


async def test_cancel_never_changes_a_finished_job(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.publish(lease)
    done = await jobs.store.cancel(job_id, reason="late")
    assert not done.changed and done.state is JobState.SUCCEEDED
    assert done.generation == lease.generation


async def test_rotation_invalidates_every_lease_under_the_old_epoch(jobs: Jobs) -> None:
    a = await jobs.submit("a")
    await jobs.submit("b")
    other = await jobs.submit("c", tenant="other")
    la, lb, lc = await jobs.store.claim(WORKFLOW, OWNER, lease_s=30, limit=3)
    await jobs.store.publish(la)  # control: before rotation the lease holds
    assert await jobs.store.rotate_epoch(TENANT) == 2
    with pytest.raises(FenceLost) as info:
        await jobs.store.renew(lb, 30)
    assert info.value.failed_check == "epoch"
    await jobs.store.publish(lc)  # another tenant's authority is untouched
    # rescue returns stale-epoch work at once, without waiting for the lease to run out
    report = await jobs.store.rescue()
    assert report.requeued == [lb.job_id]
    again = await jobs.claim_one()
    assert again.job_id == lb.job_id and again.epoch == 2
    await jobs.store.publish(again)
    assert {await jobs.state(j) for j in (a, lb.job_id, other)} == {"succeeded"}


async def test_frozen_authority_is_not_claimed_and_fails_the_fence(jobs: Jobs) -> None:
    a = await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.publish(lease)  # control
    b = await jobs.submit("b")
    lease = await jobs.claim_one()
    await jobs.submit("c")
    await jobs.store.freeze(TENANT)
    assert await jobs.store.claim(WORKFLOW, OWNER, lease_s=30) == []
    with pytest.raises(FenceLost) as info:
        await jobs.store.publish(lease)
    assert info.value.failed_check == "frozen"
    await jobs.store.unfreeze(TENANT)
    # freezing revoked the running lease; thawing does not revive it: rescue returns the work
    with pytest.raises(FenceLost) as info:
        await jobs.store.publish(lease)
    assert info.value.failed_check == "lease_expired"
    assert (await jobs.store.rescue()).requeued == [b]
    again = await jobs.store.claim(WORKFLOW, OWNER, lease_s=30, limit=5)
    for fresh in again:
        await jobs.store.publish(fresh)
    assert {await jobs.state(j) for j in (a, b)} == {"succeeded"} and len(again) == 2


async def test_publish_many_fences_each_lease_alone(jobs: Jobs) -> None:
    ids = [await jobs.submit(f"op{i}") for i in range(4)]
    leases = await jobs.store.claim(WORKFLOW, OWNER, lease_s=30, limit=4)
    await jobs.store.begin_effect(leases[1], "k", "i")  # unresolved: refused
    await jobs.store.cancel(ids[2], reason="operator")  # moved on: refused
    await jobs.expire(ids[3])  # expired: refused
    done = await jobs.store.publish_many(leases)
    assert [le.job_id for le in done.published] == [ids[0]]
    why = {lease.job_id: error for lease, error in done.refused}
    assert isinstance(why[ids[1]], EffectsUnresolved)
    assert isinstance(why[ids[2]], FenceLost) and why[ids[2]].failed_check == "generation"
    assert isinstance(why[ids[3]], FenceLost) and why[ids[3]].failed_check == "lease_expired"
    assert [await jobs.state(j) for j in ids] == ["succeeded", "running", "canceled", "running"]
    again = await jobs.store.publish_many([leases[0]])
    assert again.published == () and again.refused[0][1].failed_check == "state"


async def test_probe_never_claims_work(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    before = await jobs.pool.fetchrow("SELECT * FROM jobs.jobs WHERE job_id = $1", job_id)
    health = await jobs.store.probe()
    assert health.workflows == 1
    after = await jobs.pool.fetchrow("SELECT * FROM jobs.jobs WHERE job_id = $1", job_id)
    assert dict(before) == dict(after)


async def test_the_batch_publish_refuses_exactly_what_the_fence_refuses(jobs: Jobs) -> None:
    """``jobs.succeed_many`` spells the fence out in its WHERE clause; ``jobs.succeed`` calls
    ``jobs.fence``. Lease by lease, each in its own rolled-back transaction, both must agree:
    the same leases pass, and every refusal the fence names is a refusal of the batch."""

    async def claim_for(tenant: str, op: str) -> Lease:
        await jobs.submit(op, tenant=tenant)
        return await jobs.claim_one()

    ok = await claim_for(TENANT, "ok")
    cases: list[tuple[Lease, str | None]] = [(ok, None)]
    forged: list[tuple[str, dict[str, Any]]] = [
        ("missing", {"job_id": -1}),
        ("tenant", {"tenant": "other"}),
        ("operation", {"operation_id": "other"}),
        ("operation", {"workflow": "other"}),
        ("generation", {"generation": ok.generation + 1}),
        ("owner", {"owner": "someone-else"}),
        ("attempt", {"attempt_id": uuid.uuid4()}),
        ("epoch", {"epoch": ok.epoch + 1}),
    ]
    cases += [(dataclasses.replace(ok, **change), reason) for reason, change in forged]
    gave_up = await claim_for(TENANT, "state")
    await jobs.store.fail(gave_up, "boom", retry=False)  # failed, same generation
    expired = await claim_for(TENANT, "expired")
    await jobs.expire(expired.job_id)
    unresolved = await claim_for(TENANT, "unresolved")
    await jobs.store.begin_effect(unresolved, "k", "i")
    unknown = await claim_for(TENANT, "unknown")
    await jobs.store.begin_effect(unknown, "k", "i")
    await jobs.store.finish_effect(unknown, "k", EffectState.UNKNOWN)
    rotated = await claim_for("rotated", "epoch")
    await jobs.store.rotate_epoch("rotated")
    frozen = await claim_for("frozen", "frozen")
    await jobs.store.freeze("frozen")
    # Rotation and freezing also revoke the lease on the job row, which alone would refuse;
    # the tenant's flag and epoch on their own (test-only direct writes) probe those checks.
    flag_only = await claim_for("flag-only", "frozen")
    epoch_only = await claim_for("epoch-only", "epoch")
    await jobs.pool.execute("UPDATE jobs.tenants SET frozen = true WHERE tenant = 'flag-only'")
    await jobs.pool.execute("UPDATE jobs.tenants SET epoch = 2 WHERE tenant = 'epoch-only'")
    # The row's count of unresolved effects (0010) is derived; written wrong by hand (what a
    # bypassed trigger would leave), too low it still loses to the record, too high it refuses.
    undercounted = await claim_for(TENANT, "undercounted")
    await jobs.store.begin_effect(undercounted, "k", "i")
    overcounted = await claim_for(TENANT, "overcounted")
    miscount = "UPDATE jobs.jobs SET unresolved_effects = $2 WHERE job_id = $1"
    await jobs.pool.execute(miscount, undercounted.job_id, 0)
    await jobs.pool.execute(miscount, overcounted.job_id, 1)
    stateful: list[tuple[Lease, str | None]] = [
        (gave_up, "state"),
        (expired, "lease_expired"),
        (unresolved, "unresolved_effect"),
        (unknown, "unresolved_effect"),
        (rotated, "epoch"),
        (frozen, "frozen"),
        (flag_only, "frozen"),
        (epoch_only, "epoch"),
        (undercounted, "unresolved_effect"),
        (overcounted, "row_count"),
        # the tenant's epoch matches this lease, the job's (claimed under epoch 1) does not
        (dataclasses.replace(epoch_only, epoch=epoch_only.epoch + 1), "epoch"),
    ]
    cases += stateful
    async with jobs.pool.acquire() as conn:
        for lease, expected in cases:
            single = await rolled_back(conn, conn.fetchval, sql.SUCCEED, *lease.fence_args())
            batch = await rolled_back(conn, conn.fetch, sql.SUCCEED_MANY, *columns([lease]))
            assert single == expected, (lease, single)
            assert [r["job_id"] for r in batch] == ([lease.job_id] if expected is None else [])
    # the independent jobs in one batch, for real: only the control publishes, each refusal
    # named as the fence names it (the forgeries of `ok` are left out: once `ok` succeeded,
    # the fence names their first mismatch after the state, not before)
    real = [(ok, None), *stateful]
    done = await jobs.store.publish_many([lease for lease, _ in real])
    assert done.published == (ok,)
    named = [
        "unresolved_effect" if isinstance(err, EffectsUnresolved) else err.fields["failed_check"]
        for _, err in done.refused
    ]
    assert named == [why for _, why in real[1:]]


WAITING_ON_A_LOCK = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


@pytest.mark.parametrize("batch", [False, True], ids=["publish", "publish_many"])
async def test_an_effect_begun_while_the_publish_waits_refuses_that_publish(
    jobs: Jobs, batch: bool
) -> None:
    """The publish is one UPDATE. If it waits on the job row while the lease's holder begins
    an effect, the effect's begin has written the row's count of unresolved effects (migration
    0010), so the publish re-checks the new row version and is refused; without that it would
    leave the job succeeded with the effect pending. Control: the other lease publishes."""
    await jobs.submit("other")
    other = await jobs.claim_one()
    await jobs.submit("raced")
    raced = await jobs.claim_one()
    outcome: list[object] = []

    async def publish() -> None:
        if batch:
            outcome.append(await jobs.store.publish_many([other, raced]))
            return
        await jobs.store.publish(other)
        with pytest.raises(EffectsUnresolved):
            await jobs.store.publish(raced)
        outcome.append("refused")

    async def waiting_on_the_row() -> bool:
        return bool(await jobs.pool.fetchval(WAITING_ON_A_LOCK))

    async with jobs.pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        begun = await holder.fetchrow(sql.BEGIN_EFFECT, *raced.fence_args(), "k", "intent")
        assert begun["status"] is None  # pending, not yet committed; the row is locked
        async with anyio.create_task_group() as tg:
            tg.start_soon(publish)
            await wait_for(waiting_on_the_row, within=10, every=0.01)
            await tx.commit()
    if batch:
        done = outcome[0]
        assert isinstance(done, BatchPublished)
        assert done.published == (other,)
        assert [(lease, type(err)) for lease, err in done.refused] == [(raced, EffectsUnresolved)]
    else:
        assert outcome == ["refused"]
    assert await jobs.state(other.job_id) == "succeeded"
    assert await jobs.state(raced.job_id) == "running"
    view = await jobs.store.job(raced.job_id)
    assert [e.state for e in view.effects] == [EffectState.PENDING]


def columns(leases: list[Lease]) -> list[tuple[object, ...]]:
    return list(zip(*(lease.fence_args() for lease in leases), strict=True))


async def rolled_back(conn: asyncpg.Connection, call: Any, *args: object) -> Any:
    """``call(*args)`` in a transaction that is always rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        return await call(*args)
    finally:
        await tx.rollback()


async def test_a_connection_lost_in_use_leaves_the_store_as_connection_lost(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """The seam's mapping: whatever asyncpg calls a lost connection, the store raises accord's
    ConnectionLost (a ServiceUnavailable: callers reconnect). Control: the same store works
    while its connection lives."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        store = Store(conn)
        await store.register_workflow("w-lost", "o")  # control
        assert await store.claim("w-lost", "o", lease_s=5) == []
        await pg.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
        with pytest.raises(ConnectionLost) as caught:
            await store.claim("w-lost", "o", lease_s=5)
        assert isinstance(caught.value.__cause__, DB_CONNECTION_LOST)
        assert not isinstance(caught.value.__cause__, ConnectionLost)
    finally:
        conn.terminate()
