"""The authority ledger: one conformance suite run against each implementation, then the
file ledger's own failure modes (torn tail, corruption, someone else's journal)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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
        with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
            await conn.execute("TRUNCATE accord_ledger.records")  # before: it emptied it
        # Past the guards (the table dropped and made again, as a restore of the ledger's
        # database would): a reader that read acme@2 refuses a ledger without it.
        assert (await ledger.read())["acme"].epoch == 2
        await conn.execute("DROP TABLE accord_ledger.records")
        await ledger.ensure()
        with pytest.raises(LedgerUnavailable, match="went back"):
            await ledger.read()
        assert await PgLedger(empty_pg_dsn).read() == {}  # control: a restarted process
    finally:
        await conn.close()


async def test_accord_migrate_puts_the_pg_ledger_s_table_in_place(
    pg_dsn: str, empty_pg_dsn: str
) -> None:
    """With ACCORD_LEDGER_PG_DSN, `accord migrate` makes the ledger's table and its guards
    (before, nothing outside the tests made it: a deployment's first read failed); again,
    it changes nothing (idempotent)."""
    env = {**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": pg_dsn,
           "ACCORD_LEDGER_PG_DSN": empty_pg_dsn}  # fmt: skip
    for _ in range(2):
        done = await anyio.run_process(
            [sys.executable, "-m", "accord", "migrate"], env=env, check=False
        )
        assert done.returncode == 0, done.stderr.decode()[-1500:]
        assert b"the authority ledger's table is in place" in done.stdout
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
            await conn.execute("TRUNCATE accord_ledger.records")
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
        await FileLedger(ledger.path).append(record("acme", 4))  # a handle that never read it
    with pytest.raises(LedgerUnavailable):
        await ledger.read()
    with pytest.raises(LedgerUnavailable):
        await ledger.append(record("acme", 4))  # the failed read dropped what it trusted


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


def another(ledger: Ledger) -> Ledger:
    """A second handle on the same ledger, as another process would open it."""
    if isinstance(ledger, FileLedger):
        return FileLedger(ledger.path)
    assert isinstance(ledger, PgLedger)
    return PgLedger(ledger._dsn)


async def test_a_reader_that_kept_its_read_sees_every_later_append(any_ledger: Ledger) -> None:
    """A reader keeps what it read and then takes only what was appended since: it gives what
    a whole read gives, after each append by another writer (control: a fresh reader)."""
    reader, writer = any_ledger, another(any_ledger)
    assert await reader.read() == {}
    await writer.append(record("acme", 1, LedgerWhy.OBSERVED), record("beta", 4))
    first = await reader.read()
    assert {t: e.epoch for t, e in first.items()} == {"acme": 1, "beta": 4}
    await writer.append(record("acme", 3, LedgerWhy.RESTRICT))
    await writer.append(record("beta", 2))  # lower: never lowers it
    await writer.append(record("gamma", 1, LedgerWhy.OBSERVED))
    kept = await reader.read()
    assert kept == await another(any_ledger).read()  # the control: read whole
    assert {t: (e.epoch, e.why) for t, e in kept.items()} == {
        "acme": (3, LedgerWhy.RESTRICT),
        "beta": (4, LedgerWhy.ROTATE),
        "gamma": (1, LedgerWhy.OBSERVED),
    }
    assert await reader.read() == kept  # nothing appended: the same
    first["acme"] = first["beta"]  # a caller's copy, not the reader's own
    assert (await reader.read())["acme"].epoch == 3


async def test_a_pg_record_committed_late_below_the_highest_read_is_not_missed(
    empty_pg_dsn: str,
) -> None:
    """Identity values are taken in insert order, not commit order: a record inserted first
    and committed after a later one has a lower seq than one already read. The reader sees it
    (the ledger holds more records than it accounts for: it reads whole). Control: reading
    only after the highest seq read misses it."""
    reader = PgLedger(empty_pg_dsn)
    await reader.ensure()
    await reader.append(record("acme", 1, LedgerWhy.OBSERVED))
    late = await asyncpg.connect(empty_pg_dsn)
    try:
        tx = late.transaction()
        await tx.start()
        await late.execute(
            "INSERT INTO accord_ledger.records (tenant, epoch, frozen, why, at)"
            " VALUES ('acme', 9, true, 'restrict', now())"
        )
        await PgLedger(empty_pg_dsn).append(record("beta", 2))  # a later seq, committed first
        assert {t: e.epoch for t, e in (await reader.read()).items()} == {"acme": 1, "beta": 2}
        highest = await late.fetchval("SELECT max(seq) FROM accord_ledger.records")
        await tx.commit()
        missed = await late.fetch("SELECT * FROM accord_ledger.records WHERE seq > $1", highest)
        assert missed == []  # the control: after the highest seq read, nothing
    finally:
        await late.close()
    assert (await reader.read())["acme"].epoch == 9


async def test_a_file_reader_reads_only_what_was_appended_then_whole_when_replaced(
    tmp_path: Path,
) -> None:
    """A kept reader verifies only the frames appended since its last read: a torn append in
    flight is not read until it is whole, damage among the appended frames is refused as in
    a whole read, and damage to frames it verified before is found by the next whole read (a
    process's start, a new handle's append, its own every verify_every_s), not by a read
    between. A
    file replaced at the path (another inode, or the same inode rewritten) is read whole
    again, and taken when it holds every record the reader read; one that went back (an
    older copy, deleted) is refused."""
    writer = FileLedger(tmp_path / "ledger")
    await writer.append(record("acme", 2), record("beta", 1))
    reader = FileLedger(writer.path)
    assert {t: e.epoch for t, e in (await reader.read()).items()} == {"acme": 2, "beta": 1}

    # A torn append in flight: not read yet; the next append repairs it, and is read.
    with writer.path.open("ab") as f:
        f.write(b"\x40\x00\x00\x00\x12\x34")
    assert (await reader.read())["acme"].epoch == 2
    await writer.append(record("acme", 5))
    assert (await reader.read())["acme"].epoch == 5

    # Damage before the last frame it verified: a whole read refuses; the kept reader, which
    # does not read it again, goes on, and sees the next append (made before the damage),
    # until its next whole read (every verify_every_s: an hour by default).
    hourly = FileLedger(writer.path, verify_every_s=1.0)
    await hourly.read()
    await writer.append(record("beta", 3))
    data = bytearray(writer.path.read_bytes())
    header = 8 + 2 + 2 + len(LEDGER_ID) + 4
    data[header + 8 + 2] ^= 0xFF  # inside the first payload
    writer.path.write_bytes(bytes(data))  # the same inode, rewritten
    assert {t: e.epoch for t, e in (await reader.read()).items()} == {"acme": 5, "beta": 3}
    assert (await hourly.read())["beta"].epoch == 3
    with pytest.raises(LedgerUnavailable, match="corrupt"):
        await FileLedger(writer.path).read()  # a process's start
    with pytest.raises(LedgerUnavailable):
        await FileLedger(writer.path).append(record("acme", 6))  # a new handle's append
    await anyio.sleep(1.1)
    with pytest.raises(LedgerUnavailable, match="corrupt"):
        await hourly.read()  # its next whole read
    data[header + 8 + 2] ^= 0xFF
    writer.path.write_bytes(bytes(data))

    # Damage among the appended frames: refused, as a whole read refuses it.
    before = writer.path.stat().st_size
    await writer.append(record("acme", 6), record("acme", 7))
    whole = bytearray(writer.path.read_bytes())
    good = bytes(whole)
    whole[before + 8 + 2] ^= 0xFF  # inside the first of the two appended frames
    writer.path.write_bytes(bytes(whole))
    with pytest.raises(LedgerUnavailable, match="corrupt"):
        await reader.read()
    writer.path.write_bytes(good)
    assert (await reader.read())["acme"].epoch == 7

    # Replaced by a copy holding more (another inode, then the same inode rewritten
    # longer): read whole again, and taken.
    older = writer.path.read_bytes()
    copy = tmp_path / "copy"
    copy.write_bytes(older)
    await FileLedger(copy).append(*(record(f"t{i}", 1) for i in range(20)))
    copy.replace(writer.path)
    assert set(await reader.read()) == {"acme", "beta"} | {f"t{i}" for i in range(20)}
    longer = FileLedger(tmp_path / "longer")
    longer.path.write_bytes(writer.path.read_bytes())
    await longer.append(*(record(f"u{i}", 2) for i in range(40)))
    writer.path.write_bytes(longer.path.read_bytes())
    assert len(await reader.read()) == 2 + 20 + 40

    # Replaced by an older copy, or deleted: the ledger went back under a running process.
    # Refused (a restored database matching it would pass every later check); a new handle,
    # as a restart makes, takes it as it is (control).
    writer.path.write_bytes(older)
    with pytest.raises(LedgerUnavailable, match="went back"):
        await reader.read()
    assert set(await FileLedger(writer.path).read()) == {"acme", "beta"}
    writer.path.unlink()
    with pytest.raises(LedgerUnavailable, match="went back"):
        await reader.read()
    assert await FileLedger(writer.path).read() == {}


def flip(path: Path, offset: int) -> bytes:
    """Flip one byte of the file at ``path`` in place (the same inode); returns its bytes
    before, to put back."""
    data = bytearray(path.read_bytes())
    before = bytes(data)
    data[offset] ^= 0xFF
    with path.open("r+b") as f:
        f.write(bytes(data))
    return before


def put_back(path: Path, data: bytes) -> None:
    with path.open("r+b") as f:
        f.write(data)
        f.truncate()


async def test_a_file_append_verifies_only_what_follows_its_handles_verified_prefix(
    tmp_path: Path,
) -> None:
    """An append, under the lock every writer waits for, verifies the frames that follow
    the prefix its handle verified last (by a read or an append) within verify_every_s,
    not the whole file. Damage among those frames is refused and a torn tail after them is
    repaired, as a whole read would; damage inside the prefix is found by a whole read: a
    new handle's append, the handle's own append once verify_every_s has passed, and any
    read that finds it (the handle then trusts nothing it verified before)."""
    header = 8 + 2 + 2 + len(LEDGER_ID) + 4
    kept = FileLedger(tmp_path / "ledger", verify_every_s=1.0)
    await kept.append(record("acme", 2), record("beta", 1))
    end = kept.path.stat().st_size
    other = FileLedger(kept.path)
    await other.append(record("acme", 3), record("beta", 2))  # after kept's prefix

    # Damage in the first frame another writer appended (a valid one follows: corrupt, not
    # torn): refused, as a whole read refuses it.
    good = flip(kept.path, end + 8 + 2)
    with pytest.raises(LedgerUnavailable):
        await kept.append(record("acme", 4))
    put_back(kept.path, good)
    # A torn tail a crashed writer left after it: quarantined and cut, then the append.
    with kept.path.open("ab") as f:
        f.write(b"\x40\x00\x00\x00\x12\x34")
    await kept.append(record("acme", 4))
    assert [q async for q in anyio.Path(tmp_path).glob("ledger.quarantine-*")]
    assert {t: e.epoch for t, e in (await FileLedger(kept.path).read()).items()} == {
        "acme": 4,
        "beta": 2,
    }

    # Damage inside the prefix kept verified: its append does not read it again (it goes
    # on, and what it appends is whole), while a new handle's append reads the whole file
    # and refuses it (the control).
    await kept.read()
    good = flip(kept.path, header + 8 + 2)  # inside the first payload
    with pytest.raises(LedgerUnavailable):
        await FileLedger(kept.path).append(record("acme", 5))
    await kept.append(record("acme", 5))
    damaged = kept.path.read_bytes()
    put_back(kept.path, good + damaged[len(good) :])
    assert (await FileLedger(kept.path).read())["acme"].epoch == 5
    # Past verify_every_s the handle reads whole again, and refuses.
    put_back(kept.path, damaged)
    await anyio.sleep(1.1)
    with pytest.raises(LedgerUnavailable):
        await kept.append(record("acme", 6))
    put_back(kept.path, good + damaged[len(good) :])

    # A read that finds damage drops what the handle trusted: its next append reads whole.
    fresh = FileLedger(kept.path)
    await fresh.append(record("acme", 6))
    flip(kept.path, header + 8 + 2)
    with pytest.raises(LedgerUnavailable):
        await fresh.read()
    with pytest.raises(LedgerUnavailable):
        await fresh.append(record("acme", 7))

    # A file replaced at the path (another inode) is verified whole: the same damage,
    # trusted on the old inode, is refused on the new one.
    replaced = FileLedger(tmp_path / "replaced")
    await replaced.append(record("acme", 1), record("beta", 1))
    appender = FileLedger(tmp_path / "replaced")
    await appender.append(record("acme", 2))
    flip(replaced.path, header + 8 + 2)
    (tmp_path / "copy").write_bytes(replaced.path.read_bytes())
    (tmp_path / "copy").replace(replaced.path)
    with pytest.raises(LedgerUnavailable):
        await appender.append(record("acme", 3))


async def test_a_pg_ledger_whose_seqs_were_reused_is_read_whole(empty_pg_dsn: str) -> None:
    """A ledger database restored or truncated takes seqs again: as many records as were read,
    up to the same highest seq, but other ones. The reader sees the record at its highest
    seq changed and reads whole. Control: the count and the records after that seq alone
    say nothing changed."""
    reader = PgLedger(empty_pg_dsn)
    await reader.ensure()
    await reader.append(record("acme", 1, LedgerWhy.OBSERVED), record("acme", 2))
    assert (await reader.read())["acme"].epoch == 2
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        async with conn.transaction():  # past its guard, as a restore of its database
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute("TRUNCATE accord_ledger.records RESTART IDENTITY")
        await PgLedger(empty_pg_dsn).append(record("acme", 2, LedgerWhy.OBSERVED))
        await PgLedger(empty_pg_dsn).append(record("beta", 7, LedgerWhy.RESTRICT))
        # the control: the same count, nothing after the highest seq read
        assert await conn.fetchval("SELECT count(*) FROM accord_ledger.records") == 2
        assert await conn.fetch("SELECT * FROM accord_ledger.records WHERE seq > 2") == []
    finally:
        await conn.close()
    assert {t: e.epoch for t, e in (await reader.read()).items()} == {"acme": 2, "beta": 7}


async def test_a_pg_ledger_that_does_not_add_up_cannot_be_verified(empty_pg_dsn: str) -> None:
    """A record outside the seqs a read takes (seq 0, written by hand): a whole read does not
    add up to the table's count, and the ledger cannot be verified, rather than read as
    empty. Control: the same ledger before it reads."""
    ledger = PgLedger(empty_pg_dsn)
    await ledger.ensure()
    await ledger.append(record("acme", 2))
    assert (await ledger.read())["acme"].epoch == 2
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await conn.execute(
            "INSERT INTO accord_ledger.records (seq, tenant, epoch, frozen, why, at)"
            " OVERRIDING SYSTEM VALUE VALUES (0, 'acme', 9, true, 'restrict', now())"
        )
    finally:
        await conn.close()
    with pytest.raises(LedgerUnavailable, match="do not add up"):
        await ledger.read()
    with pytest.raises(LedgerUnavailable, match="do not add up"):
        await PgLedger(empty_pg_dsn).read()


async def test_an_append_in_flight_when_a_read_finds_damage_leaves_nothing_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read (another thread's) finds damage while an append of the same handle is writing:
    the append keeps no prefix to trust, so the handle's next append verifies the whole file
    and refuses it (before, the append in flight set its prefix after the read cleared it)."""
    ledger = FileLedger(tmp_path / "ledger")
    await ledger.append(record("acme", 2))
    await ledger.read()
    original = Journal.append_payloads

    def meanwhile(self: Journal, payloads: Any) -> list[int]:
        offsets = original(self, payloads)
        flip(ledger.path, offsets[0] + 8 + 2)  # the first frame it wrote; a valid one follows
        with pytest.raises(LedgerUnavailable, match="corrupt"):
            ledger.read_sync()
        return offsets

    monkeypatch.setattr(Journal, "append_payloads", meanwhile)
    await ledger.append(record("acme", 3), record("beta", 1))
    monkeypatch.setattr(Journal, "append_payloads", original)
    with pytest.raises(LedgerUnavailable):
        await ledger.append(record("acme", 4))
