"""Repair authority is narrower than execution authority, and neither is the other.

Each refusal comes after its control: the same principal doing what it may.
"""

from __future__ import annotations

import asyncpg
import pytest

from accord.jobs import EffectState, FenceLost, JobState, RepairRefused, Store, repair_sql, sql
from accord.jobs.repair import audit, release_hold, resolve_effect
from tests.integration.authority.conftest import OWNER, WORKFLOW, Principals

DENIED = asyncpg.InsufficientPrivilegeError


async def unknown_effect(p: Principals, operation_id: str) -> int:
    """A job whose effect outcome is unknown and whose worker gave up (state unknown)."""
    job_id = await p.submit(operation_id)
    lease = await p.claim_one()
    await p.store.begin_effect(lease, "charge", "intent")
    await p.store.finish_effect(lease, "charge", EffectState.UNKNOWN)
    assert await p.store.fail(lease, "ambiguous", retry=True) is JobState.UNKNOWN
    return job_id


async def test_the_worker_executes_but_cannot_repair(principals: Principals) -> None:
    p = principals
    # control: the whole execution path as accord_worker
    job_id = await p.submit("a")
    lease = await p.claim_one()
    lease = await p.store.renew(lease, 60.0)
    await p.store.begin_effect(lease, "charge", "intent")
    await p.store.finish_effect(lease, "charge", EffectState.SUCCEEDED, receipt="r-1")

    async def manifest(tx: asyncpg.Connection) -> None:
        await Store.record_result(tx, lease, "k", "d")

    await p.store.publish(lease, manifest)
    assert await p.state(job_id) == "succeeded"
    await p.store.rescue()
    await p.store.cancel(await p.submit("b"), reason="not needed")

    unknown = await unknown_effect(p, "c")
    async with p.worker.acquire() as conn:
        for stmt, args in (
            (repair_sql.RESOLVE_EFFECT, (unknown, "charge", "succeeded", None, "w", "e", None)),
            (repair_sql.RELEASE_HOLD, (unknown, "w", "e")),
            (repair_sql.REQUEUE_POISON, (unknown, "w", "e")),
            (repair_sql.ADVANCE_EPOCH, ("acme", 9, 1, False, "w", "e")),
            (repair_sql.ESCALATE, (0.0, 10)),
            (repair_sql.AUTHORITY_LOCK, ("acme",)),
            (repair_sql.AUTHORITY_SET, ("acme", 9, False)),
            (sql.ROTATE_EPOCH, ("acme",)),
            (sql.SET_FROZEN, ("acme", False)),
        ):
            with pytest.raises(DENIED):
                await conn.fetch(stmt, *args)
        # nor by plain DML: the worker role has none on the job, effect or tenant rows
        for stmt in (
            "UPDATE jobs.jobs SET state = 'queued' WHERE job_id = $1",
            "UPDATE jobs.effects SET state = 'succeeded' WHERE job_id = $1",
            "DELETE FROM jobs.repair_audit WHERE job_id = $1",
        ):
            with pytest.raises(DENIED):
                await conn.execute(stmt, unknown)
        with pytest.raises(DENIED):
            await conn.execute("UPDATE jobs.tenants SET epoch = 99")
    assert await p.state(unknown) == "unknown"


async def test_the_repair_role_repairs_but_cannot_execute(principals: Principals) -> None:
    p = principals
    unknown = await unknown_effect(p, "a")
    # control: the repair principal resolves the effect with evidence
    async with p.repair.acquire() as conn, conn.transaction():
        done = await resolve_effect(
            conn, unknown, "charge", EffectState.FAILED_BEFORE_DISPATCH,
            who="alice", evidence="ticket-1: provider has no record",
        )  # fmt: skip
    assert done.job_state is JobState.QUEUED
    # ... but cannot claim, renew, publish, begin an effect, fail or submit
    repair_store = Store(p.repair)
    with pytest.raises(DENIED):
        await repair_store.claim(WORKFLOW, OWNER, lease_s=30)
    lease = await p.claim_one()  # the worker's lease, stolen by the repair principal
    with pytest.raises(DENIED):
        await repair_store.renew(lease, 30)
    with pytest.raises(DENIED):
        await repair_store.publish(lease)
    with pytest.raises(DENIED):
        await repair_store.begin_effect(lease, "charge", "intent")
    with pytest.raises(DENIED):
        await repair_store.fail(lease, "x", retry=True)
    async with p.repair.acquire() as conn:
        with pytest.raises(DENIED):
            await conn.fetch(sql.FENCE, *lease.fence_args())
        with pytest.raises(DENIED):
            await conn.fetch(sql.SUBMIT, "acme", WORKFLOW, "z", "d", "{}", 5)
        with pytest.raises(DENIED):
            await conn.execute("UPDATE jobs.jobs SET state = 'queued' WHERE job_id = $1", unknown)
    # the worker's lease is untouched by all of that
    await p.store.publish(lease)
    assert await p.state(lease.job_id) == "succeeded"


async def test_every_repair_is_audited_with_principal_and_evidence(
    principals: Principals,
) -> None:
    p = principals
    unknown = await unknown_effect(p, "a")
    async with p.repair.acquire() as conn:
        async with conn.transaction():
            await resolve_effect(
                conn, unknown, "charge", EffectState.SUCCEEDED,
                who="alice", evidence="provider receipt r-9", receipt="r-9",
            )  # fmt: skip
        rows = await audit(conn, job_id=unknown)
    assert [(r.action, r.who, r.evidence, r.outcome, r.db_role) for r in rows] == [
        ("resolve_effect", "alice", "provider receipt r-9", "succeeded", "accord_repair")
    ]
    assert rows[0].effect_key == "charge" and rows[0].seq == 1 and rows[0].db_user
    view = await p.store.job(unknown)
    assert view.effects[0].state is EffectState.SUCCEEDED and view.effects[0].receipt == "r-9"
    # the audit is append-only, even for the owner
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
        await p.owner.execute("DELETE FROM jobs.repair_audit")
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
        await p.owner.execute("UPDATE jobs.repair_audit SET who = 'mallory'")


async def test_an_unknown_outcome_changes_only_through_the_repair_function(
    principals: Principals,
) -> None:
    p = principals
    unknown = await unknown_effect(p, "a")
    async with p.owner.acquire() as conn:
        # Even the owner's plain UPDATE is refused without the repair function's token...
        with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never changes"):
            await conn.execute(
                "UPDATE jobs.effects SET state = 'succeeded' WHERE job_id = $1", unknown
            )
        # ...and a token naming another record does not help.
        async with conn.transaction():
            await conn.execute("SELECT set_config('accord.repair_effect', '[1, \"x\", 1]', true)")
            with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never changes"):
                await conn.execute(
                    "UPDATE jobs.effects SET state = 'succeeded' WHERE job_id = $1", unknown
                )
    # control: the repair function itself
    async with p.repair.acquire() as conn, conn.transaction():
        await resolve_effect(conn, unknown, "charge", EffectState.SUCCEEDED, who="a", evidence="r")
        # and the token does not outlive the one UPDATE
        assert await conn.fetchval("SELECT current_setting('accord.repair_effect', true)") == ""


async def test_repairs_are_refused_on_leased_jobs(principals: Principals) -> None:
    p = principals
    unknown = await unknown_effect(p, "a")
    async with p.repair.acquire() as conn, conn.transaction():  # control: not running
        await resolve_effect(
            conn, unknown, "charge", EffectState.FAILED_BEFORE_DISPATCH, who="a", evidence="e"
        )
    lease = await p.claim_one()  # the job runs again: begin the same key a second time
    await p.store.begin_effect(lease, "charge", "intent")
    async with p.repair.acquire() as conn:
        with pytest.raises(RepairRefused) as refused:
            async with conn.transaction():
                await resolve_effect(
                    conn, unknown, "charge", EffectState.SUCCEEDED, who="a", evidence="e"
                )
        assert refused.value.reason == "running"
        with pytest.raises(RepairRefused) as refused:
            async with conn.transaction():
                await release_hold(conn, unknown, who="a", evidence="e")
        assert refused.value.reason == "running"
        count = await conn.fetchval(
            "SELECT count(*) FROM jobs.repair_audit WHERE job_id = $1", unknown
        )
    assert count == 1  # only the control
    await p.store.finish_effect(lease, "charge", EffectState.SUCCEEDED)
    await p.store.publish(lease)


async def test_the_worker_writes_manifests_only_fenced_and_never_registers(
    principals: Principals,
) -> None:
    p = principals
    job_id = await p.submit("a")
    lease = await p.claim_one()
    other = await p.submit("b")  # queued, never claimed: no fence would let a manifest in
    async with p.owner.acquire() as conn:
        # control: as accord_worker, the fenced function writes the current lease's manifest
        async with conn.transaction():
            await conn.execute("SET LOCAL ROLE accord_worker")
            await Store.record_result(conn, lease, "sha256-current", "current")
            # forbidden: a plain INSERT (no fence) and any change of a registration
            for stmt, args in (
                (
                    "INSERT INTO jobs.results (job_id, tenant, object_key, content_digest)"
                    " VALUES ($1, 'acme', 'sha256-forged', 'forged')",
                    (other,),
                ),
                ("UPDATE jobs.workflows SET effects_enabled = NOT effects_enabled", ()),
                ("UPDATE jobs.workflows SET owner = 'mallory'", ()),
                ("INSERT INTO jobs.workflows (workflow, owner) VALUES ('new', 'mallory')", ()),
            ):
                with pytest.raises(DENIED):
                    async with conn.transaction():  # a savepoint per refusal
                        await conn.execute(stmt, *args)
            await conn.execute("RESET ROLE")
        # the worker's Store cannot register either; the owner can (control)
        with pytest.raises(DENIED):
            await p.store.register_workflow("new", "mallory", effects_enabled=True)
        await Store(p.owner).register_workflow("new", "svc")
    assert (
        await p.owner.fetchval(
            "SELECT (owner, effects_enabled)::text FROM jobs.workflows WHERE workflow = $1",
            WORKFLOW,
        )
        == f"({OWNER},t)"
    )
    assert await p.owner.fetchval("SELECT object_key FROM jobs.results") == "sha256-current"
    # a stale lease: expired, rescued and re-claimed; its manifest is refused by the fence
    await p.owner.execute("DELETE FROM jobs.results")  # the control's row, not published
    await p.expire(job_id)
    await p.store.rescue()
    fresh = await p.claim_one()
    async with p.worker.acquire() as conn:
        with pytest.raises(FenceLost) as info:
            async with conn.transaction():
                await Store.record_result(conn, lease, "sha256-stale", "stale")
        assert info.value.failed_check == "generation"
        async with conn.transaction():
            await Store.record_result(conn, fresh, "sha256-fresh", "fresh")
    assert await p.owner.fetchval("SELECT object_key FROM jobs.results") == "sha256-fresh"


async def test_the_worker_publishes_a_batch(principals: Principals) -> None:
    p = principals
    ids = [await p.submit(f"op{i}") for i in range(3)]
    leases = await p.claim(limit=3)
    await p.expire(ids[2])
    done = await p.store.publish_many(leases)  # as accord_worker
    assert [le.job_id for le in done.published] == ids[:2]
    assert [(le.job_id, err.failed_check) for le, err in done.refused] == [
        (ids[2], "lease_expired")
    ]
    assert [await p.state(j) for j in ids] == ["succeeded", "succeeded", "running"]
