"""What nobody may do to a tenant whose database is behind its ledger, and what the repair role
may do only then.

* An owner's rotate or restrict on a database one epoch behind the ledger would bring it level
  and hide the restore from every later check: refused, like a lift (control: level, it runs).
* The repair role advances an epoch only past an open restore (it cannot lift a restriction by
  advancing), never below the ledger epoch that restore recorded, and keeps the restriction the
  ledger holds: a restriction survives a restore, and only the owner lifts it.
* A restore holds the tenant's queued, running and unknown jobs; a resolved effect leaves its
  job held, during the restore and after its advance, and a poisoned job is not requeued
  while it is open: old work of the restored tenant runs again only once a person releases it.
* Two advances at once: the second, which waited for the first, is refused before it writes
  the ledger (no_restore), and no restore opens again.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from accord.jobs import (
    AuthorityRefused,
    EffectState,
    FileLedger,
    JobState,
    LedgerRecord,
    LedgerWhy,
    RepairRefused,
    check_restore,
)
from accord.jobs.authority import lift, restrict, rotate
from accord.jobs.repair import advance_epoch, release_hold, requeue_poison, resolve_effect
from tests.integration.authority.conftest import TENANT, Principals
from tests.support import wait_for


async def epoch_of(p: Principals) -> tuple[int, bool]:
    row = await p.owner.fetchrow("SELECT epoch, frozen FROM jobs.tenants WHERE tenant = $1", TENANT)
    return row["epoch"], row["frozen"]


async def restored(p: Principals, ledger: FileLedger, *, frozen: bool = False) -> None:
    """The ledger one epoch ahead of the database, as after a restore to the snapshot
    before the last change (a restriction, with ``frozen``)."""
    await p.owner.execute(
        "INSERT INTO jobs.tenants (tenant) VALUES ($1) ON CONFLICT DO NOTHING", TENANT
    )
    epoch, _ = await epoch_of(p)
    why = LedgerWhy.RESTRICT if frozen else LedgerWhy.ROTATE
    await ledger.append(LedgerRecord(tenant=TENANT, epoch=epoch + 1, frozen=frozen, why=why))


@pytest.mark.parametrize("change", ["rotate", "restrict"])
async def test_a_change_on_a_database_behind_the_ledger_is_refused_not_hiding_it(
    principals: Principals, ledger: FileLedger, change: str
) -> None:
    p = principals
    await p.submit("a")

    async def apply() -> int:
        async with p.owner.acquire() as conn, conn.transaction():
            if change == "rotate":
                return await rotate(conn, ledger, TENANT, who="ops")
            return await restrict(conn, ledger, TENANT, who="ops", evidence="inc-1")

    assert await apply() == 2  # control: level with the ledger, it runs
    if change == "restrict":
        async with p.owner.acquire() as conn, conn.transaction():
            await lift(conn, ledger, TENANT, who="ops")
    await restored(p, ledger)
    before = await epoch_of(p)
    with pytest.raises(AuthorityRefused) as refused:
        await apply()
    assert refused.value.reason == "restore_unresolved"
    assert await epoch_of(p) == before
    # ... so the next check still sees the restore, freezes the tenant and holds its work
    [restore] = await check_restore(p.worker, ledger)
    assert (restore.db_epoch, restore.ledger_epoch, restore.held_jobs) == (
        before[0],
        before[0] + 1,
        1,
    )
    assert await p.claim() == []


async def test_the_repair_role_advances_only_past_an_open_restore(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    async with p.owner.acquire() as conn, conn.transaction():
        await restrict(conn, ledger, TENANT, who="security", evidence="inc-2")
    await p.submit("a")
    async with p.repair.acquire() as conn:
        with pytest.raises(RepairRefused) as refused:  # no restore: a restriction stays
            async with conn.transaction():
                await advance_epoch(conn, ledger, TENANT, who="mallory", evidence="x")
        assert refused.value.reason == "no_restore"
        assert await epoch_of(p) == (2, True) and await p.claim() == []
        # A direct call refuses alike, and below the ledger epoch a restore recorded.
        call = "SELECT status FROM jobs.repair_advance_epoch($1, $2, $3, false, 'm', 'x')"
        assert await conn.fetchval(call, TENANT, 9, 2) == "no_restore"
        await restored(p, ledger)  # the database one behind (ledger 3, database 2)
        assert len(await check_restore(p.worker, ledger)) == 1
        assert await conn.fetchval(call, TENANT, 3, 2) == "behind_detection"
        # A NULL ledger epoch is no way round it (0050: NULL < 3 was NULL, the check skipped)
        assert await conn.fetchval(call, TENANT, 4, None) == "behind_detection"
        assert await epoch_of(p) == (2, True)
        async with conn.transaction():  # control: with the restore open, it advances
            done = await advance_epoch(conn, ledger, TENANT, who="alice", evidence="drill")
        assert (done.epoch, done.ledger_epoch) == (4, 3)


async def test_a_restriction_the_ledger_records_survives_the_restore(
    principals: Principals, ledger: FileLedger
) -> None:
    """Restricted after the snapshot: the restored database is unrestricted, one behind. The
    repair principal's advance keeps the ledger's restriction (the detection recorded it, and
    the database function refuses an advance that would clear it); new work waits for the
    owner's lift (control: it runs after)."""
    p = principals
    await restored(p, ledger, frozen=True)
    assert len(await check_restore(p.worker, ledger)) == 1
    async with p.repair.acquire() as conn:
        # The detection recorded the ledger's restriction: a direct call cannot clear it.
        call = "SELECT status FROM jobs.repair_advance_epoch($1, 9, 2, $2, 'mallory', 'x')"
        assert await conn.fetchval(call, TENANT, False) == "keeps_restriction"
        # ... nor a hold that says the ledger, at the same epoch, holds no restriction: the
        # ledger changes a restriction only with an epoch (0050; before, this cleared it)
        for role in (p.repair, p.worker):
            async with role.acquire() as forger:
                await forger.fetch("SELECT * FROM jobs.authority_hold($1, 2, false)", TENANT)
        assert await conn.fetchval(call, TENANT, False) == "keeps_restriction"
        async with conn.transaction():
            done = await advance_epoch(conn, ledger, TENANT, who="alice", evidence="drill")
    assert await epoch_of(p) == (done.epoch, True)
    assert (await ledger.read())[TENANT].frozen is True
    assert await check_restore(p.worker, ledger) == []
    fresh = await p.submit("new")
    assert await p.claim() == []
    async with p.owner.acquire() as conn, conn.transaction():
        await lift(conn, ledger, TENANT, who="security", evidence="inc-2 closed")
    [lease] = await p.claim()
    assert lease.job_id == fresh


async def _unknown_job(p: Principals, op: str, *, retry: bool = True) -> int:
    """A job given up as unknown after a lost reply (``retry=False``: its handler's own
    defect met after it, its verdict final)."""
    job = await p.submit(op)
    lease = await p.claim_one()
    await p.store.begin_effect(lease, "charge", "i")
    await p.store.finish_effect(lease, "charge", EffectState.UNKNOWN)
    assert await p.store.fail(lease, "lost reply", retry=retry) is JobState.UNKNOWN
    return job


async def test_old_work_waits_for_a_person_while_a_restore_is_open(
    principals: Principals, ledger: FileLedger
) -> None:
    """A restore holds the tenant's unknown jobs as it holds its queued and running ones
    (0060): an unknown effect resolved while the restore is open, or after the epoch's
    advance (reconcile runs unattended), leaves its job held, and a poisoned job is not
    requeued. Before, the job stayed unknown and a resolution after the advance queued it
    with nobody looking. Once the restore is resolved, a person releases and requeues them
    (the control); a job given up for good is failed by its release, never run again."""
    p = principals
    before = await _unknown_job(p, "u")  # resolved while the restore is open
    after = await _unknown_job(p, "v")  # resolved after the advance
    final = await _unknown_job(p, "f", retry=False)
    poisoned = await p.submit("p", max_attempts=1)
    assert await p.store.fail(await p.claim_one(), "boom", retry=True) is JobState.POISON
    await restored(p, ledger)
    (restore,) = await check_restore(p.worker, ledger)
    assert restore.held_jobs == 3  # the unknown ones
    async with p.repair.acquire() as conn:
        for job in (before, final):
            async with conn.transaction():
                done = await resolve_effect(
                    conn, job, "charge", EffectState.FAILED_BEFORE_DISPATCH,
                    who="reconcile", evidence="provider: never accepted",
                )  # fmt: skip
            assert done.job_state is JobState.HELD
        with pytest.raises(RepairRefused) as refused:
            async with conn.transaction():
                await requeue_poison(conn, poisoned, who="alice", evidence="fixed")
        assert refused.value.reason == "restore_unresolved"
        async with conn.transaction():
            await advance_epoch(conn, ledger, TENANT, who="alice", evidence="drill")
        async with conn.transaction():  # an unattended reconcile after the advance
            done = await resolve_effect(
                conn, after, "charge", EffectState.FAILED_BEFORE_DISPATCH,
                who="reconcile", evidence="provider: never accepted",
            )  # fmt: skip
        assert done.job_state is JobState.HELD
        assert await p.claim() == []  # nothing of the old work runs by itself
        async with conn.transaction():
            released = {
                job: (await release_hold(conn, job, who="alice", evidence="looked")).state
                for job in (before, after, final)
            }
            await requeue_poison(conn, poisoned, who="alice", evidence="fixed")
    assert released == {before: JobState.QUEUED, after: JobState.QUEUED, final: JobState.FAILED}
    assert {lease.job_id for lease in await p.claim(limit=5)} == {before, after, poisoned}


async def test_an_advance_that_waited_for_another_is_refused_before_the_ledger(
    principals: Principals, ledger: FileLedger
) -> None:
    """Two people advance the same restored tenant at once: the second waits for the row
    lock the first holds while it writes the ledger. Before, the second read the restore as
    open from before its wait, appended a new epoch to the ledger, and was refused by the
    database (no_restore): the ledger, now ahead, froze the tenant again at the next check.
    Now it is refused before the ledger (no_restore), and the next check finds nothing.
    Control: the first advance runs."""
    p = principals
    await restored(p, ledger)
    assert len(await check_restore(p.worker, ledger)) == 1
    records = len(ledger.records())
    holding = anyio.Event()

    class Paused:
        """Alice's ledger: her append waits, her row lock held, until Bob waits for it."""

        async def read(self) -> Any:
            return await ledger.read()

        async def append(self, record: LedgerRecord) -> None:
            holding.set()
            await wait_for(lambda: _waiting_on_a_lock(p))
            await ledger.append(record)

    outcome: dict[str, Any] = {}

    async def advance(who: str, on: Any) -> None:
        async with p.repair.acquire() as conn:
            try:
                async with conn.transaction():
                    outcome[who] = await advance_epoch(conn, on, TENANT, who=who, evidence="d")
            except RepairRefused as exc:
                outcome[who] = exc.reason

    async with anyio.create_task_group() as tg:
        tg.start_soon(advance, "alice", Paused())
        await holding.wait()
        tg.start_soon(advance, "bob", ledger)
    assert outcome["bob"] == "no_restore"
    assert (await ledger.read())[TENANT].epoch == outcome["alice"].epoch  # nothing after it
    assert len(ledger.records()) == records + 1  # alice's advance alone
    assert await check_restore(p.worker, ledger) == []  # no restore opens again


async def _waiting_on_a_lock(p: Principals) -> bool:
    waiting = await p.owner.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    )
    return bool(waiting)
