"""The authority ledger: every tenant epoch and restriction, kept outside the database snapshot.

Invariant it owns: a record :meth:`Ledger.append` returned for is durable (fsynced, or
committed in *another* database) and is returned by every later :meth:`Ledger.read`; records
are never rewritten or removed. The ledger is read as "the highest epoch each tenant ever
had"; a database whose epoch is behind it was restored (see jobs.authority).

Two implementations of one small interface, run through one shared test suite:

* :class:`FileLedger` (default) the runner journal format (jobs.framing: framed,
  CRC-32C, ``flock``, ``fsync``) on durable storage. Writers open, append and close under the
  journal's exclusive lock (retried briefly when another process holds it); readers scan the
  verified prefix without locking. A torn tail is an append that never returned, hence an
  intent whose database change never ran: it is quarantined and truncated by the next
  writer. A corrupt ledger is fatal (LedgerUnavailable): authority cannot be verified.
* :class:`PgLedger` a table in a *separate* PostgreSQL database, for several hosts. Pointing
  it at the database it guards defeats it: a restore would roll the ledger back too.

Both keep what they have read: a ledger is read whole once, then each read (the authority
watch's, every few seconds in every worker) takes only the records appended since and folds
them into the summary it kept. Records are never rewritten or removed, and the fold keeps
each tenant's highest epoch in append order, so the summary is the one a whole read would
give; a check's cost then follows the authority changes since the last one, not every change
ever made (1.1 to 1.6 s of CPU per read at 100,000 records, read whole). A file ledger's
handle verifies the whole file again every hour; PostgreSQL counts the table at every read
(on the server: no row is sent). A file ledger's append, under the lock every writer
waits for, verifies likewise only what follows the prefix its handle verified last (read
or written), not the whole file each time (0.5 s at 100,000 records).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
import asyncpg
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accord.jobs import repair_sql
from accord.jobs.errors import JournalError, JournalLocked, LedgerUnavailable
from accord.jobs.framing import (
    VERSION,
    Journal,
    JournalScan,
    Tail,
    Verified,
    encode_payload,
    make_dirs,
    read_after,
    scan_bytes,
    scan_frames,
)
from accord.schemas.db import connect
from accord.schemas.errors import ServiceUnavailable

#: The journal header's runner id for a ledger file (a worker journal is refused as a ledger).
LEDGER_ID = "accord-authority-ledger"
#: How often a file ledger's reader verifies the whole file again (damage to a record it
#: verified before is found then; reads in between verify what was appended).
WHOLE_READ_EVERY_S = 3600.0


class LedgerWhy(StrEnum):
    """Why a ledger record was written."""

    ROTATE = "rotate"  # an epoch rotation
    RESTRICT = "restrict"  # a restriction (epoch + 1, frozen)
    LIFT = "lift"  # a restriction lifted (epoch + 1, not frozen)
    REPAIR_ADVANCE = "repair_advance"  # a repair principal advanced past the ledger
    OBSERVED = "observed"  # the database was ahead (a crash between DB and ledger, or setup)


class LedgerRecord(BaseModel):
    """One authority change of one tenant, as the ledger stores it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["authority"] = "authority"
    tenant: str = Field(min_length=1)
    epoch: int = Field(ge=1)
    frozen: bool
    why: LedgerWhy
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    who: str | None = None
    evidence: str | None = None


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A tenant's highest ledger epoch and the record that set it."""

    tenant: str
    epoch: int
    frozen: bool
    why: LedgerWhy
    at: datetime


def summarize(
    records: Iterable[LedgerRecord], entries: dict[str, LedgerEntry] | None = None
) -> dict[str, LedgerEntry]:
    """Each tenant's highest epoch (the first record to reach it wins a tie); with
    ``entries``, the records are folded into that summary of the records before them."""
    entries = {} if entries is None else entries
    for r in records:
        seen = entries.get(r.tenant)
        if seen is None or r.epoch > seen.epoch:
            entries[r.tenant] = LedgerEntry(r.tenant, r.epoch, r.frozen, r.why, r.at)
    return entries


def _parse(raw: Mapping[str, Any], where: str) -> LedgerRecord:
    try:
        return LedgerRecord.model_validate(raw)
    except ValidationError as exc:
        raise LedgerUnavailable("a ledger record is not an authority record", at=where) from exc


class Ledger(Protocol):
    """Where authority is recorded outside the database snapshot."""

    async def read(self) -> dict[str, LedgerEntry]:
        """Each tenant's highest epoch. Raises LedgerUnavailable if it cannot be verified."""
        ...

    async def append(self, *records: LedgerRecord) -> None:
        """Make ``records`` durable, in order, before returning. Raises LedgerUnavailable."""
        ...

    async def sync(self) -> None:
        """Make every record this handle has read durable (another writer's append may be
        readable before its own fsync returns). Raises LedgerUnavailable."""
        ...


@dataclass(slots=True)
class _Known:
    """What a file ledger's reader has verified: the file (device, inode), where its verified
    prefix ends, the bytes just before that end (the last frame, or the header), how many
    records it holds, and their summary."""

    file: tuple[int, int]
    end: int
    mark: bytes
    count: int
    entries: dict[str, LedgerEntry]
    verified_at: float  # time.monotonic() of the whole read it began with


#: A prefix this handle verified, with the time.monotonic() of the whole read it began with.
_Trusted = tuple[Verified, float]


class FileLedger:
    """The ledger as a runner-journal file on durable storage (one host)."""

    def __init__(
        self,
        path: str | Path,
        *,
        lock_timeout_s: float = 10.0,
        verify_every_s: float = WHOLE_READ_EVERY_S,
    ) -> None:
        self.path = Path(path)
        self._lock_timeout_s = lock_timeout_s
        self._verify_every_s = verify_every_s
        self._dir_made = False  # its directory made (and committed) once, not per append
        self._known: _Known | None = None
        self._reading = threading.Lock()  # reads run on worker threads
        self._written: _Trusted | None = None  # the prefix its last append left verified
        # Raised by each read that finds damage: an append begun before it keeps no prefix.
        self._distrusted = 0
        self._seen = _Seen(str(self.path))  # the highest epochs this handle ever read

    async def read(self) -> dict[str, LedgerEntry]:
        return await anyio.to_thread.run_sync(self.read_sync)

    async def append(self, *records: LedgerRecord) -> None:
        await anyio.to_thread.run_sync(self.append_sync, *records)

    async def sync(self) -> None:
        await anyio.to_thread.run_sync(self.sync_sync)

    def sync_sync(self) -> None:
        """fsync the ledger file (any descriptor of it flushes its data): a frame another
        writer appended is readable before that writer's own fsync returns, and what a check
        records as seen must survive a power cut (a torn unacknowledged tail is not a record)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # nothing read, nothing to keep
        except OSError as exc:
            raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
        try:
            os.fsync(fd)
        except OSError as exc:
            raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
        finally:
            os.close(fd)

    def records(self) -> list[LedgerRecord]:
        """Every verified record, in append order, read whole (blocking; a torn tail is not a
        record)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
        return [self._parse(raw, i) for i, raw in enumerate(self._verified(data).records)]

    def read_sync(self) -> dict[str, LedgerEntry]:
        """Each tenant's highest epoch. The first read verifies the whole file; later ones
        verify only the frames appended since, once the bytes before them are still the
        frame (or header) they verified last: a file replaced or cut short is read whole
        again. A damaged frame among the appended ones is judged as in a whole read (a torn
        last append is not read yet; a corrupt ledger cannot be verified). Damage to records
        verified earlier is found by the next whole read: every ``verify_every_s`` (an hour
        by default), a process's start, and an append by a handle that has not verified the
        file within that time."""
        with self._reading:
            try:
                with self.path.open("rb") as f:
                    known = self._refresh(f)
            except FileNotFoundError:
                self._known = None
                return self._seen.keep({})
            except OSError as exc:
                raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
            except LedgerUnavailable:
                # What this handle verified before is no longer trusted: its next append
                # verifies the whole file.
                self._known, self._written = None, None
                self._distrusted += 1
                raise
            return self._seen.keep(dict(known.entries))

    def _refresh(self, f: Any) -> _Known:
        st = os.fstat(f.fileno())
        file, known, now = (st.st_dev, st.st_ino), self._known, time.monotonic()
        if known is not None and now - known.verified_at < self._verify_every_s:
            appended = read_after(f.fileno(), Verified(known.file, known.end, known.mark))
            if appended is not None:
                self._fold(known, appended)
                return known
        f.seek(0)
        data = f.read()
        scan = self._verified(data)
        last = scan.offsets[-1] if scan.records else 0
        entries = summarize(self._parse(raw, i) for i, raw in enumerate(scan.records))
        mark = data[last : scan.end]
        self._known = _Known(file, scan.end, mark, len(scan.records), entries, now)
        return self._known

    def _fold(self, known: _Known, appended: bytes) -> None:
        """Verify the frames appended after ``known`` and fold their records into it."""
        frames = scan_frames(appended)
        if frames.tail is Tail.CORRUPT:
            raise LedgerUnavailable(
                "the ledger is corrupt", path=str(self.path), offset=known.end + frames.end
            )
        if not frames.records:
            return
        records = [self._parse(raw, known.count + i) for i, raw in enumerate(frames.records)]
        summarize(records, known.entries)
        known.mark = appended[frames.offsets[-1] : frames.end]
        known.end += frames.end
        known.count += len(records)

    def _verified(self, data: bytes) -> JournalScan:
        """The whole file's scan, refused unless it is an authority ledger's and not corrupt."""
        try:
            scan = scan_bytes(data)
        except JournalError as exc:
            raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
        if scan.runner_id != LEDGER_ID or scan.version != VERSION:
            raise LedgerUnavailable("not an authority ledger", path=str(self.path))
        if scan.tail is Tail.CORRUPT:
            raise LedgerUnavailable("the ledger is corrupt", path=str(self.path), offset=scan.end)
        return scan

    def _parse(self, raw: Mapping[str, Any], index: int) -> LedgerRecord:
        return _parse(raw, f"{self.path}#{index}")

    def append_sync(self, *records: LedgerRecord) -> None:
        """Open under the exclusive lock (retrying while another writer holds it), verify
        what follows the prefix this handle verified last (read or written) within
        ``verify_every_s``, or else the whole file, repair a torn tail (an unacknowledged
        intent), append with fsync, close."""
        if not records:
            return
        payloads = [encode_payload(r) for r in records]
        if not self._dir_made:
            try:
                make_dirs(self.path.parent)
            except OSError as exc:
                raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
            self._dir_made = True
        trusted, at = self._trusted()
        distrusted = self._distrusted
        deadline = time.monotonic() + self._lock_timeout_s
        while True:
            try:
                journal = Journal.open(self.path, LEDGER_ID, verified=trusted)
                break
            except JournalLocked as exc:
                if time.monotonic() >= deadline:
                    raise LedgerUnavailable(
                        "the ledger stayed locked", path=str(self.path)
                    ) from exc
                time.sleep(0.005)
            except (OSError, JournalError) as exc:
                raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
        try:
            with journal:
                if journal.scan.after == 0:  # the trusted prefix did not hold: read whole
                    at = time.monotonic()
                if journal.scan.tail is not Tail.CLEAN:
                    journal.repair()
                offsets = journal.append_payloads(payloads)
                if self._distrusted == distrusted:  # no read found damage meanwhile
                    self._written = (journal.verified(offsets[-1]), at)
        except (OSError, JournalError) as exc:
            raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc

    def _trusted(self) -> tuple[Verified | None, float]:
        """The furthest prefix this handle verified (by a read or an append) whose whole
        read is younger than ``verify_every_s``, with that read's time; (None, now) if none."""
        now = time.monotonic()
        with self._reading:
            k = self._known
            seen = [] if k is None else [(Verified(k.file, k.end, k.mark), k.verified_at)]
        if self._written is not None:
            seen.append(self._written)
        fresh = [t for t in seen if now - t[1] < self._verify_every_s]
        return max(fresh, key=lambda t: t[0].end, default=(None, now))


@dataclass(frozen=True, slots=True)
class _PgKnown:
    """What a PostgreSQL ledger's reader has read: the highest seq, that record's (tenant,
    epoch, at), how many records, their summary (never changed: each read folds into a
    copy)."""

    seq: int
    mark: tuple[Any, ...] | None
    count: int
    entries: dict[str, LedgerEntry]


_PG_NOTHING_READ = _PgKnown(0, None, 0, {})


class PgLedger:
    """The ledger as an append-only table in a separate PostgreSQL database (several hosts)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._known = _PG_NOTHING_READ
        self._seen = _Seen("the ledger database")

    async def sync(self) -> None:
        """Nothing: a read sees committed records only, durable by then."""

    async def ensure(self) -> None:
        """Create the ledger's schema and table if missing (idempotent)."""
        conn = await connect(self._dsn)
        try:
            await conn.execute(repair_sql.LEDGER_ENSURE)
        finally:
            await conn.close()

    async def read(self) -> dict[str, LedgerEntry]:
        """Each tenant's highest epoch, from the records after those read before. When they
        do not account for the ledger (it holds more records than were read plus those: one
        committed late, below the highest seq read; or fewer; or the record at that seq is
        another: seqs reused by a restore or a truncation), it is read whole again; a whole
        read that does not add up either cannot be verified (LedgerUnavailable)."""
        try:
            conn = await connect(self._dsn)
            try:
                known = self._known
                after = await self._after(conn, known)
                if after is None:
                    known = _PG_NOTHING_READ
                    after = await self._after(conn, known)
            finally:
                await conn.close()
        except (ServiceUnavailable, asyncpg.PostgresError) as exc:
            raise LedgerUnavailable("the ledger database did not answer", detail=str(exc)) from exc
        if after is None:
            raise LedgerUnavailable("the ledger's records do not add up to its count")
        if after:
            records = [_parse(r, f"ledger row {r['seq']}") for r in after]
            entries = summarize(records, dict(known.entries))
            last = after[-1]
            mark = (last["tenant"], last["epoch"], last["at"])
            known = _PgKnown(last["seq"], mark, known.count + len(after), entries)
        entries = self._seen.keep(dict(known.entries))
        self._known = known
        return entries

    @staticmethod
    async def _after(conn: Any, known: _PgKnown) -> list[dict[str, Any]] | None:
        """The records after ``known``, or None when they do not account for the ledger."""
        rows = await conn.fetch(repair_sql.LEDGER_READ_AFTER, known.seq)
        head = rows[0]
        if known.mark != (None if known.seq == 0 else _mark(head)):
            return None
        after = [dict(row) for row in rows if row["seq"] is not None]
        return after if head["total"] == known.count + len(after) else None

    async def append(self, *records: LedgerRecord) -> None:
        rows = [(r.tenant, r.epoch, r.frozen, str(r.why), r.at, r.who, r.evidence) for r in records]
        try:
            # synchronous_commit on: the append returns only once the commit is durable.
            conn = await connect(self._dsn, server_settings={"synchronous_commit": "on"})
            try:
                async with conn.transaction():
                    await conn.executemany(repair_sql.LEDGER_APPEND, rows)
            finally:
                await conn.close()
        except (ServiceUnavailable, asyncpg.PostgresError) as exc:
            raise LedgerUnavailable("the ledger database refused", detail=str(exc)) from exc


class _Seen:
    """The highest epoch a ledger handle ever read for each tenant. A read that shows less
    (a tenant missing, or at a lower epoch) is a ledger that went back under a running
    process: rolled back, replaced by an older copy, truncated or deleted. It is refused
    (LedgerUnavailable, which ends the authority watch and so the process, one line naming
    it), never taken as a new ledger: a database restored to match it would pass every
    later check. A restarted process refuses it too, by what the database saw in the
    ledger (jobs.tenants.ledger_epoch, migration 0052; jobs.authority)."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._epochs: dict[str, int] = {}

    def keep(self, entries: dict[str, LedgerEntry]) -> dict[str, LedgerEntry]:
        back = sorted(
            tenant
            for tenant, epoch in self._epochs.items()
            if tenant not in entries or entries[tenant].epoch < epoch
        )
        if back:
            raise LedgerUnavailable(
                "the ledger went back: it lacks records this process read before (rolled"
                " back, replaced by an older copy, truncated or deleted); restore it"
                " (docs/authority.md: a ledger no copy of which survives)",
                where=self._where,
                tenants=back[:10],
            )
        self._epochs.update((tenant, entry.epoch) for tenant, entry in entries.items())
        return entries


def _mark(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return (row["mark_tenant"], row["mark_epoch"], row["mark_at"])
