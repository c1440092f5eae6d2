"""The authority ledger: one conformance suite run against each implementation, then the
file ledger's own failure modes (torn tail, corruption, someone else's journal)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import pytest

from accord.jobs import FileLedger, Ledger, LedgerRecord, LedgerUnavailable, LedgerWhy, PgLedger
from accord.jobs.framing import Journal
from accord.jobs.ledger import LEDGER_ID


def record(tenant: str, epoch: int, why: LedgerWhy = LedgerWhy.ROTATE) -> LedgerRecord:
    return LedgerRecord(tenant=tenant, epoch=epoch, frozen=why is LedgerWhy.RESTRICT, why=why)


@pytest.fixture(params=["file", "pg"])
async def any_ledger(
    request: pytest.FixtureRequest, tmp_path: Path, empty_pg_dsn: str
) -> AsyncIterator[Ledger]:
    if request.param == "file":
        yield FileLedger(tmp_path / "ledger")
        return
    # A database of its own, never the one it guards.
    ledger = PgLedger(empty_pg_dsn)
    await ledger.ensure()
    await ledger.ensure()  # idempotent
    yield ledger


async def test_an_empty_ledger_knows_no_tenant(any_ledger: Ledger) -> None:
    assert await any_ledger.read() == {}


async def test_the_highest_epoch_per_tenant_wins(any_ledger: Ledger) -> None:
    await any_ledger.append(record("acme", 1, LedgerWhy.OBSERVED))
    await any_ledger.append(record("acme", 3, LedgerWhy.RESTRICT))
    await any_ledger.append(record("acme", 2))  # a late, lower record never lowers it
    await any_ledger.append(record("beta", 7))
    entries = await any_ledger.read()
    assert {t: (e.epoch, e.frozen, e.why) for t, e in entries.items()} == {
        "acme": (3, True, LedgerWhy.RESTRICT),
        "beta": (7, False, LedgerWhy.ROTATE),
    }


async def test_concurrent_appends_are_all_kept(any_ledger: Ledger) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(1, 21):
            tg.start_soon(any_ledger.append, record(f"t{i % 4}", i))
    entries = await any_ledger.read()
    assert {t: e.epoch for t, e in entries.items()} == {"t0": 20, "t1": 17, "t2": 18, "t3": 19}


async def test_the_pg_ledger_is_append_only(empty_pg_dsn: str) -> None:
    ledger = PgLedger(empty_pg_dsn)
    await ledger.ensure()
    await ledger.append(record("acme", 2))
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
            await conn.execute("UPDATE accord_ledger.records SET epoch = 1")
        with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
            await conn.execute("DELETE FROM accord_ledger.records")
    finally:
        await conn.close()


async def test_an_unreachable_pg_ledger_cannot_verify() -> None:
    with pytest.raises(LedgerUnavailable):
        await PgLedger("postgresql://postgres@127.0.0.1:1/none").read()


async def test_a_torn_tail_is_an_intent_that_never_returned(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path / "ledger")
    await ledger.append(record("acme", 2))
    with ledger.path.open("ab") as f:  # a crash in the middle of the next append
        f.write(b"\x40\x00\x00\x00\x12\x34")
    assert (await ledger.read())["acme"].epoch == 2  # the verified prefix
    await ledger.append(record("acme", 3))  # the next writer quarantines and truncates it
    assert (await ledger.read())["acme"].epoch == 3
    assert [q async for q in anyio.Path(tmp_path).glob("ledger.quarantine-*")]


async def test_a_corrupt_ledger_refuses_to_verify(tmp_path: Path) -> None:
    ledger = FileLedger(tmp_path / "ledger")
    await ledger.append(record("acme", 2))
    await ledger.append(record("acme", 3))
    data = bytearray(ledger.path.read_bytes())
    header = 8 + 2 + 2 + len(LEDGER_ID) + 4
    data[header + 8 + 2] ^= 0xFF  # inside the first payload, with a valid frame after it
    ledger.path.write_bytes(bytes(data))
    with pytest.raises(LedgerUnavailable):
        await ledger.read()
    with pytest.raises(LedgerUnavailable):
        await ledger.append(record("acme", 4))


async def test_a_worker_journal_is_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    Journal.open(path, "worker-1").close()
    with pytest.raises(LedgerUnavailable, match="not an authority ledger"):
        await FileLedger(path).read()
    with pytest.raises(LedgerUnavailable):
        await FileLedger(path).append(record("acme", 2))


async def test_a_ledger_whose_directory_cannot_be_made_is_unavailable(tmp_path: Path) -> None:
    """Its directory cannot be made (a file stands where it should be): LedgerUnavailable
    naming the path, as for any ledger the process cannot write, not a bare OSError.
    Control: the same ledger once the path is a directory appends."""
    (tmp_path / "state").write_bytes(b"")
    ledger = FileLedger(tmp_path / "state" / "authority" / "ledger")
    with pytest.raises(LedgerUnavailable) as info:
        await ledger.append(record("acme", 2))
    assert info.value.fields["path"] == str(ledger.path)
    (tmp_path / "state").unlink()
    await ledger.append(record("acme", 2))
    assert (await ledger.read())["acme"].epoch == 2
