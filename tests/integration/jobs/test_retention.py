"""Retention tied to the replay horizon (jobs.prune, migration 0023; jobs.retention).

Rows are aged by writing their timestamps as the test's owner connection (effect records
through session_replication_role, since their guard forbids any other change). Every removal
comes after its control: the same job inside the retention is kept.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from accord.consumers import Consumer, Delivery, ReplayTooOld, reserve
from accord.consumers import inbox as consumer_inbox
from accord.consumers.inbox import PRUNE_MARGIN_S
from accord.jobs import EffectState, JobState, Store, Submitted, submit
from accord.jobs import retention as jobs_retention
from accord.jobs.errors import PruneBlocked
from accord.jobs.retention import Pruned
from accord.jobs.runner.objects import LocalDirStore
from accord.schemas.errors import ConfigError, RetentionTooShort
from tests.integration.consumers.support import CATALOG, report
from tests.integration.jobs.conftest import TENANT, WORKFLOW, Jobs
from tests.integration.test_gc_objects import make_old, run_cli
from tests.support import LAPSED

DAY = 86400.0
WINDOW_S = 7 * DAY
HORIZON_S = WINDOW_S + PRUNE_MARGIN_S
RETENTION_S = HORIZON_S  # the shortest retention the settings allow
# Once a consumer declared its window, a key outlives the horizon by the inbox's future
# tolerance (the prune margin) too, whatever the retention (0063).
KEY_HORIZON_S = HORIZON_S + PRUNE_MARGIN_S
AUDIT_S = 90 * DAY
LONG_AGO_S = 10 * 365 * DAY

# Each table holding a job's rows, and how to count them (constant statements).
COUNTS = {
    "jobs": "SELECT count(*) FROM jobs.jobs WHERE job_id = $1",
    "operations": "SELECT count(*) FROM jobs.operations WHERE job_id = $1",
    "effects": "SELECT count(*) FROM jobs.effects WHERE job_id = $1",
    "effect_traces": "SELECT count(*) FROM jobs.effect_traces WHERE job_id = $1",
    "effect_escalations": "SELECT count(*) FROM jobs.effect_escalations WHERE job_id = $1",
    "results": "SELECT count(*) FROM jobs.results WHERE job_id = $1",
}


async def rows_of(pool: asyncpg.Pool, job_id: int) -> dict[str, int]:
    return {table: await pool.fetchval(stmt, job_id) for table, stmt in COUNTS.items()}


async def prune(
    pool: asyncpg.Pool,
    *,
    retention_s: float = RETENTION_S,
    audit_retention_s: float = AUDIT_S,
    limit: int = 100,
) -> Pruned:
    async with pool.acquire() as conn, conn.transaction():
        return await jobs_retention.prune(
            conn, retention_s=retention_s, audit_retention_s=audit_retention_s, limit=limit
        )


async def age(pool: asyncpg.Pool, job_id: int, seconds: float) -> None:
    """The job finished ``seconds`` ago, and so did its effect records (test-only writes)."""
    await pool.execute(
        "UPDATE jobs.jobs SET updated_at = now() - make_interval(secs => $2) WHERE job_id = $1",
        job_id,
        seconds,
    )
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")  # past the guard
        await conn.execute(
            "UPDATE jobs.effects SET begun_at = now() - make_interval(secs => $2),"
            " finished_at = CASE WHEN finished_at IS NOT NULL"
            " THEN now() - make_interval(secs => $2) END WHERE job_id = $1",
            job_id,
            seconds,
        )


async def finish(
    jobs: Jobs,
    operation_id: str,
    *,
    effect: EffectState | None = EffectState.SUCCEEDED,
    object_key: str | None = None,
) -> int:
    """A job run to its end: an effect with ``effect`` as outcome, a result manifest row
    naming ``object_key`` (if given), published; unknown ends the job unknown instead."""
    job_id = await jobs.submit(operation_id)
    lease = await jobs.claim_one()
    assert lease.job_id == job_id
    if effect is not None:
        await jobs.store.begin_effect(lease, "charge", f"intent-{operation_id}")
        await jobs.store.finish_effect(lease, "charge", effect, receipt="receipt-1")
    if effect is EffectState.UNKNOWN:
        assert await jobs.store.fail(lease, "provider timeout", retry=True) is JobState.UNKNOWN
        return job_id

    async def manifest(tx: asyncpg.Connection) -> None:
        if object_key is not None:
            await Store.record_result(tx, lease, object_key, "sha256:x")

    await jobs.store.publish(lease, manifest)
    return job_id


async def test_a_job_within_retention_is_kept_and_its_redelivery_absorbed_after_it_leaves(
    jobs: Jobs,
) -> None:
    consumer = Consumer(WORKFLOW, CATALOG, replay_window_s=WINDOW_S)
    event = report(tenant=TENANT)
    digest = CATALOG.digest(event)

    async def deliver() -> tuple[bool, Submitted]:
        async with jobs.pool.acquire() as conn, conn.transaction():
            fresh = await reserve(conn, consumer, event, Delivery(redelivered=True))
            done = await submit(
                conn,
                tenant=event.tenant,
                workflow=WORKFLOW,
                operation_id=event.operation_id,
                digest=digest,
                payload=dict(event.payload),
            )
        return fresh, done

    fresh, first = await deliver()
    assert fresh and first.created
    job_id = first.job_id
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "charge", "intent")
    await jobs.store.finish_effect(lease, "charge", EffectState.SUCCEEDED, receipt="r1")
    await jobs.store.publish(lease)

    async def age_everything(seconds: float) -> None:
        await age(jobs.pool, job_id, seconds)
        await jobs.pool.execute(
            "UPDATE consumers.inbox SET first_seen_at = now() - make_interval(secs => $1),"
            " occurred_at = now() - make_interval(secs => $1)",
            seconds,
        )
        await jobs.pool.execute(
            "UPDATE consumers.deliveries SET received_at = now() - make_interval(secs => $1)",
            seconds,
        )

    # Within the retention (an hour short of it): inbox row and job both stay, and a
    # redelivery is absorbed by the inbox while jobs.submit hands back the same job.
    await age_everything(RETENTION_S - 3600)
    async with jobs.pool.acquire() as conn, conn.transaction():
        assert await consumer_inbox.prune(conn, consumer) == (0, 0)
    assert await prune(jobs.pool) == Pruned()
    fresh, again = await deliver()
    assert not fresh
    assert (again.job_id, again.created, again.state) == (job_id, False, JobState.SUCCEEDED)

    # Past the retention: the inbox row and the job leave, the job with everything that was
    # its own; a redelivery (as old as its event now is) is refused, not taken as new.
    await age_everything(RETENTION_S + 60)
    async with jobs.pool.acquire() as conn, conn.transaction():
        assert (await consumer_inbox.prune(conn, consumer))[0] == 1
    assert await prune(jobs.pool) == Pruned(jobs=1, effects=1)
    assert set((await rows_of(jobs.pool, job_id)).values()) == {0}
    late = event.model_copy(
        update={"occurred_at": datetime.now(UTC) - timedelta(seconds=RETENTION_S + 60)}
    )
    async with jobs.pool.acquire() as conn:
        with pytest.raises(ReplayTooOld):
            async with conn.transaction():
                await reserve(conn, consumer, late, Delivery(redelivered=True))
    assert await jobs.pool.fetchval("SELECT count(*) FROM jobs.jobs") == 0


async def test_the_database_refuses_a_retention_inside_a_declared_replay_horizon(
    jobs: Jobs,
) -> None:
    """Whoever calls jobs.prune (a worker with its own settings, a service's own loop, psql),
    the longest horizon a consumer declared holds; a consumer's last declaration stands."""
    async with jobs.pool.acquire() as conn:
        await consumer_inbox.declare_window(conn, Consumer(WORKFLOW, CATALOG, WINDOW_S))
        await consumer_inbox.declare_window(conn, Consumer("ledger", CATALOG, DAY))
    first = await finish(jobs, "op-at-horizon")
    await age(jobs.pool, first, KEY_HORIZON_S + 60)
    # control: a retention of the longest horizon itself removes the old job
    assert await prune(jobs.pool, retention_s=HORIZON_S) == Pruned(jobs=1, effects=1)

    second = await finish(jobs, "op-inside-horizon")
    await age(jobs.pool, second, KEY_HORIZON_S + 60)
    before = await rows_of(jobs.pool, second)
    with pytest.raises(RetentionTooShort) as caught:
        await prune(jobs.pool, retention_s=HORIZON_S - 1)
    assert (caught.value.consumer, caught.value.horizon_s) == (WORKFLOW, HORIZON_S)
    assert "horizon_s=605100.0" in str(caught.value)
    with pytest.raises(asyncpg.PostgresError) as raw:  # plain SQL: the same refusal
        await jobs.pool.fetchrow("SELECT * FROM jobs.prune($1, $2, 10)", 0.0, AUDIT_S)
    assert raw.value.sqlstate == "AR001" and "consumer report" in str(raw.value)
    assert await rows_of(jobs.pool, second) == before  # nothing removed

    # the consumer re-declares a one-day window: the week it replaced holds for a week more
    # (migration 0028: what a process admitted under it is kept as long as it promised) ...
    async with jobs.pool.acquire() as conn:
        await consumer_inbox.declare_window(conn, Consumer(WORKFLOW, CATALOG, DAY))
    with pytest.raises(RetentionTooShort) as caught:
        await prune(jobs.pool, retention_s=DAY + PRUNE_MARGIN_S)
    assert caught.value.horizon_s == HORIZON_S
    # ... and once it has run out, the longest horizon is a day's
    await jobs.pool.execute(LAPSED)
    with pytest.raises(RetentionTooShort):
        await prune(jobs.pool, retention_s=DAY)  # the margin still counts
    assert await prune(jobs.pool, retention_s=DAY + PRUNE_MARGIN_S) == Pruned(jobs=1, effects=1)
    assert set((await rows_of(jobs.pool, second)).values()) == {0}


def test_a_replay_window_that_cannot_work_is_refused_at_the_boundary() -> None:
    for window in (0.0, -1.0, float("inf"), float("nan"), 1e12):
        with pytest.raises(ConfigError, match="replay window"):
            Consumer(WORKFLOW, CATALOG, window)


async def test_a_key_outlives_the_horizon_by_the_tolerance_for_an_event_dated_ahead(
    jobs: Jobs,
) -> None:
    """0063. An event may be dated (its producer's clock) up to the prune margin ahead of this
    one: a class admits it that early and finishes its job at once, and another class may
    admit the same event a whole window after its date. That class's submit, later in the
    transaction that admitted the event, finds the job, even with a prune between the two
    and a retention of exactly the horizon (before 0063 the key was gone: a second job ran
    the work again). Control: once the job is older than the horizon and that tolerance, it
    goes."""
    async with jobs.pool.acquire() as conn:
        await consumer_inbox.declare_window(conn, Consumer(WORKFLOW, CATALOG, WINDOW_S))
    job_id = await finish(jobs, "op-dated-ahead")
    # finished a tolerance before the event's date, now the whole window past that date
    await age(jobs.pool, job_id, HORIZON_S + 5)
    ledger = Consumer("ledger", CATALOG, replay_window_s=WINDOW_S)
    event = report(tenant=TENANT).model_copy(
        update={
            "operation_id": "op-dated-ahead",
            "occurred_at": datetime.now(UTC) - timedelta(seconds=WINDOW_S - 5),
        }
    )
    async with jobs.pool.acquire() as conn, conn.transaction():
        assert await reserve(conn, ledger, event, Delivery(redelivered=False))
        assert await prune(jobs.pool, retention_s=RETENTION_S) == Pruned()
        done = await submit(
            conn,
            tenant=TENANT,
            workflow=WORKFLOW,
            operation_id="op-dated-ahead",
            digest="d-op-dated-ahead",  # the fixture's
            payload={},
        )
    assert (done.job_id, done.created) == (job_id, False)
    await age(jobs.pool, job_id, KEY_HORIZON_S + 60)
    assert await prune(jobs.pool, retention_s=RETENTION_S) == Pruned(jobs=1, effects=1)


async def test_the_key_tolerance_is_the_largest_margin_any_consumer_declared(
    jobs: Jobs,
) -> None:
    """0063. The class that admits an event early and the one that admits it late may be two
    consumers that declared different margins: the key is kept the longest horizon plus the
    largest margin, not each consumer's own horizon plus its own margin (control: past
    that, it goes)."""
    declare = "SELECT consumers.declare_window($1, $2, $3)"
    await jobs.pool.execute(declare, WORKFLOW, WINDOW_S, 60.0)  # the longest horizon
    await jobs.pool.execute(declare, "ledger", DAY, PRUNE_MARGIN_S)  # the largest margin
    job_id = await finish(jobs, "op-two-margins")
    longest = WINDOW_S + 60.0
    await age(jobs.pool, job_id, longest + 60.0 + 5)  # past the report class's own sum
    assert await prune(jobs.pool, retention_s=longest) == Pruned()
    await age(jobs.pool, job_id, longest + PRUNE_MARGIN_S + 60)
    assert await prune(jobs.pool, retention_s=longest) == Pruned(jobs=1, effects=1)


async def test_a_declared_window_past_a_century_is_refused_by_the_database(jobs: Jobs) -> None:
    """0051: a window of 1e12 s, declared by a process or by hand, made every reserve of the
    consumer fail (22008), its inbox prune fail and jobs.prune refuse every retention."""
    declare = "SELECT consumers.declare_window($1, $2, $3)"
    await jobs.pool.execute(declare, "ledger", 10 * 365 * DAY, PRUNE_MARGIN_S)  # control
    with pytest.raises(asyncpg.CheckViolationError, match="replay_windows_bounded"):
        await jobs.pool.execute(declare, WORKFLOW, 1e12, PRUNE_MARGIN_S)
    decade = 10 * 365 * DAY + PRUNE_MARGIN_S
    assert await prune(jobs.pool, retention_s=decade, audit_retention_s=decade) == Pruned()


async def test_functions_that_turn_sequential_scans_off_turn_jit_off_too(jobs: Jobs) -> None:
    """0051: enable_seqscan = off costs a plan past jit_above_cost, and jobs.prune compiled
    its plans at every call (about 170 ms on an empty database, 1 ms without JIT), its
    batch's row locks held. Every function that sets the one sets the other."""
    configs = await jobs.pool.fetch(
        """SELECT p.oid::regprocedure::text AS name, p.proconfig FROM pg_proc p
           JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE n.nspname IN ('jobs', 'relay', 'consumers', 'ops')
             AND 'enable_seqscan=off' = ANY (p.proconfig)"""
    )
    assert "jobs.prune(double precision,double precision,integer)" in {r["name"] for r in configs}
    assert [r["name"] for r in configs if "jit=off" not in r["proconfig"]] == []


async def test_past_retention_a_job_leaves_with_its_key_effects_traces_and_results(
    jobs: Jobs,
) -> None:
    old = await finish(jobs, "old", object_key="sha256-" + "a" * 64)
    young = await finish(jobs, "young", object_key="sha256-" + "b" * 64)
    for job_id in (old, young):
        await jobs.pool.execute(
            "INSERT INTO jobs.effect_traces (job_id, effect_key, seq, trace)"
            " VALUES ($1, 'charge', 1, '{}')",
            job_id,
        )
        await jobs.pool.execute(
            "INSERT INTO jobs.effect_escalations (job_id, effect_key, seq, tenant, age_s)"
            " VALUES ($1, 'charge', 1, $2, 1)",
            job_id,
            TENANT,
        )
    full = {table: 1 for table in COUNTS}
    assert await rows_of(jobs.pool, old) == full
    await age(jobs.pool, old, RETENTION_S + 60)
    await age(jobs.pool, young, RETENTION_S - 60)

    assert await prune(jobs.pool) == Pruned(jobs=1, effects=1, results=1)
    assert set((await rows_of(jobs.pool, old)).values()) == {0}
    assert await rows_of(jobs.pool, young) == full  # control: inside the retention
    assert await prune(jobs.pool) == Pruned()
    # The key left with its job: the same operation is a new job now.
    assert await jobs.submit("old") > young


async def test_an_unresolved_effect_is_never_removed_whatever_its_age(jobs: Jobs) -> None:
    unknown = await finish(jobs, "unknown", effect=EffectState.UNKNOWN)
    # Canceled while an effect was pending: the record stays the evidence.
    pending = await jobs.submit("canceled-pending")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "charge", "intent")
    assert (await jobs.store.cancel(pending, reason="operator")).unresolved_effects
    # Canceled, then its effect recorded unknown (the job's counter and the record agree).
    canceled_unknown = await jobs.submit("canceled-unknown")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "charge", "intent")
    await jobs.store.finish_effect(lease, "charge", EffectState.UNKNOWN)
    await jobs.store.cancel(canceled_unknown, reason="operator")
    control = await jobs.submit("canceled-clean")
    await jobs.store.cancel(control, reason="operator")
    for job_id in (unknown, pending, canceled_unknown, control):
        await age(jobs.pool, job_id, LONG_AGO_S)

    assert await prune(jobs.pool, retention_s=0, audit_retention_s=0) == Pruned(jobs=1)
    assert (
        await jobs.pool.fetchval("SELECT count(*) FROM jobs.jobs WHERE job_id = $1", control) == 0
    )
    for job_id in (unknown, pending, canceled_unknown):
        counts = await rows_of(jobs.pool, job_id)
        assert counts["jobs"] == counts["operations"] == counts["effects"] == 1, job_id

    # Belt and braces: even a job whose counter was zeroed by hand keeps an unknown record.
    await jobs.pool.execute(
        "UPDATE jobs.jobs SET unresolved_effects = 0 WHERE job_id = $1", unknown
    )
    await jobs.pool.execute("UPDATE jobs.jobs SET state = 'failed' WHERE job_id = $1", unknown)
    await age(jobs.pool, unknown, LONG_AGO_S)
    assert await prune(jobs.pool, retention_s=0, audit_retention_s=0) == Pruned()
    assert (await rows_of(jobs.pool, unknown))["effects"] == 1


async def test_an_effect_resolved_within_the_retention_keeps_its_job(jobs: Jobs) -> None:
    """A repair that resolves an old canceled job's effect today: the job's own clock is old,
    the record's resolution is not, and the record stays for a whole retention."""
    job_id = await jobs.submit("resolved-late")
    lease = await jobs.claim_one()
    await jobs.store.begin_effect(lease, "charge", "intent")
    await jobs.store.cancel(job_id, reason="operator")
    await age(jobs.pool, job_id, LONG_AGO_S)
    row = await jobs.pool.fetchrow(
        "SELECT * FROM jobs.repair_resolve_effect($1, 'charge', 'succeeded', 'r', 'ops', 'ticket')",
        job_id,
    )
    assert row["status"] is None
    assert await prune(jobs.pool) == Pruned()
    await age(jobs.pool, job_id, RETENTION_S + 60)  # control: once that too is old, it goes
    assert await prune(jobs.pool) == Pruned(jobs=1, effects=1)


async def test_only_succeeded_failed_and_canceled_jobs_are_removed(jobs: Jobs) -> None:
    succeeded = await finish(jobs, "succeeded", effect=None)
    failed = await jobs.submit("failed")
    assert await jobs.store.fail(await jobs.claim_one(), "no", retry=False) is JobState.FAILED
    canceled = await jobs.submit("canceled")
    await jobs.store.cancel(canceled, reason="operator")
    kept = {
        "poison": await jobs.submit("poison", max_attempts=1),
        "held": await jobs.submit("held"),
        "running": await jobs.submit("running"),
        "queued": await jobs.submit("queued"),
    }
    assert await jobs.store.fail(await jobs.claim_one(), "no", retry=True) is JobState.POISON
    await jobs.pool.execute("UPDATE jobs.jobs SET state = 'held' WHERE job_id = $1", kept["held"])
    assert (await jobs.claim_one()).job_id == kept["running"]
    for job_id in (succeeded, failed, canceled, *kept.values()):
        await age(jobs.pool, job_id, LONG_AGO_S)

    assert await prune(jobs.pool) == Pruned(jobs=3)
    left = await jobs.pool.fetch("SELECT job_id, state FROM jobs.jobs ORDER BY job_id")
    assert {r["state"]: r["job_id"] for r in left} == kept


async def test_a_batch_is_bounded_and_the_oldest_go_first(jobs: Jobs) -> None:
    ids = [await finish(jobs, f"op{i}", effect=None) for i in range(25)]
    for n, job_id in enumerate(ids):
        await age(jobs.pool, job_id, RETENTION_S + 1000 - n)  # ids[0] is the oldest
    first = await prune(jobs.pool, limit=10)
    assert first == Pruned(jobs=10) and first.full(10)
    assert await jobs.pool.fetchval("SELECT min(job_id) FROM jobs.jobs") == ids[10]
    assert [(await prune(jobs.pool, limit=10)).jobs for _ in range(3)] == [10, 5, 0]


async def test_repair_audit_rows_leave_after_their_own_retention_once_their_job_is_gone(
    jobs: Jobs,
) -> None:
    gone = await finish(jobs, "gone", effect=None)
    kept = await jobs.submit("kept")
    insert = (
        "INSERT INTO jobs.repair_audit (action, who, db_user, db_role, tenant, job_id, outcome,"
        " evidence, at) VALUES ($1, 'ops', 'u', 'r', $2, $3, 'queued', 'ticket',"
        " now() - make_interval(secs => $4)) RETURNING audit_id"
    )
    old_gone = await jobs.pool.fetchval(insert, "resume", TENANT, gone, AUDIT_S + 60)
    young_gone = await jobs.pool.fetchval(insert, "resume", TENANT, gone, AUDIT_S - 60)
    old_kept = await jobs.pool.fetchval(insert, "resume", TENANT, kept, AUDIT_S + 60)
    old_epoch = await jobs.pool.fetchval(insert, "advance_epoch", TENANT, None, AUDIT_S + 60)
    named = await jobs.pool.fetchval(insert, "advance_epoch", TENANT, None, AUDIT_S + 60)
    acknowledged = await jobs.pool.fetchval(
        insert, "acknowledge_evidence", TENANT, None, AUDIT_S + 60
    )
    await jobs.pool.execute(  # the note is kept for good, and so is who acknowledged it (0063)
        "INSERT INTO jobs.journal_evidence (job_id, effect_key, seq, attempt_id, tenant,"
        " runner_id, acknowledged_at, audit_id) VALUES (1, 'charge', 1, gen_random_uuid(), $1,"
        " 'w', now() - make_interval(secs => $2), $3)",
        TENANT,
        AUDIT_S + 60,
        acknowledged,
    )
    await jobs.pool.execute(
        "INSERT INTO jobs.authority_restores (tenant, db_epoch, ledger_epoch, detected_by,"
        " resolved_at, resolved_epoch, resolved_audit) VALUES ($1, 1, 2, 'test', now(), 3, $2)",
        TENANT,
        named,
    )
    # control: the audit is append-only to everyone else, its owner included
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
        await jobs.pool.execute("DELETE FROM jobs.repair_audit WHERE audit_id = $1", old_gone)

    await age(jobs.pool, gone, RETENTION_S + 60)
    assert await prune(jobs.pool) == Pruned(jobs=1, audit=2)
    left = {r[0] for r in await jobs.pool.fetch("SELECT audit_id FROM jobs.repair_audit")}
    assert left == {young_gone, old_kept, named, acknowledged}
    assert old_epoch not in left


async def test_restore_records_and_registrations_leave_after_the_audit_retention(
    jobs: Jobs,
) -> None:
    """0042: a resolved restore record past the audit retention leaves, and the repair audit
    row it named with it; an open one never does. A registration audit row past it leaves
    unless it is its class's newest (who set the registration in force)."""
    register = (
        "INSERT INTO jobs.registration_audit (action, workflow, owner, effects_enabled, who, at)"
        " VALUES ('register', $1, 'w', true, 'ops', now() - make_interval(secs => $2))"
        " RETURNING audit_id"
    )
    old, young = AUDIT_S + 60, AUDIT_S - 60
    fixture = {r[0] for r in await jobs.pool.fetch("SELECT audit_id FROM jobs.registration_audit")}
    superseded = [await jobs.pool.fetchval(register, "a", old) for _ in range(2)]
    in_force_young = await jobs.pool.fetchval(register, "a", young)
    in_force_alone = await jobs.pool.fetchval(register, "b", old)
    superseded.append(await jobs.pool.fetchval(register, "c", old))
    in_force_old = await jobs.pool.fetchval(register, "c", old)

    audit = (
        "INSERT INTO jobs.repair_audit (action, who, db_user, db_role, tenant, outcome, evidence,"
        " at) VALUES ('advance_epoch', 'ops', 'u', 'r', $1, 'ok', 'ticket',"
        " now() - make_interval(secs => $2)) RETURNING audit_id"
    )
    restore = (
        "INSERT INTO jobs.authority_restores (tenant, db_epoch, ledger_epoch, detected_by,"
        " detected_at, resolved_at, resolved_epoch, resolved_audit) VALUES ($1, 1, 2, 'test',"
        " now() - make_interval(secs => $2), now() - make_interval(secs => $3),"
        " CASE WHEN $3 IS NOT NULL THEN 3 END, $4) RETURNING restore_id"
    )
    await jobs.pool.execute(
        "INSERT INTO jobs.tenants (tenant) VALUES ($1), ('other') ON CONFLICT DO NOTHING", TENANT
    )
    named_old, named_young = [await jobs.pool.fetchval(audit, TENANT, old) for _ in range(2)]
    resolved_old = await jobs.pool.fetchval(restore, TENANT, old, old, named_old)
    resolved_young = await jobs.pool.fetchval(restore, TENANT, old, young, named_young)
    still_open = await jobs.pool.fetchval(restore, "other", LONG_AGO_S, None, None)

    # control: both are closed to every other writer, their owner included
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
        await jobs.pool.execute(
            "DELETE FROM jobs.registration_audit WHERE audit_id = $1", superseded[0]
        )
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
        await jobs.pool.execute(
            "DELETE FROM jobs.authority_restores WHERE restore_id = $1", resolved_old
        )

    # One budget for the three audit tables: a batch of 2 takes the oldest restore record
    # and one registration row, and says it was full.
    first = await prune(jobs.pool, limit=2)
    assert first == Pruned(audit=2) and first.full(2)
    assert await prune(jobs.pool) == Pruned(audit=3)  # two registrations, the named audit row
    assert await prune(jobs.pool) == Pruned()

    registrations = {
        r[0] for r in await jobs.pool.fetch("SELECT audit_id FROM jobs.registration_audit")
    }
    assert registrations == fixture | {in_force_young, in_force_alone, in_force_old}
    restores = {
        r[0] for r in await jobs.pool.fetch("SELECT restore_id FROM jobs.authority_restores")
    }
    assert restores == {resolved_young, still_open}
    assert resolved_old not in restores
    repair = {r[0] for r in await jobs.pool.fetch("SELECT audit_id FROM jobs.repair_audit")}
    assert repair == {named_young}


async def test_settings_that_cannot_work_are_refused_before_any_row_is_read(jobs: Jobs) -> None:
    finished = await finish(jobs, "op", effect=None)
    await age(jobs.pool, finished, LONG_AGO_S)
    for retention_s, audit_s, limit in (
        (-1.0, AUDIT_S, 10),
        (float("nan"), AUDIT_S, 10),
        (RETENTION_S, RETENTION_S - 1, 10),
        (RETENTION_S, AUDIT_S, 0),
        (RETENTION_S, AUDIT_S, jobs_retention.MAX_BATCH + 1),
    ):
        with pytest.raises(ConfigError):
            await prune(jobs.pool, retention_s=retention_s, audit_retention_s=audit_s, limit=limit)
    # the function refuses them too, whoever calls it
    with pytest.raises(asyncpg.InvalidParameterValueError, match="audit retention"):
        await jobs.pool.fetch("SELECT * FROM jobs.prune($1, $2, 10)", RETENTION_S, 0.0)
    assert await prune(jobs.pool) == Pruned(jobs=1)  # control


async def test_another_schema_s_restricting_foreign_key_blocks_the_batch_by_name(
    jobs: Jobs,
) -> None:
    blocked = await finish(jobs, "blocked", effect=None)
    free = await finish(jobs, "free", effect=None)
    for job_id in (blocked, free):
        await age(jobs.pool, job_id, LONG_AGO_S)
    await jobs.pool.execute(
        "CREATE SCHEMA app; CREATE TABLE app.keep (job_id bigint REFERENCES jobs.jobs)"
    )
    await jobs.pool.execute("INSERT INTO app.keep VALUES ($1)", blocked)
    with pytest.raises(PruneBlocked) as caught:
        await prune(jobs.pool)
    assert (caught.value.constraint, caught.value.table) == ("keep_job_id_fkey", "keep")  # type: ignore[attr-defined]
    assert caught.value.schema == "app"  # type: ignore[attr-defined]
    assert await jobs.pool.fetchval("SELECT count(*) FROM jobs.jobs") == 2  # the batch whole

    # A deferred reference would fail only at commit: jobs.prune makes it fail inside, named.
    await jobs.pool.execute(
        "ALTER TABLE app.keep DROP CONSTRAINT keep_job_id_fkey, ADD CONSTRAINT keep_job_id_fkey"
        " FOREIGN KEY (job_id) REFERENCES jobs.jobs DEFERRABLE INITIALLY DEFERRED"
    )
    with pytest.raises(PruneBlocked, match="keep_job_id_fkey"):
        await prune(jobs.pool)

    # control: the same reference ON DELETE SET NULL lets retention through
    await jobs.pool.execute(
        "ALTER TABLE app.keep DROP CONSTRAINT keep_job_id_fkey, ADD CONSTRAINT keep_job_id_fkey"
        " FOREIGN KEY (job_id) REFERENCES jobs.jobs ON DELETE SET NULL"
    )
    assert await prune(jobs.pool) == Pruned(jobs=2)
    assert await jobs.pool.fetchval("SELECT job_id FROM app.keep") is None


async def test_a_demo_report_outlives_its_job(jobs: Jobs) -> None:
    job_id = await finish(jobs, "report:r1", effect=None)
    await jobs.pool.execute(
        "INSERT INTO demo.submissions (tenant, report_id, subject, operation_id, event_id)"
        " VALUES ($1, 'r1', 's', 'report:r1', $2)",
        TENANT,
        uuid.uuid4(),
    )
    await jobs.pool.execute(
        "INSERT INTO demo.reports (tenant, report_id, job_id, object_key, generation)"
        " VALUES ($1, 'r1', $2, 'k', 1)",
        TENANT,
        job_id,
    )
    await age(jobs.pool, job_id, RETENTION_S - 60)
    assert await prune(jobs.pool) == Pruned()  # control
    await age(jobs.pool, job_id, RETENTION_S + 60)
    assert await prune(jobs.pool) == Pruned(jobs=1)
    row = await jobs.pool.fetchrow("SELECT job_id, object_key FROM demo.reports")
    assert (row["job_id"], row["object_key"]) == (None, "k")


async def test_a_pruned_job_s_result_object_is_collected_by_gc_objects(
    jobs: Jobs, pg_dsn: str, tmp_path: Path
) -> None:
    objects = LocalDirStore(tmp_path / "objects")
    key = objects.put(b"an old report")
    make_old(objects, key)
    job_id = await finish(jobs, "with-result", effect=None, object_key=key)
    await age(jobs.pool, job_id, RETENTION_S + 60)

    kept = run_cli(pg_dsn, "--dir", str(objects.root), "--retention-s", "3600")
    assert kept.returncode == 0, kept.stderr
    assert objects.exists(key)  # control: the manifest row still names it
    assert await prune(jobs.pool) == Pruned(jobs=1, results=1)
    done = run_cli(pg_dsn, "--dir", str(objects.root), "--retention-s", "3600")
    assert done.returncode == 0, done.stderr
    assert f"deleted {key}" in done.stdout and not objects.exists(key)


async def test_effect_records_refuse_delete_outside_the_pruner(jobs: Jobs) -> None:
    job_id = await finish(jobs, "op")
    await age(jobs.pool, job_id, LONG_AGO_S)
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never deleted"):
        await jobs.pool.execute("DELETE FROM jobs.effects WHERE job_id = $1", job_id)
    # the flag alone is not the pruner: only jobs.prune's owner, inside it, and resolved only
    async with jobs.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL ROLE accord_worker")
        await conn.execute("SELECT set_config('accord.prune', 'jobs', true)")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DELETE FROM jobs.effects WHERE job_id = $1", job_id)
    # ... and were the role granted DELETE (and the guard's check), the guard itself still
    # refuses it: the flag counts only for jobs.prune's owner (the grants are undone after)
    async with jobs.pool.acquire() as conn, conn.transaction():
        await conn.execute("GRANT DELETE ON jobs.effects TO accord_worker")
        await conn.execute("GRANT EXECUTE ON FUNCTION jobs.pruning() TO accord_worker")
        await conn.execute("SET LOCAL ROLE accord_worker")
        await conn.execute("SELECT set_config('accord.prune', 'jobs', true)")
        with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never deleted"):
            async with conn.transaction():  # a savepoint: the transaction goes on after
                await conn.execute("DELETE FROM jobs.effects WHERE job_id = $1", job_id)
        await conn.execute("RESET ROLE")
        await conn.execute("REVOKE DELETE ON jobs.effects FROM accord_worker")
        await conn.execute("REVOKE EXECUTE ON FUNCTION jobs.pruning() FROM accord_worker")
    assert (await rows_of(jobs.pool, job_id))["effects"] == 1
    # control: the worker role runs the pruner itself
    async with jobs.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL ROLE accord_worker")
        pruned = await jobs_retention.prune(
            conn, retention_s=RETENTION_S, audit_retention_s=AUDIT_S, limit=10
        )
    assert pruned == Pruned(jobs=1, effects=1)


async def test_two_batches_in_one_transaction_leave_the_caller_s_deferred_constraints_alone(
    jobs: Jobs,
) -> None:
    """Two jobs.prune batches in one transaction each remove their job (the first one's
    check of the references to jobs.jobs lasts no longer than the call: 0039), and a
    deferred constraint of the caller's own table is still deferred after them: a row that
    breaks it until the transaction fixes it commits. Control: the same transaction with the
    caller's constraint made immediate fails at that row."""
    first = await finish(jobs, "first", effect=None)
    second = await finish(jobs, "second", effect=None)
    for job_id in (first, second):
        await age(jobs.pool, job_id, LONG_AGO_S)
    await jobs.pool.execute(
        "CREATE SCHEMA app; CREATE TABLE app.parent (id int PRIMARY KEY);"
        " CREATE TABLE app.child (parent int REFERENCES app.parent"
        " DEFERRABLE INITIALLY DEFERRED)"
    )
    async with jobs.pool.acquire() as conn, conn.transaction():
        a = await jobs_retention.prune(
            conn, retention_s=RETENTION_S, audit_retention_s=AUDIT_S, limit=1
        )
        b = await jobs_retention.prune(
            conn, retention_s=RETENTION_S, audit_retention_s=AUDIT_S, limit=1
        )
        await conn.execute("INSERT INTO app.child VALUES (1)")  # its parent comes later
        await conn.execute("INSERT INTO app.parent VALUES (1)")
    assert (a.jobs, b.jobs) == (1, 1)
    assert await jobs.pool.fetchval("SELECT count(*) FROM jobs.jobs") == 0
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        async with jobs.pool.acquire() as conn, conn.transaction():
            await conn.execute("SET CONSTRAINTS app.child_parent_fkey IMMEDIATE")
            await conn.execute("INSERT INTO app.child VALUES (2)")


async def test_tombstones_last_one_more_retention_and_journal_evidence_is_kept(
    jobs: Jobs,
) -> None:
    """0054. A pruned job leaves one tombstone per attempt whose effects went (a journaled
    begin of that attempt may then go); the tombstone itself goes one retention after, in a
    later batch (control: a younger one stays). Journal evidence notes stay, acknowledged or
    not, however old (0063: a journal that still carries the begin drops it only on seeing
    the acknowledged note, at its next start or rotation; test_restart shows the start)."""
    gone, later = await finish(jobs, "gone"), await finish(jobs, "later")
    attempts = {
        r["job_id"]: r["attempt_id"]
        for r in await jobs.pool.fetch("SELECT job_id, attempt_id FROM jobs.effects")
    }
    for job_id in (gone, later):
        await age(jobs.pool, job_id, RETENTION_S + 60)
    assert (await prune(jobs.pool)).jobs == 2
    tombstones = "SELECT attempt_id FROM jobs.pruned_attempts ORDER BY pruned_at, attempt_id"
    assert {r["attempt_id"] for r in await jobs.pool.fetch(tombstones)} == set(attempts.values())
    await jobs.pool.execute(
        "UPDATE jobs.pruned_attempts SET pruned_at = now() - make_interval(secs => $2)"
        " WHERE attempt_id = $1",
        attempts[gone],
        RETENTION_S + 60,
    )
    notes = []
    for acknowledged_ago in (AUDIT_S + 60, AUDIT_S - 60, None):
        notes.append(
            await jobs.pool.fetchval(
                "INSERT INTO jobs.journal_evidence (job_id, effect_key, seq, attempt_id, tenant,"
                " runner_id, found_at, acknowledged_at, audit_id) VALUES (1, 'charge', 1, $1, $2,"
                " 'w', now() - interval '1000 days', now() - make_interval(secs => $3), $4)"
                " RETURNING evidence_id",
                uuid.uuid4(),
                TENANT,
                acknowledged_ago,
                None if acknowledged_ago is None else 1,
            )
        )
    assert await prune(jobs.pool) == Pruned(tombstones=1)
    assert [r["attempt_id"] for r in await jobs.pool.fetch(tombstones)] == [attempts[later]]
    kept = await jobs.pool.fetch("SELECT evidence_id FROM jobs.journal_evidence ORDER BY 1")
    assert [r["evidence_id"] for r in kept] == notes
    # a batch that removed as many tombstones as it may is full: the next one runs at once
    await jobs.pool.execute(
        "INSERT INTO jobs.pruned_attempts (attempt_id, pruned_at)"
        " SELECT gen_random_uuid(), now() - make_interval(secs => $1) FROM generate_series(1, 3)",
        RETENTION_S + 60,
    )
    batch = await prune(jobs.pool, limit=2)
    assert batch == Pruned(tombstones=2) and batch.full(2)
    assert (await prune(jobs.pool, limit=2)).tombstones == 1
