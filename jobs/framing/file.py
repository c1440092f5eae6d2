"""The framed file on disk: created atomically, locked, appended with fsync (one frame or one
group at a time), repaired (quarantine, then truncate) and replaced whole by a rotation.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from accord.jobs.errors import (
    JournalBroken,
    JournalCorrupt,
    JournalHeaderInvalid,
    JournalLocked,
    JournalRunnerMismatch,
    JournalTornTail,
)
from accord.jobs.framing.format import (
    HEADER_MAX,
    VERSION,
    VERSION_GROUPED,
    Defect,
    JournalScan,
    Repair,
    Tail,
    encode_header,
    encode_payload,
    frame_payload,
    head_size,
    payload_length,
    scan_after,
    scan_bytes,
    verified_payload,
)

# A journal replaced (rotated) between our open and our lock is opened again, this often.
_OPEN_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class Verified:
    """A prefix of a version 1 journal verified before: the file (device, inode), where the
    prefix ends, and its last bytes (its last frame, or the header), by which an open sees
    that the prefix is still there. Damage before those bytes is not seen by an open that
    trusts it: whoever keeps one verifies the whole file again from time to time."""

    file: tuple[int, int]
    end: int
    mark: bytes


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


def make_dirs(directory: str | os.PathLike[str]) -> None:
    """Create ``directory`` and any missing parents, each durably: a new directory's entry
    lives in its parent, so each parent is fsynced after the entry is made, from the top
    down. The deepest level that already exists has its parent fsynced too: a process that
    crashed between that level's mkdir and the fsync left an entry only a later fsync
    commits (creating top down, no level above it can be in that state). One fsync when
    nothing is missing. A parent this process may not read cannot be fsynced: an existing
    directory another user owns there (an operator's) is left as it is; one this user owns
    may be a crashed start's, so the PermissionError stands."""
    path = Path(directory)
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    try:
        fsync_dir(path.parent)
    except PermissionError:
        if path.stat().st_uid == os.geteuid():
            raise
    for new in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            new.mkdir()
        fsync_dir(new.parent)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _create(path: Path, runner_id: str, version: int) -> None:
    """Create the journal atomically: header in a temp file, fsync, link into place, fsync dir."""
    header = encode_header(runner_id, version=version)
    temp = path.with_name(f".{path.name}.creating-{os.getpid()}-{time.time_ns()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, header, 0)
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


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (a rotation renames another over it)."""
    st = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


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
    """One journal file, opened for appending under an exclusive ``flock``.

    Thread-safe: appends are serialised. Each append blocks on ``fsync``; call it from a
    worker thread (``anyio.to_thread.run_sync``) in async code.
    """

    def __init__(self, path: Path, fd: int, scan: JournalScan) -> None:
        self.path = path
        self._fd: int | None = fd
        self._scan = scan
        self._end = scan.end
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        runner_id: str,
        *,
        version: int = VERSION,
        verified: Verified | None = None,
    ) -> Journal:
        """Open (creating if missing, in format ``version``) and lock the journal of
        ``runner_id``; an existing journal keeps its own format. With ``verified``, a prefix
        of this version 1 file verified before, only its header and what follows the prefix
        are verified (:attr:`scan` holds only their records), once the file is the same one
        and ends the prefix with the same bytes; otherwise the whole file is.

        Raises JournalLocked at once if another handle holds it, JournalCorrupt for a
        corrupt body, JournalRunnerMismatch / JournalHeaderInvalid for someone else's file.
        A torn tail opens fine: :attr:`scan` says so, appends are refused until :meth:`repair`.
        """
        journal = Path(path)
        for _ in range(_OPEN_ATTEMPTS):
            if not journal.exists():
                _create(journal, runner_id, version)
            fd = os.open(journal, os.O_RDWR)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError as exc:
                    raise JournalLocked(path=str(journal)) from exc
                if not _still_named(fd, journal):
                    # Rotated between our open and our lock: the lock we got is on a file
                    # that is no longer the journal. Open what the name holds now.
                    os.close(fd)
                    continue
                try:
                    scan = _scan_fd(fd, verified)
                except JournalHeaderInvalid as exc:  # named by its file: one line at a start
                    raise JournalHeaderInvalid(path=str(journal), **exc.fields) from None
                if scan.runner_id != runner_id:
                    raise JournalRunnerMismatch(path=str(journal), owner=scan.runner_id)
                _refuse_corrupt(journal, scan)
                # Left by a rotation that crashed before its rename (we hold the lock: no
                # rotation runs now); the journal itself is whole either way.
                for stale in journal.parent.glob(f".{journal.name}.next-*"):
                    stale.unlink()
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)  # closing the descriptor releases the flock
                raise
            return cls(journal, fd, scan)
        raise JournalLocked("the journal kept being replaced while opening", path=str(journal))

    @property
    def scan(self) -> JournalScan:
        """The scan taken when the journal was opened (or last repaired)."""
        return self._scan

    @property
    def end(self) -> int:
        """The offset just after the last acknowledged (fsynced) frame."""
        return self._end

    @property
    def version(self) -> int:
        return self._scan.version

    def verified(self, last: int) -> Verified:
        """The prefix verified up to :attr:`end`, whose last frame begins at ``last`` (an
        offset :meth:`append_payloads` returned, or the scan's), for a later :meth:`open`."""
        with self._lock:
            fd = self._require_fd()
            st = os.fstat(fd)
            return Verified((st.st_dev, st.st_ino), self._end, os.pread(fd, self._end - last, last))

    @property
    def segment(self) -> int:
        """The segment number (version 2; 0 for a version 1 journal)."""
        return self._scan.segment

    def append(self, record: Mapping[str, Any] | BaseModel) -> int:
        """Write one frame and fsync it; returns the new end offset once the record is durable.

        Raises JournalTornTail before a repair, JournalRecordInvalid for a bad record, and
        JournalBroken if the write or fsync failed (after a failed fsync the page cache can no
        longer be trusted, so the handle refuses further use; reopen to rescan).
        """
        payload = encode_payload(record)
        with self._lock:
            self._append_locked([payload])
            return self._end

    def append_payloads(self, payloads: Sequence[bytes]) -> list[int]:
        """Write the frames of ``payloads`` (from :func:`encode_payload`); returns the offset
        where each frame begins, once every one of them is durable.

        Version 2: one group, one write and one fsync for them all. Version 1: one write and
        one fsync per frame in turn (its reader allows only one frame in flight). Raises as
        :meth:`append`; after JournalBroken some of them may be on disk, unacknowledged.
        """
        with self._lock:
            return self._append_locked(payloads)

    def _append_locked(self, payloads: Sequence[bytes]) -> list[int]:
        fd = self._require_fd()
        if self._scan.tail is not Tail.CLEAN:
            raise JournalTornTail(path=str(self.path), offset=self._scan.end)
        offsets: list[int] = []
        try:
            if self.version == VERSION_GROUPED and payloads:
                group, frames, pos = self._end, [], self._end
                for payload in payloads:
                    frames.append(frame_payload(payload, group))
                    offsets.append(pos)
                    pos += len(frames[-1])
                _write_all(fd, b"".join(frames), group)
                os.fsync(fd)
                self._end = pos
            else:
                for payload in payloads:
                    frame = frame_payload(payload)
                    _write_all(fd, frame, self._end)
                    os.fsync(fd)
                    offsets.append(self._end)
                    self._end += len(frame)
        except OSError as exc:
            self._release()
            raise JournalBroken(path=str(self.path), detail=str(exc)) from exc
        return offsets

    def read_payload(self, offset: int) -> bytes:
        """The payload of the frame at ``offset`` of the verified prefix, read back from the
        file with its CRC checked (JournalCorrupt if it no longer holds)."""
        head = head_size(self.version)
        with self._lock:
            fd = self._require_fd()
            data = os.pread(fd, head, offset) if offset < self._end else b""
            if len(data) == head:
                data += os.pread(fd, payload_length(data), offset + head)
        payload = verified_payload(data, self.version)
        if payload is None:
            raise JournalCorrupt(path=str(self.path), offset=offset, defect=str(Defect.BAD_CRC))
        return payload

    def rotate(self, payloads: Sequence[bytes]) -> Journal:
        """Seal this journal: put a new version-2 segment (the next number, beginning with
        ``payloads`` as one group, counted as carried) in its place, and return its locked
        handle; this handle is then closed.

        The new file is whole and fsynced, and locked, before ``rename`` gives it the name
        (atomically replacing this one), and the directory is fsynced before anything can be
        appended to it: at every moment the name holds all of the old file or all of the new
        one. A failure before the rename raises OSError and leaves this handle as it was; one
        after it raises JournalBroken and closes both (reopen to rescan).
        """
        with self._lock:
            self._require_fd()
            if self._scan.tail is not Tail.CLEAN:
                raise JournalTornTail(path=str(self.path), offset=self._scan.end)
            head = encode_header(
                self._scan.runner_id,
                version=VERSION_GROUPED,
                segment=self.segment + 1,
                carried=len(payloads),
            )
            data = head + b"".join(frame_payload(p, len(head)) for p in payloads)
            temp = self.path.with_name(f".{self.path.name}.next-{os.getpid()}-{time.time_ns()}")
            fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # before it bears the name
                _write_all(fd, data, 0)
                os.fsync(fd)
                os.rename(temp, self.path)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    temp.unlink()
                raise
            try:
                fsync_dir(self.path.parent)
                scan = _scan_fd(fd)
            except OSError as exc:
                os.close(fd)
                self._release()
                raise JournalBroken(path=str(self.path), detail=str(exc)) from exc
            self._release()
            return Journal(self.path, fd, scan)

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


def read_after(fd: int, verified: Verified) -> bytes | None:
    """The bytes of the file open at ``fd`` that follow the prefix ``verified``, once the
    file is the same one and still ends that prefix with the same bytes; else None (another
    file, cut short, or rewritten there: read it whole)."""
    st = os.fstat(fd)
    start = verified.end - len(verified.mark)
    if verified.file != (st.st_dev, st.st_ino) or start < 0 or st.st_size < verified.end:
        return None
    rest = os.pread(fd, st.st_size - start, start)
    return rest[len(verified.mark) :] if rest.startswith(verified.mark) else None


def _scan_fd(fd: int, verified: Verified | None = None) -> JournalScan:
    rest = None if verified is None else read_after(fd, verified)
    if rest is not None:
        assert verified is not None
        scan = scan_after(os.pread(fd, HEADER_MAX, 0), verified.end, rest)
        if scan is not None:
            return scan
    return scan_bytes(os.pread(fd, os.fstat(fd).st_size, 0))


def _refuse_corrupt(path: Path, scan: JournalScan) -> None:
    if scan.tail is Tail.CORRUPT:
        raise JournalCorrupt(path=str(path), offset=scan.end, defect=str(scan.defect))
