"""The runner journal: one live segment at the journal's path (the framed file, version 2),
written by group commit and rotated, so that what a worker's start reads stays bounded.

Invariant it owns: :meth:`RunnerJournal.write` returns only once its record is durable, never
before; and at every moment the journal's path names one whole segment that holds every effect
record a later start can need: each effect begun whose outcome the database had not recorded
when the segment before it was sealed (with its latest journal outcome), and all written since.

Group commit. Each ``write`` queues its frame, then takes the writer lock; whoever holds the
lock while its own frame is still queued writes *every* queued frame as one group (one
``pwrite`` and one ``fsync``, in a worker thread) and so settles the others' writes too; while
that fsync runs the next group gathers. A write returns after the fsync of its group, so the
effect dispatch that follows an EffectBegin still never runs before the begin is on disk. The
frame format (jobs.framing, version 2) lets a reader tell damage inside the unacknowledged
last group (torn: repaired) from damage before a later group (corrupt: refused).

Rotation. The live segment is sealed when it passes its size bound (or its age bound, with
something written since) and at a worker's start. The next segment begins with the effect
records carried forward: every begin in the live segment (carried into it or written since)
that the caller does not name as recorded in the database (a begin is its ref and its
attempt: ``Begun``), with its latest outcome. It is
written whole, fsynced, locked, renamed over the live one and the directory fsynced before
anything is appended to it (jobs.framing ``Journal.rotate``); that rename removes the sealed
segment. A crash at any moment leaves the old segment or the new one, each complete. A start
reads one segment: what was carried (unresolved work) and what was written since (at most about
the size bound), never the history before it.

Noted records. A record that no step waits on (a claim, a publish or an effect outcome the
database already holds: the database is their truth, the journal their local trace) is
*noted*: queued without waiting, it rides the next group a ``write`` flushes, or the one
:meth:`RunnerJournal.flush_noted` flushes ``linger_s`` after it, or the last one at
:meth:`RunnerJournal.close`. Only a noted record can be lost by a crash (a kill before that
group, a power cut before its fsync), and it is then already in the database. Order on disk
follows the queue within a group, not across the two groups that may be in flight: what needs
an order has it by waiting (an effect's outcome is noted only after its begin was written).

A journal written by 0.2 (a version-1 file) opens and is read as it is; its appends are fsynced
one frame at a time until its first rotation rewrites it as a version-2 segment.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from pydantic import BaseModel

from accord.jobs.errors import JournalBroken, JournalError
from accord.jobs.framing import (
    VERSION_GROUPED,
    Journal,
    JournalScan,
    Repair,
    encode_payload,
)
from accord.jobs.runner.journal_records import (
    Begun,
    EffectBegin,
    EffectOutcome,
    EffectRef,
    RecordType,
    begun_of,
)
from accord.schemas.errors import ConfigError

log = logging.getLogger("accord.worker")

#: Seal the live segment once this much was written to it since it began (and at least as
#: much as it carried, so that carrying costs at most as much again as what was written).
DEFAULT_SEGMENT_BYTES = 8 * 1024 * 1024
#: ... or once it is this old with anything written since, so that the database is asked about
#: its effects while their rows still exist (retention removes resolved ones after days).
DEFAULT_SEGMENT_S = 3600.0
#: A noted record is flushed within about this long when no write carries it first.
DEFAULT_NOTE_LINGER_S = 0.05
_BEGIN = RecordType.EFFECT_BEGIN.value
_EFFECTS = frozenset({_BEGIN, RecordType.EFFECT_OUTCOME.value})


@dataclass(frozen=True, slots=True)
class Rotation:
    """What one rotation did."""

    segment: int  # the new live segment's number
    carried: int  # records carried forward into it
    dropped: int  # records of the sealed segment left behind (removed with it)
    sealed_bytes: int  # the size of the sealed segment


@dataclass(slots=True)
class JournalStats:
    """Process-local counters (a group is one write and one fsync of appended records)."""

    records: int = 0
    groups: int = 0
    rotations: int = 0
    noted: int = 0  # records queued by note() (counted in records once written)


@dataclass(slots=True, eq=False)
class _Queued:
    payload: bytes
    kind: str | None
    begun: Begun | None  # the begin an effect record is or belongs to
    taken: bool = False  # in a group on its way to the disk
    # Set once written and fsynced, or failed; None for a noted record (nobody waits for it).
    done: anyio.Event | None = None
    error: Exception | None = None


def effect_of(record: Mapping[str, Any] | BaseModel) -> tuple[str | None, Begun | None]:
    """(record type, the begin it is or belongs to) of an effect record, else (None, None). A
    malformed effect record is not indexed: the start's check (unrecorded_effects) refuses it
    before any rotation."""
    if isinstance(record, EffectBegin | EffectOutcome):
        return str(record.type), begun_of(record)
    if isinstance(record, BaseModel) or record.get("type") not in _EFFECTS:
        return None, None
    job_id, key, seq = record.get("job_id"), record.get("effect_key"), record.get("seq")
    if isinstance(job_id, int) and isinstance(key, str) and isinstance(seq, int):
        ref = EffectRef(job_id, key, seq)
        return str(record["type"]), Begun(ref, _attempt(record.get("attempt_id")))
    return None, None


def _attempt(value: Any) -> str | None:
    """An attempt id as its model writes it (a canonical UUID), else as it stands; None when
    absent: so a record read back indexes as the model it was written from."""
    if not value:
        return None
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return str(value)


class RunnerJournal:
    """One runner's journal (see the module docstring). Open it with :meth:`open`; a worker
    writes through :meth:`write`, tools and tests may use the blocking :meth:`append`."""

    def __init__(
        self,
        live: Journal,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        segment_s: float = DEFAULT_SEGMENT_S,
    ) -> None:
        if segment_bytes < 1 or not segment_s > 0:
            raise ConfigError("journal segment bounds must be positive", bytes=segment_bytes)
        self._live = live
        self._segment_bytes = segment_bytes
        self._segment_s = segment_s
        # Two groups at most between the queue and the disk: one being written and fsynced,
        # the next already waiting in its thread for the file (Journal's lock), so that a
        # group's write follows the fsync before it without a trip through the event loop.
        self._groups = anyio.Semaphore(2)
        self._rotating = anyio.Lock()
        self._queue: list[_Queued] = []
        self._noted = anyio.Event()  # set while a noted record may wait in the queue
        # Set once a group's write or fsync failed: every later write fails, and the file's
        # state after a failed fsync is unknown, so its owner must stop (and a restart rescan).
        self._broken = anyio.Event()
        self.broken: JournalBroken | None = None
        self.stats = JournalStats()
        self._reset(live.scan)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        runner_id: str,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        segment_s: float = DEFAULT_SEGMENT_S,
    ) -> RunnerJournal:
        """Open (creating it as a version-2 segment) and lock the journal of ``runner_id``.

        Raises as ``Journal.open``: JournalLocked, JournalCorrupt, JournalRunnerMismatch,
        JournalHeaderInvalid; a torn tail opens, and appends wait for :meth:`repair`.
        """
        live = Journal.open(path, runner_id, version=VERSION_GROUPED)
        return cls(live, segment_bytes=segment_bytes, segment_s=segment_s)

    # -- what it holds ------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._live.path

    @property
    def scan(self) -> JournalScan:
        """The live segment as it was opened (or last repaired, or begun by a rotation)."""
        return self._scan

    @property
    def end(self) -> int:
        """The offset just after the last acknowledged record of the live segment."""
        return self._live.end

    @property
    def version(self) -> int:
        return self._live.version

    @property
    def segment(self) -> int:
        return self._live.segment

    def begun(self) -> list[Begun]:
        """The effects begun in the live segment (or carried into it), in journal order: one
        entry per (row, attempt), so two attempts' begins of one ref are two."""
        return list(self._effects)

    @property
    def rotation_due(self) -> bool:
        """Whether what was written since the live segment began passed its size bound and
        what the segment carried, or the segment passed its age bound with anything written."""
        carried = self._base - self._scan.offsets[0] if self._carried else 0
        if self._live.end - self._base >= max(self._segment_bytes, carried):
            return True
        fresh = self._records > self._carried
        return fresh and time.monotonic() - self._since >= self._segment_s

    # -- writing ------------------------------------------------------------------------------

    def append(self, record: Mapping[str, Any] | BaseModel) -> int:
        """Blocking: one record, written and fsynced alone; returns the new end offset. Not
        for use while :meth:`write` or :meth:`rotate` may run (they hold no thread lock)."""
        kind, begun = effect_of(record)
        [offset] = self._live.append_payloads([encode_payload(record)])
        self._note(kind, begun, offset)
        self.stats.records += 1
        self.stats.groups += 1
        return self._live.end

    async def write(self, record: Mapping[str, Any] | BaseModel) -> None:
        """Append ``record``, sharing one write and one fsync with the records other tasks
        write meanwhile (group commit); returns once it is durable.

        A caller cancelled before the call writes nothing; one cancelled during it has its
        record written (or failed) first, then gets the cancellation: either way it learns
        of it before doing what relies on the record (an effect is never dispatched). Raises
        JournalRecordInvalid (this record alone, nothing written), JournalTornTail before a
        repair, JournalBroken when its group's write or fsync failed.
        """
        done = anyio.Event()
        queued = _Queued(encode_payload(record), *effect_of(record), done=done)
        await anyio.lowlevel.checkpoint_if_cancelled()
        with anyio.CancelScope(shield=True):
            self._queue.append(queued)
            async with self._groups:
                if not queued.taken:  # nobody took it into a group yet: take every queued one
                    await self._flush(self._take())
            await done.wait()
        if queued.error is not None:
            error = queued.error
            if isinstance(error, JournalError):
                raise type(error)(**error.fields) from error
            raise JournalBroken(path=str(self.path), detail=str(error)) from error
        await anyio.lowlevel.checkpoint_if_cancelled()

    async def wait_broken(self) -> None:
        """Return once a write or fsync of this journal failed (``broken`` then says how)."""
        await self._broken.wait()

    def note(self, record: Mapping[str, Any] | BaseModel) -> None:
        """Queue ``record`` without waiting for it (see "Noted records" in the module
        docstring): for a record no later step relies on. Raises JournalRecordInvalid (nothing
        queued); a failure to write it later is logged by whoever flushed its group, and the
        journal is then broken for every write after it."""
        self._queue.append(_Queued(encode_payload(record), *effect_of(record)))
        self.stats.noted += 1
        self._noted.set()

    async def flush_noted(self, linger_s: float = DEFAULT_NOTE_LINGER_S) -> None:
        """Until cancelled: write what was noted and is still queued ``linger_s`` after it was
        noted (one group), and once more when cancelled. A worker runs it beside its jobs;
        under load the jobs' own writes carry noted records first and this finds nothing."""
        try:
            while True:
                await self._noted.wait()
                await anyio.sleep(linger_s)
                self._noted = anyio.Event()
                await self._flush_queued()
        finally:
            await self._flush_queued()

    async def _flush_queued(self) -> None:
        with anyio.CancelScope(shield=True):
            async with self._groups:
                batch = self._take()
                if batch:
                    await self._flush(batch)
        failed = next((entry.error for entry in batch if entry.error is not None), None)
        if failed is not None:
            log.error("journal %s: noted records not written: %s", self.path, failed)

    def _take(self) -> list[_Queued]:
        """Every queued record, as the next group (the caller holds a group slot)."""
        batch, self._queue = self._queue, []
        for entry in batch:
            entry.taken = True
        return batch

    async def _flush(self, batch: list[_Queued]) -> None:
        """Write ``batch`` as one group (the caller holds a group slot) and settle each entry.

        Two groups may be in threads at once; Journal's lock writes and fsyncs one, then the
        other. Their order on disk is free: no record in one waits on a record in the other
        (a writer queues its next record only once its last one is settled)."""
        payloads = [queued.payload for queued in batch]
        try:
            offsets = await anyio.to_thread.run_sync(self._live.append_payloads, payloads)
        except Exception as exc:  # noqa: BLE001 - handed to each writer of the group
            self._break(exc)
            for queued in batch:
                queued.error = exc
                if queued.done is not None:
                    queued.done.set()
            return
        for queued, offset in zip(batch, offsets, strict=True):
            self._note(queued.kind, queued.begun, offset)
            if queued.done is not None:
                queued.done.set()
        self.stats.records += len(batch)
        self.stats.groups += 1

    def _break(self, exc: Exception) -> None:
        """From here on the journal is broken (``broken`` says how: the first failure), and
        whoever waits on it (the worker's watch) learns so."""
        if self.broken is None:
            self.broken = (
                exc
                if isinstance(exc, JournalBroken)
                else JournalBroken(path=str(self.path), detail=str(exc))
            )
            self._broken.set()

    # -- rotation -----------------------------------------------------------------------------

    async def rotate(self, recorded: Collection[Begun]) -> Rotation | None:
        """Seal the live segment and begin the next one with every effect begun in it (or
        carried into it) that is not in ``recorded``, each with its latest outcome.

        ``recorded`` names the begins whose outcome the database holds (anything but
        pending, on the row their attempt began); whatever it omits is carried. Writes wait
        meanwhile. None, changing nothing, when no record would be left behind (a version-1
        journal is always rewritten). Raises OSError before the switch (the live segment
        stays as it was), JournalBroken after it.
        """
        rotation, recorded = None, frozenset(recorded)
        with anyio.CancelScope(shield=True):
            # Both group slots: no group is on its way to the disk while the segment changes.
            async with self._rotating, self._groups, self._groups:
                keep = [(b, at) for b, at in self._effects.items() if b not in recorded]
                carried = sum(1 if outcome < 0 else 2 for _, (_, outcome) in keep)
                if self.version != VERSION_GROUPED or carried < self._records:
                    try:
                        rotation = await anyio.to_thread.run_sync(self._seal, keep)
                    except JournalBroken as exc:  # after the switch: no segment to write to
                        self._break(exc)
                        raise
        return rotation

    def _seal(self, keep: list[tuple[Begun, tuple[int, int]]]) -> Rotation:
        live = self._live
        payloads: list[bytes] = []
        for _, (begin, outcome) in keep:
            payloads.append(live.read_payload(begin))
            if outcome >= 0:
                payloads.append(live.read_payload(outcome))
        sealed, records = live.end, self._records
        self._live = live.rotate(payloads)  # the records are copied byte for byte
        self._reset(self._live.scan)
        self.stats.rotations += 1
        return Rotation(self._live.segment, len(payloads), records - len(payloads), sealed)

    def _reset(self, scan: JournalScan) -> None:
        """Index the live segment as ``scan`` shows it."""
        self._scan = scan
        self._effects: dict[Begun, tuple[int, int]] = {}  # -> (begin, outcome or -1)
        self._records = 0
        for offset, record in zip(scan.offsets, scan.records, strict=True):
            self._note(*effect_of(record), offset)
        self._carried = min(scan.carried, len(scan.offsets))
        fresh = scan.offsets[self._carried :]
        self._base = fresh[0] if fresh else scan.end
        self._since = time.monotonic()

    def _note(self, kind: str | None, begun: Begun | None, offset: int) -> None:
        self._records += 1
        if begun is None:
            return
        if kind == _BEGIN:
            self._effects.setdefault(begun, (offset, -1))  # a begin written twice counts once
            return
        entry = self._effects.get(begun)
        # An outcome counts after its own attempt's begin only (as unrecorded_effects).
        if entry is not None:
            self._effects[begun] = (entry[0], offset)

    # -- repair and close -----------------------------------------------------------------------

    def repair(self) -> Repair | None:
        """Quarantine and cut a torn tail (``Journal.repair``); None when already clean."""
        repair = self._live.repair()
        self._reset(self._live.scan)
        return repair

    def close(self) -> None:
        """Write what is still noted (blocking: no group is in flight once the worker's tasks
        ended), then release the file."""
        queued = self._take()
        try:
            if queued:
                self._live.append_payloads([entry.payload for entry in queued])
                self.stats.records += len(queued)
                self.stats.groups += 1
        except JournalError as exc:
            log.error("journal %s: noted records not written at close: %s", self.path, exc)
        finally:
            self._live.close()

    def __enter__(self) -> RunnerJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
