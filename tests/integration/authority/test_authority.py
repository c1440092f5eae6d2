"""Authority changes go to the ledger first; a database behind the ledger is a detected restore."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from functools import partial

import anyio
import asyncpg
import pytest

from accord import observe
from accord.jobs import (
    AuthorityGate,
    AuthorityRefused,
    FenceLost,
    FileLedger,
    LedgerRecord,
    LedgerWhy,
    RepairRefused,
    Store,
    TenantRestore,
    authority_watch,
    check_restore,
    repair_sql,
    require_authority,
)
from accord.jobs.authority import lift, restrict, rotate
from accord.jobs.repair import WORKER_ROLE, advance_epoch, release_hold
from accord.schemas.db import create_pool
from tests.integration.authority.conftest import TENANT, Principals
from tests.integration.ops.proxy import Proxy
from tests.support import wait_for


def checks() -> dict[tuple[str, str], float]:
    """accord_authority_checks so far, by (trigger, outcome)."""
    return {
        (s.labels["trigger"], s.labels["outcome"]): s.value
        for metric in observe.AUTHORITY_CHECKS.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


def since(before: dict[tuple[str, str], float], trigger: str, outcome: str) -> float:
    """The checks counted with ``trigger`` and ``outcome`` since ``before``."""
    key = (trigger, outcome)
    return checks().get(key, 0.0) - before.get(key, 0.0)


async def epoch_of(p: Principals, tenant: str = TENANT) -> tuple[int, bool]:
    row = await p.owner.fetchrow("SELECT epoch, frozen FROM jobs.tenants WHERE tenant = $1", tenant)
    return row["epoch"], row["frozen"]


async def test_every_statement_prepares(pg: asyncpg.Connection) -> None:
    await pg.execute(repair_sql.LEDGER_ENSURE)  # the ledger's own statements need its table
    for name, stmt in vars(repair_sql).items():
        if name.isupper() and isinstance(stmt, str) and name != "LEDGER_ENSURE":
            await pg.prepare(stmt)


async def test_repair_audit_actions_match_the_check(pg: asyncpg.Connection) -> None:
    definition = await pg.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conname = 'repair_audit_action_check'"
    )
    assert set(re.findall(r"'([a-z_]+)'::text", definition)) == {
        "resolve_effect", "release_hold", "requeue_poison", "resume", "advance_epoch",
        "acknowledge_evidence",
    }  # fmt: skip


async def test_rotation_writes_the_ledger_before_the_database(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    await p.submit("a")
    lease = await p.claim_one()
    async with p.owner.acquire() as conn, conn.transaction():
        epoch = await rotate(conn, ledger, TENANT, who="ops")
        # inside the transaction: the ledger already holds the new epoch, durably
        assert (await ledger.read())[TENANT].epoch == epoch == 2
    assert await epoch_of(p) == (2, False)
    with pytest.raises(FenceLost) as lost:
        await p.store.publish(lease)
    assert lost.value.failed_check == "epoch"
    assert await check_restore(p.worker, ledger) == []  # control: not behind


async def test_a_rolled_back_rotation_leaves_the_ledger_ahead_which_is_a_restore(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    await p.submit("a")
    with pytest.raises(RuntimeError):
        async with p.owner.acquire() as conn, conn.transaction():
            await rotate(conn, ledger, TENANT)
            raise RuntimeError("crash between the ledger and the commit")
    assert (await ledger.read())[TENANT].epoch == 2 and await epoch_of(p) == (1, False)
    restores = await check_restore(p.worker, ledger)
    assert [(r.tenant, r.db_epoch, r.ledger_epoch, r.held_jobs) for r in restores] == [
        (TENANT, 1, 2, 1)
    ]
    assert await p.claim() == []  # held and frozen


async def test_restriction_advances_the_epoch_and_lifting_needs_no_open_restore(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    await p.submit("a")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, "k1", "i")  # control: effects run while unrestricted
    async with p.owner.acquire() as conn, conn.transaction():
        assert await restrict(conn, ledger, TENANT, who="ops", evidence="incident-7") == 2
    assert await epoch_of(p) == (2, True)
    with pytest.raises(FenceLost):
        await p.store.begin_effect(lease, "k2", "i")
    await p.submit("b")
    assert await p.claim() == []
    async with p.owner.acquire() as conn, conn.transaction():
        assert await lift(conn, ledger, TENANT, who="ops") == 3
    assert len(await p.claim()) == 1  # b (a is running under a dead lease)
    with pytest.raises(FenceLost):  # lifting never revives a lease from before
        await p.store.begin_effect(lease, "k2", "i")


async def test_begin_effect_is_refused_while_frozen(principals: Principals) -> None:
    p = principals
    await p.submit("a")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, "k1", "i")  # control
    await p.owner.execute("UPDATE jobs.tenants SET frozen = true WHERE tenant = $1", TENANT)
    with pytest.raises(FenceLost) as lost:
        await p.store.begin_effect(lease, "k2", "i")
    assert lost.value.failed_check == "frozen"


async def test_check_restore_holds_work_once_and_is_idempotent(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    queued = await p.submit("a")
    await p.submit("b")
    running = await p.claim()
    other = await p.submit("c", tenant="other")
    await ledger.append(LedgerRecord(tenant=TENANT, epoch=5, frozen=False, why=LedgerWhy.ROTATE))
    first = await check_restore(p.worker, ledger)
    assert [
        (r.tenant, r.db_epoch, r.ledger_epoch, r.held_jobs, r.newly_detected) for r in first
    ] == [(TENANT, 1, 5, 2, True)]
    assert {await p.state(j.job_id) for j in running} == {"held"}
    assert await p.state(other) == "queued"  # control: another tenant is untouched
    again = await check_restore(p.worker, ledger)
    assert [(r.restore_id, r.held_jobs, r.newly_detected) for r in again] == [
        (first[0].restore_id, 2, False)
    ]
    assert len(await p.claim()) == 1  # only the other tenant's job
    assert await p.state(queued) == "held"


async def test_a_tenant_missing_from_the_restored_database_is_frozen(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    await ledger.append(LedgerRecord(tenant="late", epoch=3, frozen=False, why=LedgerWhy.ROTATE))
    [restore] = await check_restore(p.worker, ledger)
    assert (restore.tenant, restore.db_epoch, restore.ledger_epoch) == ("late", 1, 3)
    await p.submit("x", tenant="late")
    assert await p.claim() == []


async def test_a_database_ahead_of_the_ledger_is_recorded_as_observed(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    await p.submit("a")
    await Store(p.owner).rotate_epoch(TENANT)  # the ledger-less primitive (admin)
    assert await check_restore(p.worker, ledger) == []
    entry = (await ledger.read())[TENANT]
    assert (entry.epoch, entry.why) == (2, LedgerWhy.OBSERVED)
    assert await check_restore(p.worker, ledger) == []
    assert len(ledger.records()) == 1  # not appended again


async def test_advance_epoch_resolves_the_restore_but_holds_stay_until_released(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    held = await p.submit("a")
    await ledger.append(LedgerRecord(tenant=TENANT, epoch=4, frozen=False, why=LedgerWhy.ROTATE))
    await check_restore(p.worker, ledger)
    async with p.repair.acquire() as conn:
        with pytest.raises(RepairRefused) as refused:
            async with conn.transaction():
                await release_hold(conn, held, who="alice", evidence="ticket")
        assert refused.value.reason == "restore_unresolved"
        with pytest.raises(AuthorityRefused):  # nor can an admin just lift it
            async with p.owner.acquire() as admin, admin.transaction():
                await lift(admin, ledger, TENANT)
        async with conn.transaction():
            done = await advance_epoch(conn, ledger, TENANT, who="alice", evidence="drill-1")
        assert (done.epoch, done.ledger_epoch) == (5, 4)
        assert (await ledger.read())[TENANT].epoch == 5
        assert await epoch_of(p) == (5, False)
        assert await check_restore(p.worker, ledger) == []
        assert await require_authority(p.worker, ledger) == []
        assert await p.claim() == []  # still held
        async with conn.transaction():
            await release_hold(conn, held, who="alice", evidence="ticket")
    lease = await p.claim_one()
    assert (lease.job_id, lease.epoch) == (held, 5)


async def test_authority_watch_detects_a_restore_while_running(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    await p.submit("a")
    lease = await p.claim_one()
    seen: list[TenantRestore] = []
    detected = anyio.Event()

    async def on_restore(restores: list[TenantRestore]) -> None:
        seen.extend(restores)
        detected.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            watch = partial(authority_watch, on_restore=on_restore)
            await tg.start(watch, p.worker, ledger, 0.05)
            await p.store.renew(lease, 60)  # control: nothing detected yet
            await ledger.append(
                LedgerRecord(tenant=TENANT, epoch=2, frozen=False, why=LedgerWhy.ROTATE)
            )
            await detected.wait()
            tg.cancel_scope.cancel()
    assert [(r.tenant, r.held_jobs) for r in seen] == [(TENANT, 1)]
    with pytest.raises(FenceLost):
        await p.store.renew(lease, 60)


async def test_the_authority_watch_outlives_a_lost_database_and_shuts_the_gate(
    principals: Principals, ledger: FileLedger
) -> None:
    """The watch's pool reaches PostgreSQL through a proxy of this test's own. Control: its
    first pass opens the gate. The proxy cut (a restart, a failover), the watch's passes
    fail: it goes on, retrying with the backoff, and the gate stays shut, so no claim can
    meet a database that may come back restored; once a pass succeeds after the restore, the
    gate opens again, and the watch still detects a restore. Before, the first pass that
    met the lost connection raised out of the watch and ended the worker (a traceback).
    Each pass is counted by what brought it on (``accord_authority_checks``); a new pool
    connection (``connection_opened``) brings one forward, which opens the gate again."""
    proxy = Proxy.of(principals.dsn)
    pool = await create_pool(
        proxy.url(principals.dsn), min_size=1, max_size=2, server_settings={"role": WORKER_ROLE}
    )
    gate = AuthorityGate()
    seen: list[TenantRestore] = []

    async def on_restore(restores: list[TenantRestore]) -> None:
        seen.extend(restores)

    def until(predicate: Callable[[], bool]) -> Awaitable[None]:
        async def holds() -> bool:
            return predicate()

        return wait_for(holds, within=20, every=0.02)

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                watch = partial(authority_watch, gate=gate, on_restore=on_restore)
                before = checks()
                await tg.start(watch, pool, ledger, 0.05)
                assert gate.is_open()
                assert since(before, "start", "passed") == 1
                proxy.cut()
                await until(lambda: not gate.is_open())
                await anyio.sleep(1.0)  # passes keep failing meanwhile; the watch goes on
                assert not gate.is_open()
                assert since(before, "interval", "connection_lost") == 1
                proxy.restore()
                await until(gate.is_open)
                assert since(before, "retry", "passed") == 1  # the pass that opened it
                await gate.connection_opened(None)
                assert not gate.is_open()
                await until(gate.is_open)
                assert since(before, "connection", "passed") == 1
                await principals.submit("a")
                await principals.claim_one()
                await ledger.append(
                    LedgerRecord(tenant=TENANT, epoch=2, frozen=False, why=LedgerWhy.ROTATE)
                )
                await until(lambda: bool(seen))
                tg.cancel_scope.cancel()
    finally:
        await pool.close()
        proxy.close()
    assert [(r.tenant, r.held_jobs) for r in seen] == [(TENANT, 1)]


async def test_a_loss_reported_during_a_pass_keeps_the_gate_shut() -> None:
    """A pass that began before a loss does not open the gate (it may have read the database
    before it was restored); one that began after it does."""
    gate = AuthorityGate()
    before = gate.mark()
    gate.lost()
    gate.passed(before)
    assert not gate.is_open()
    gate.passed(gate.mark())
    assert gate.is_open()
    gate.lost()
    assert not gate.is_open()
