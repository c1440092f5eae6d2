"""Effect records: pending before dispatch, one begin per key unless it failed before
dispatch, outcomes that never change, and what rescue, cancel and claim make of them."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from opentelemetry.trace import StatusCode

from accord.jobs import (
    EffectAlreadyBegun,
    EffectConflict,
    EffectNotPending,
    EffectsDisabled,
    EffectState,
    EffectsUnresolved,
    FenceLost,
    JobState,
    Store,
)
from accord.jobs import sql as jobs_sql
from accord.schemas import telemetry
from tests.integration.jobs.conftest import OWNER, WORKFLOW, Jobs
from tests.integration.relay.test_enqueue import memory_exporter


async def test_begin_records_pending_and_a_second_begin_is_refused(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    assert await jobs.store.begin_effect(lease, "charge", "i1") == 1
    view = await jobs.store.job(job_id)
    assert [(e.effect_key, e.state) for e in view.effects] == [("charge", EffectState.PENDING)]
    with pytest.raises(EffectAlreadyBegun) as info:
        await jobs.store.begin_effect(lease, "charge", "i1")
    assert info.value.fields["state"] == "pending"
    await jobs.store.finish_effect(lease, "charge", EffectState.SUCCEEDED, receipt="r-1")
    with pytest.raises(EffectAlreadyBegun):
        await jobs.store.begin_effect(lease, "charge", "i1")
    with pytest.raises(EffectNotPending):
        await jobs.store.finish_effect(lease, "charge", EffectState.UNKNOWN)
    await jobs.store.publish(lease)
    view = await jobs.store.job(job_id)
    assert view.state is JobState.SUCCEEDED and view.effects[0].receipt == "r-1"


async def test_only_failed_before_dispatch_permits_another_begin(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "mail", "i1")
    await jobs.store.finish_effect(lease, "mail", EffectState.FAILED_BEFORE_DISPATCH)
    assert await jobs.store.begin_effect(lease, "mail", "i1") == 2  # control
    await jobs.store.begin_effect(lease, "sms", "x")
    await jobs.store.finish_effect(lease, "sms", EffectState.FAILED_BEFORE_DISPATCH)
    with pytest.raises(EffectConflict) as conflict:  # a retry must carry the same intent
        await jobs.store.begin_effect(lease, "sms", "y")
    assert conflict.value.fields["recorded_digest"] == "x"
    await jobs.store.finish_effect(lease, "mail", EffectState.UNKNOWN)
    with pytest.raises(EffectAlreadyBegun) as info:
        await jobs.store.begin_effect(lease, "mail", "i1")
    assert info.value.fields["state"] == "unknown"
    records = (await jobs.store.job(job_id)).effects
    mail = [(e.seq, e.state) for e in records if e.effect_key == "mail"]
    assert mail == [(1, EffectState.FAILED_BEFORE_DISPATCH), (2, EffectState.UNKNOWN)]


async def test_effects_are_disabled_by_default(jobs: Jobs) -> None:
    await jobs.store.register_workflow("quiet", OWNER)
    await jobs.submit("a", workflow="quiet")
    lease = (await jobs.store.claim("quiet", OWNER, lease_s=30))[0]
    with pytest.raises(EffectsDisabled):
        await jobs.store.begin_effect(lease, "charge", "i1")
    await jobs.store.register_workflow("quiet", OWNER, effects_enabled=True)
    assert await jobs.store.begin_effect(lease, "charge", "i1") == 1


async def test_effect_write_backs_pass_the_fence(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k1", "i")  # control
    await jobs.expire(job_id)
    with pytest.raises(FenceLost) as info:
        await jobs.store.begin_effect(lease, "k2", "i")
    assert info.value.failed_check == "lease_expired"
    with pytest.raises(FenceLost):
        await jobs.store.finish_effect(lease, "k1", EffectState.SUCCEEDED)
    # the pending record stays as the evidence
    assert [e.state for e in (await jobs.store.job(job_id)).effects] == [EffectState.PENDING]


async def test_publish_is_refused_while_an_effect_is_unresolved(jobs: Jobs) -> None:
    await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k", "i")
    with pytest.raises(EffectsUnresolved):
        await jobs.store.publish(lease)
    await jobs.store.finish_effect(lease, "k", EffectState.SUCCEEDED)
    await jobs.store.publish(lease)  # resolved: allowed


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (None, JobState.UNKNOWN),  # still pending
        (EffectState.UNKNOWN, JobState.UNKNOWN),
        (EffectState.SUCCEEDED, JobState.UNKNOWN),  # done, never redone
        (EffectState.FAILED_BEFORE_DISPATCH, JobState.QUEUED),  # nothing left the building
    ],
)
async def test_rescue_never_retries_work_with_an_effect(
    jobs: Jobs, outcome: EffectState | None, expected: JobState
) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k", "i")
    if outcome is not None:
        await jobs.store.finish_effect(lease, "k", outcome)
    await jobs.expire(job_id)
    report = await jobs.store.rescue()
    assert report.ids(expected) == [job_id]
    claimed = await jobs.store.claim(WORKFLOW, OWNER, lease_s=30)
    assert [le.job_id for le in claimed] == ([job_id] if expected is JobState.QUEUED else [])


@pytest.mark.parametrize(
    ("outcome", "claimable"),
    [
        (EffectState.FAILED_BEFORE_DISPATCH, True),  # control: nothing was dispatched
        (None, False),  # pending
        (EffectState.UNKNOWN, False),
        (EffectState.SUCCEEDED, False),  # not resumed by repair: never run again
    ],
    ids=["failed_before_dispatch", "pending", "unknown", "succeeded"],
)
async def test_claim_skips_queued_work_with_a_blocking_effect(
    jobs: Jobs, outcome: EffectState | None, claimable: bool
) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k", "i")
    if outcome is not None:
        await jobs.store.finish_effect(lease, "k", outcome)
    # An administrative requeue that ignored the effect (not an API; a direct write):
    await jobs.pool.execute(
        "UPDATE jobs.jobs SET state = 'queued', lease_expires_at = NULL WHERE job_id = $1",
        job_id,
    )
    got = await jobs.store.claim(WORKFLOW, OWNER, lease_s=30)
    assert [g.job_id for g in got] == ([job_id] if claimable else [])


async def test_fail_with_an_effect_never_requeues(jobs: Jobs) -> None:
    await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k", "i")
    await jobs.store.finish_effect(lease, "k", EffectState.SUCCEEDED)
    assert await jobs.store.fail(lease, "after effect", retry=True) is JobState.UNKNOWN
    await jobs.submit("b")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k", "i")
    assert await jobs.store.fail(lease, "lost", retry=False) is JobState.UNKNOWN


async def test_canceled_job_still_reports_its_unresolved_effect(jobs: Jobs) -> None:
    job_id = await jobs.submit("a")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k", "i")
    done = await jobs.store.cancel(job_id, reason="operator")
    assert done.changed and done.state is JobState.CANCELED and done.unresolved_effects
    view = await jobs.store.job(job_id)
    assert view.needs_reconciliation and view.effects[0].state is EffectState.PENDING
    with pytest.raises(FenceLost):  # the canceled worker cannot record the outcome
        await jobs.store.finish_effect(lease, "k", EffectState.SUCCEEDED)


async def test_the_fence_fails_closed_on_a_null_argument(jobs: Jobs) -> None:
    """Migration 0049. jobs.fence compared tenant, workflow, operation and generation with
    `<>`, NULL for a NULL argument: the caller passing one was fenced by owner, attempt and
    epoch alone. Each NULL now names its check (control: the whole lease passes)."""
    await jobs.submit("a")
    lease = await jobs.claim_one()
    args = [lease.job_id, lease.tenant, lease.workflow, lease.operation_id, lease.owner,
            lease.attempt_id, lease.generation, lease.epoch]  # fmt: skip
    fence = "SELECT jobs.fence($1, $2, $3, $4, $5, $6, $7, $8)"
    assert await jobs.pool.fetchval(fence, *args) is None  # control
    checks = ["tenant", "operation", "operation", "owner", "attempt", "generation", "epoch"]
    for position, check in enumerate(checks, start=1):
        nulled = [None if i == position else a for i, a in enumerate(args)]
        assert await jobs.pool.fetchval(fence, *nulled) == check, position


async def test_a_job_rescued_to_unknown_says_so_in_its_trace(jobs: Jobs) -> None:
    """A job rescue leaves unknown (its worker died with an effect pending) has no next
    attempt: a ``rescue job`` span in its trace says it stopped there, an error, linked to
    the attempt whose lease ran out. Before, its trace ended at the consumer's ``process``,
    with no error, while it waited for reconciliation. Control: one rescued to the queue
    shows it at its next attempt instead (no span here)."""
    exporter = memory_exporter()
    stuck = await jobs.submit("stuck")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k", "i")
    await jobs.expire(stuck)
    requeued = await jobs.submit("requeued")
    await jobs.claim_one()
    await jobs.expire(requeued)
    exporter.clear()
    report = await jobs.store.rescue()
    assert (report.ids(JobState.UNKNOWN), report.ids(JobState.QUEUED)) == ([stuck], [requeued])
    spans = [s for s in exporter.get_finished_spans() if s.name == "rescue job"]
    assert [(s.attributes or {}).get(telemetry.ATTR_JOB_ID) for s in spans] == [stuck]
    (span,) = spans
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})[telemetry.ATTR_JOB_REASON] == "lease_expired"


class LosesTraceReads:
    """A real connection whose read of a job's trace context fails as a lost connection
    would, after the statement before it committed (fault injection; the SQL is real)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def fetch(self, query: str, *args: Any) -> Any:
        if query == jobs_sql.JOB_TRACES:
            raise asyncpg.ConnectionDoesNotExistError("connection was closed")
        return await self._conn.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> Any:
        if query == jobs_sql.JOB_TRACES:
            raise asyncpg.ConnectionDoesNotExistError("connection was closed")
        return await self._conn.fetchrow(query, *args)


async def test_a_committed_cancel_or_rescue_is_reported_done_when_its_span_is_lost(
    jobs: Jobs,
) -> None:
    """Their spans are written after they committed: a lost read of the trace context is
    logged, never raised (the caller would take the committed change for a failed one)."""
    memory_exporter()
    stuck = await jobs.submit("stuck")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "k", "i")
    await jobs.expire(stuck)
    queued = await jobs.submit("queued")
    async with jobs.pool.acquire() as conn:
        store = Store(LosesTraceReads(conn))
        report = await store.rescue()
        assert report.ids(JobState.UNKNOWN) == [stuck]
        canceled = await store.cancel(queued, reason="not wanted")
    assert canceled.changed and canceled.state is JobState.CANCELED
