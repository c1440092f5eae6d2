"""The framed file: an append-only, checksummed, fsynced local log (the runner journal's format,
and the file authority ledger's: jobs.runner and jobs.ledger both build on it).

Invariant it owns: every record :meth:`Journal.append` returned for is on disk and is returned,
in order, by every later scan; bytes after the verified prefix are never dropped unless they are
a *torn* tail, and then only after a copy of them is fsynced to a quarantine file.

Format (integers little-endian)::

    header  magic "ACCJRNL\\0" | version u16 | runner id length u16 | runner id (UTF-8)
            | CRC-32C u32 of everything before it
    frame   length u32 | CRC-32C u32 of (the 4 length bytes + payload) | payload (JSON object)

The header is written to a temporary file, fsynced and hard-linked into place (then the
directory is fsynced), so a journal either exists with a whole header or not at all.

Appends are serialised and each is fsynced before the next is written, so at most one frame
is ever in flight: a crash or power cut can only tear the *last* frame. The reader therefore
classifies what follows the verified prefix as

* ``clean``   nothing follows;
* ``torn``    a short frame, a zero-filled tail, a length past end-of-file or a bad CRC with no
              valid frame anywhere after it: repairable (quarantine, then truncate);
* ``corrupt`` a bad frame followed by at least one valid frame, or a frame whose CRC holds but
              whose payload is not a JSON object: fatal, reported with its offset, never truncated.

A CRC detects accidents, not malice. The journal is evidence for reconciliation, not a
replacement for the database.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import google_crc32c
from pydantic import BaseModel

from accord.jobs.errors import (
    JournalBroken,
    JournalCorrupt,
    JournalHeaderInvalid,
    JournalLocked,
    JournalRecordInvalid,
    JournalRunnerMismatch,
    JournalTornTail,
)

MAGIC = b"ACCJRNL\x00"
VERSION = 1
MAX_RUNNER_ID_BYTES = 255
# The smallest payload is "{}"; anything above MAX_PAYLOAD is an impossible length.
MIN_PAYLOAD = 2
MAX_PAYLOAD = 1 << 20
_HEADER = struct.Struct("<8sHH")
_FRAME = struct.Struct("<II")
_U32 = struct.Struct("<I")


class Tail(StrEnum):
    """What follows the verified prefix."""

    CLEAN = "clean"
    TORN = "torn"
    CORRUPT = "corrupt"


class Defect(StrEnum):
    """Why the verified prefix ended where it did (``none`` for a clean journal)."""

    NONE = "none"
    SHORT_FRAME = "short_frame"
    ZERO_FILL = "zero_fill"
    BAD_LENGTH = "bad_length"
    LENGTH_PAST_EOF = "length_past_eof"
    BAD_CRC = "bad_crc"
    BAD_PAYLOAD = "bad_payload"


@dataclass(frozen=True, slots=True)
class JournalScan:
    """The verified prefix of a journal and the classification of what follows it."""

    runner_id: str
    records: tuple[dict[str, Any], ...]
    # Byte offset where the verified prefix ends (where a repair truncates, where appends go).
    end: int
    size: int
    tail: Tail
    defect: Defect

    @property
    def tail_bytes(self) -> int:
        return self.size - self.end


@dataclass(frozen=True, slots=True)
class Repair:
    """What a repair did: the tail at ``offset`` (``length`` bytes) now lives in ``quarantine``."""

    offset: int
    length: int
    defect: Defect
    quarantine: Path


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, hardware-accelerated where google-crc32c can."""
    return int(google_crc32c.value(data))


def encode_header(runner_id: str) -> bytes:
    raw = runner_id.encode("utf-8")
    if not raw or len(raw) > MAX_RUNNER_ID_BYTES:
        raise JournalHeaderInvalid("runner id must be 1-255 bytes of UTF-8", runner_id=runner_id)
    head = _HEADER.pack(MAGIC, VERSION, len(raw)) + raw
    return head + _U32.pack(crc32c(head))


def encode_frame(record: Mapping[str, Any] | BaseModel) -> bytes:
    """One frame for ``record`` (a JSON object, or a journal record model)."""
    if isinstance(record, BaseModel):
        record = record.model_dump(mode="json")
    if not isinstance(record, Mapping):
        raise JournalRecordInvalid("a journal record must be a JSON object")
    try:
        payload = json.dumps(
            record, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise JournalRecordInvalid(detail=str(exc)) from exc
    if len(payload) > MAX_PAYLOAD:
        raise JournalRecordInvalid(size=len(payload), limit=MAX_PAYLOAD)
    length = _U32.pack(len(payload))
    return length + _U32.pack(crc32c(length + payload)) + payload


def _parse_header(data: bytes) -> tuple[str, int]:
    if len(data) < _HEADER.size:
        raise JournalHeaderInvalid(detail="short header", size=len(data))
    magic, version, n = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise JournalHeaderInvalid(detail="bad magic")
    if version != VERSION:
        raise JournalHeaderInvalid(detail="unsupported version", version=version)
    end = _HEADER.size + n
    if len(data) < end + _U32.size:
        raise JournalHeaderInvalid(detail="short header", size=len(data))
    if _U32.unpack_from(data, end)[0] != crc32c(data[:end]):
        raise JournalHeaderInvalid(detail="bad header CRC")
    try:
        runner_id = data[_HEADER.size : end].decode("utf-8")
    except UnicodeDecodeError as exc:  # pragma: no cover - the CRC held, so we wrote it
        raise JournalHeaderInvalid(detail="runner id not UTF-8") from exc
    return runner_id, end + _U32.size


def _frame_fits(data: bytes, pos: int) -> tuple[int, int] | None:
    """(length, stored CRC) when a frame header at ``pos`` has a possible length inside the file."""
    if len(data) - pos < _FRAME.size:
        return None
    length, crc = _FRAME.unpack_from(data, pos)
    if length < MIN_PAYLOAD or length > MAX_PAYLOAD or pos + _FRAME.size + length > len(data):
        return None
    return length, crc


def _crc_holds(data: bytes, pos: int, length: int, crc: int) -> bool:
    start = pos + _FRAME.size
    return crc32c(data[pos : pos + 4] + data[start : start + length]) == crc


def _read_frame(data: bytes, pos: int) -> tuple[Defect, dict[str, Any] | None, int]:
    """The frame at ``pos``: (NONE, record, next offset) or (defect, None, pos)."""
    if len(data) - pos < _FRAME.size:
        return Defect.SHORT_FRAME, None, pos
    length, crc = _FRAME.unpack_from(data, pos)
    if length < MIN_PAYLOAD or length > MAX_PAYLOAD:
        return Defect.BAD_LENGTH, None, pos
    if pos + _FRAME.size + length > len(data):
        return Defect.LENGTH_PAST_EOF, None, pos
    if not _crc_holds(data, pos, length, crc):
        return Defect.BAD_CRC, None, pos
    start = pos + _FRAME.size
    try:
        record = json.loads(data[start : start + length].decode("utf-8"))
    except ValueError:
        return Defect.BAD_PAYLOAD, None, pos
    if not isinstance(record, dict):
        return Defect.BAD_PAYLOAD, None, pos
    return Defect.NONE, record, start + length


def _valid_frame_after(data: bytes, pos: int) -> int | None:
    """The offset of the first frame after ``pos`` whose CRC holds, if any.

    Any such frame means the damage at ``pos`` is not a torn last write (only the last frame
    can be in flight), so truncating there would drop acknowledged records.
    """
    for candidate in range(pos + 1, len(data) - _FRAME.size - MIN_PAYLOAD + 1):
        fits = _frame_fits(data, candidate)
        if fits is not None and _crc_holds(data, candidate, *fits):
            return candidate
    return None


def scan_bytes(data: bytes) -> JournalScan:
    """Verify a whole journal image: its header, the verified prefix and its tail class.

    Pure. Raises JournalHeaderInvalid for a bad header; a corrupt body is a classification,
    not an exception (:meth:`Journal.open` turns it into JournalCorrupt).
    """
    runner_id, pos = _parse_header(data)
    records: list[dict[str, Any]] = []
    while pos < len(data):
        defect, record, nxt = _read_frame(data, pos)
        if record is None:
            if data.count(0, pos) == len(data) - pos:
                defect = Defect.ZERO_FILL  # a frame is never all zeros: the tail is unwritten
            fatal = defect is Defect.BAD_PAYLOAD or _valid_frame_after(data, pos) is not None
            tail = Tail.CORRUPT if fatal else Tail.TORN
            return JournalScan(runner_id, tuple(records), pos, len(data), tail, defect)
        records.append(record)
        pos = nxt
    return JournalScan(runner_id, tuple(records), pos, len(data), Tail.CLEAN, Defect.NONE)


def scan_journal(path: str | os.PathLike[str]) -> JournalScan:
    """Read and classify the journal at ``path`` without locking it (read-only inspection)."""
    return scan_bytes(Path(path).read_bytes())


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """fsync a directory so entries created, renamed or removed in it survive a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _create(path: Path, runner_id: str) -> None:
    """Create the journal atomically: header in a temp file, fsync, link into place, fsync dir."""
    temp = path.with_name(f".{path.name}.creating-{os.getpid()}-{time.time_ns()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, encode_header(runner_id), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)  # never replaces: a concurrent creator's journal wins
    except FileExistsError:
        pass
    finally:
        temp.unlink()
    fsync_dir(path.parent)


def quarantine_tail(path: str | os.PathLike[str], scan: JournalScan) -> Path:
    """Repair step 1: copy the bytes after ``scan.end`` to a quarantine file, durably.

    Idempotent: a quarantine file for the same offset with the same bytes is reused, so a
    crash after this step and a rerun neither loses nor duplicates the tail. Incomplete
    copies from a crash inside this step (``.tmp`` files) are removed.
    """
    journal = Path(path)
    tail = journal.read_bytes()[scan.end :]
    prefix = f"{journal.name}.quarantine-{scan.end}-"
    for stale in journal.parent.glob(f".{prefix}*.tmp"):
        stale.unlink()
    for existing in sorted(journal.parent.glob(f"{prefix}*")):
        if existing.read_bytes() == tail:
            return existing
    final = journal.with_name(f"{prefix}{time.time_ns()}")
    temp = journal.with_name(f".{final.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    try:
        _write_all(fd, tail, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.link(temp, final)  # never replaces an existing quarantine file
    temp.unlink()
    fsync_dir(journal.parent)
    return final


def truncate_journal(fd: int, end: int) -> None:
    """Repair step 2: cut the journal back to its verified prefix and make the cut durable."""
    os.ftruncate(fd, end)
    os.fsync(fd)


class Journal:
    """One runner's journal, opened for appending under an exclusive ``flock``.

    Thread-safe: appends are serialised. Each :meth:`append` blocks on ``fsync``; call it
    from a worker thread (``anyio.to_thread.run_sync``) in async code.
    """

    def __init__(self, path: Path, fd: int, scan: JournalScan) -> None:
        self.path = path
        self._fd: int | None = fd
        self._scan = scan
        self._end = scan.end
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | os.PathLike[str], runner_id: str) -> Journal:
        """Open (creating if missing) and lock the journal of ``runner_id``.

        Raises JournalLocked at once if another handle holds it, JournalCorrupt for a
        corrupt body, JournalRunnerMismatch / JournalHeaderInvalid for someone else's file.
        A torn tail opens fine: :attr:`scan` says so, appends are refused until :meth:`repair`.
        """
        journal = Path(path)
        if not journal.exists():
            _create(journal, runner_id)
        fd = os.open(journal, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise JournalLocked(path=str(journal)) from exc
            scan = _scan_fd(fd)
            if scan.runner_id != runner_id:
                raise JournalRunnerMismatch(path=str(journal), owner=scan.runner_id)
            _refuse_corrupt(journal, scan)
        except BaseException:
            os.close(fd)  # closing the descriptor releases the flock
            raise
        return cls(journal, fd, scan)

    @property
    def scan(self) -> JournalScan:
        """The scan taken when the journal was opened (or last repaired)."""
        return self._scan

    @property
    def end(self) -> int:
        """The offset just after the last acknowledged (fsynced) frame."""
        return self._end

    def append(self, record: Mapping[str, Any] | BaseModel) -> int:
        """Write one frame and fsync it; returns the new end offset once the record is durable.

        Raises JournalTornTail before a repair, JournalRecordInvalid for a bad record, and
        JournalBroken if the write or fsync failed (after a failed fsync the page cache can no
        longer be trusted, so the handle refuses further use; reopen to rescan).
        """
        frame = encode_frame(record)
        with self._lock:
            fd = self._require_fd()
            if self._scan.tail is not Tail.CLEAN:
                raise JournalTornTail(path=str(self.path), offset=self._scan.end)
            try:
                _write_all(fd, frame, self._end)
                os.fsync(fd)
            except OSError as exc:
                self._release()
                raise JournalBroken(path=str(self.path), detail=str(exc)) from exc
            self._end += len(frame)
            return self._end

    def repair(self) -> Repair | None:
        """Quarantine and truncate a torn tail; None when the journal is already clean.

        Idempotent and safe to rerun after a crash at any step (each step is). Raises
        JournalCorrupt, changing nothing, when the damage is not a torn tail.
        """
        with self._lock:
            fd = self._require_fd()
            scan = _scan_fd(fd)
            _refuse_corrupt(self.path, scan)
            if scan.tail is Tail.CLEAN:
                self._scan, self._end = scan, scan.end
                return None
            quarantine = quarantine_tail(self.path, scan)
            truncate_journal(fd, scan.end)
            self._scan = _scan_fd(fd)
            self._end = self._scan.end
            return Repair(scan.end, scan.tail_bytes, scan.defect, quarantine)

    def close(self) -> None:
        with self._lock:
            self._release()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_fd(self) -> int:
        if self._fd is None:
            raise JournalBroken("the journal handle is closed", path=str(self.path))
        return self._fd

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # Every acknowledged append was fsynced already; a failing close loses nothing.
            with contextlib.suppress(OSError):
                os.close(fd)


def _scan_fd(fd: int) -> JournalScan:
    size = os.fstat(fd).st_size
    return scan_bytes(os.pread(fd, size, 0))


def _refuse_corrupt(path: Path, scan: JournalScan) -> None:
    if scan.tail is Tail.CORRUPT:
        raise JournalCorrupt(path=str(path), offset=scan.end, defect=str(scan.defect))
