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
"""

from __future__ import annotations

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
from accord.jobs.framing import Journal, Tail, make_dirs, scan_journal
from accord.schemas.db import connect
from accord.schemas.errors import ServiceUnavailable

#: The journal header's runner id for a ledger file (a worker journal is refused as a ledger).
LEDGER_ID = "accord-authority-ledger"


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


def summarize(records: Iterable[LedgerRecord]) -> dict[str, LedgerEntry]:
    """Each tenant's highest epoch (the first record to reach it wins a tie)."""
    entries: dict[str, LedgerEntry] = {}
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


class FileLedger:
    """The ledger as a runner-journal file on durable storage (one host)."""

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        self._lock_timeout_s = lock_timeout_s
        self._dir_made = False  # its directory made (and committed) once, not per append

    async def read(self) -> dict[str, LedgerEntry]:
        return await anyio.to_thread.run_sync(self.read_sync)

    async def append(self, *records: LedgerRecord) -> None:
        await anyio.to_thread.run_sync(self.append_sync, *records)

    def records(self) -> list[LedgerRecord]:
        """Every verified record, in append order (blocking; a torn tail is not a record)."""
        if not self.path.exists():
            return []
        try:
            scan = scan_journal(self.path)
        except (OSError, JournalError) as exc:
            raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
        if scan.runner_id != LEDGER_ID:
            raise LedgerUnavailable("not an authority ledger", path=str(self.path))
        if scan.tail is Tail.CORRUPT:
            raise LedgerUnavailable("the ledger is corrupt", path=str(self.path), offset=scan.end)
        return [_parse(raw, f"{self.path}#{i}") for i, raw in enumerate(scan.records)]

    def read_sync(self) -> dict[str, LedgerEntry]:
        return summarize(self.records())

    def append_sync(self, *records: LedgerRecord) -> None:
        """Open under the exclusive lock (retrying while another writer holds it), repair a
        torn tail (an unacknowledged intent), append with fsync, close."""
        if not self._dir_made:
            try:
                make_dirs(self.path.parent)
            except OSError as exc:
                raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc
            self._dir_made = True
        deadline = time.monotonic() + self._lock_timeout_s
        while True:
            try:
                journal = Journal.open(self.path, LEDGER_ID)
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
                if journal.scan.tail is not Tail.CLEAN:
                    journal.repair()
                for record in records:
                    journal.append(record)
        except (OSError, JournalError) as exc:
            raise LedgerUnavailable(path=str(self.path), detail=str(exc)) from exc


class PgLedger:
    """The ledger as an append-only table in a separate PostgreSQL database (several hosts)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn

    async def ensure(self) -> None:
        """Create the ledger's schema and table if missing (idempotent)."""
        conn = await connect(self._dsn)
        try:
            await conn.execute(repair_sql.LEDGER_ENSURE)
        finally:
            await conn.close()

    async def read(self) -> dict[str, LedgerEntry]:
        try:
            conn = await connect(self._dsn)
            try:
                rows = await conn.fetch(repair_sql.LEDGER_READ)
            finally:
                await conn.close()
        except (ServiceUnavailable, asyncpg.PostgresError) as exc:
            raise LedgerUnavailable("the ledger database did not answer", detail=str(exc)) from exc
        return summarize(_parse(dict(row), "ledger row") for row in rows)

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
