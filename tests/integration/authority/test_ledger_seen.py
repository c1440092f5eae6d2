"""A ledger that holds less of a tenant than a check found in it before is refused (0052):
a missing file (a wrong ACCORD_LEDGER_PATH, or its relative default run from another
directory), an older copy. Before, a missing file read as an empty ledger: the check
reported no restore while the real ledger was ahead of the database, and wrote a new ledger
at the wrong path. A database restored from before its ledger is still a restore."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from accord.jobs import FileLedger, LedgerRecord, LedgerUnavailable, LedgerWhy, check_restore
from accord.jobs.authority import rotate
from tests.integration.authority.conftest import TENANT, Principals


async def seen(p: Principals) -> int | None:
    epoch: int | None = await p.owner.fetchval(
        "SELECT ledger_epoch FROM jobs.tenants WHERE tenant = $1", TENANT
    )
    return epoch


async def test_a_missing_ledger_is_refused_once_the_database_saw_one(
    principals: Principals, ledger: FileLedger, tmp_path: Path
) -> None:
    p = principals
    await p.submit("a")
    assert await check_restore(p.worker, ledger) == []  # control: the real ledger
    assert await seen(p) == 1
    async with p.owner.acquire() as conn, conn.transaction():
        await rotate(conn, ledger, TENANT, who="ops")
    await check_restore(p.worker, ledger)
    assert await seen(p) == 2
    elsewhere = FileLedger(tmp_path / "elsewhere" / "authority.ledger")
    for pool in (p.worker, p.repair):
        with pytest.raises(LedgerUnavailable) as refused:
            await check_restore(pool, elsewhere)
        assert refused.value.fields["tenants"] == [TENANT]
        assert refused.value.fields["seen_epochs"] == [2]
    assert not elsewhere.path.exists()  # nothing written to a ledger not trusted
    assert await check_restore(p.worker, ledger) == []  # the real one still passes


async def test_an_older_copy_of_the_ledger_is_refused(
    principals: Principals, ledger: FileLedger, tmp_path: Path
) -> None:
    p = principals
    await p.submit("a")
    await check_restore(p.worker, ledger)
    copy = tmp_path / "copy.ledger"
    shutil.copy(ledger.path, copy)  # the ledger at epoch 1
    async with p.owner.acquire() as conn, conn.transaction():
        await rotate(conn, ledger, TENANT, who="ops")
    await check_restore(p.worker, ledger)
    with pytest.raises(LedgerUnavailable):
        await check_restore(p.worker, FileLedger(copy))


async def test_a_database_restored_from_before_is_still_a_restore_not_a_refusal(
    principals: Principals, ledger: FileLedger
) -> None:
    p = principals
    await p.submit("a")
    await check_restore(p.worker, ledger)
    # The database as a snapshot from before: epoch and what it had seen in the ledger,
    # while the ledger went on to epoch 3.
    await ledger.append(LedgerRecord(tenant=TENANT, epoch=3, frozen=False, why=LedgerWhy.ROTATE))
    [restore] = await check_restore(p.worker, ledger)
    assert (restore.db_epoch, restore.ledger_epoch) == (1, 3)
    assert await seen(p) == 3


async def test_a_change_is_never_written_to_a_ledger_the_check_would_refuse(
    principals: Principals, ledger: FileLedger, tmp_path: Path
) -> None:
    """Rotate, restrict, lift and the repair role's advance lock the tenant's row, then
    compare the ledger with what checks saw in it: a wrong ledger gets nothing written."""
    p = principals
    await p.submit("a")
    await check_restore(p.worker, ledger)
    elsewhere = FileLedger(tmp_path / "elsewhere.ledger")
    with pytest.raises(LedgerUnavailable):
        async with p.owner.acquire() as conn, conn.transaction():
            await rotate(conn, elsewhere, TENANT, who="ops")
    assert not elsewhere.path.exists()
    async with p.owner.acquire() as conn, conn.transaction():  # control: the real ledger
        assert await rotate(conn, ledger, TENANT, who="ops") == 2


class Syncs(FileLedger):
    """A file ledger noting when it was made durable and when the database recorded what
    was read from it (by the order of calls: sync, then jobs.ledger_seen)."""

    def __init__(self, path: Path, calls: list[str]) -> None:
        super().__init__(path)
        self.calls = calls

    async def sync(self) -> None:
        self.calls.append("sync")
        await super().sync()


async def test_what_a_check_records_it_made_durable_first(
    principals: Principals, tmp_path: Path
) -> None:
    """A frame another writer appended is readable before that writer's fsync returns; a
    power cut could then tear it, and a check that had recorded its epoch would refuse the
    ledger for ever. The check fsyncs the ledger before it records. Control: nothing to
    record, nothing synced."""
    p = principals
    await p.submit("a")
    calls: list[str] = []
    ledger = Syncs(tmp_path / "authority.ledger", calls)
    await check_restore(p.worker, ledger)
    assert calls == ["sync"] and await seen(p) == 1
    calls.clear()
    await check_restore(p.worker, ledger)
    assert calls == []
