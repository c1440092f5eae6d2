"""Result objects: immutable, content-addressed blobs, and the collector of unreferenced ones.

Invariant: the bytes under a key always hash to that key (``sha256-<hex>``), and an object is
either wholly present or absent: it is written to a temporary file, fsynced, linked into place
and its directory fsynced. A job's result is published by a fenced manifest row that names the
key (``jobs.results.object_key``); an object no row names is garbage once it is older than the
retention, which must exceed the longest time between a put and the publish that references it.

The store is synchronous (local file I/O); async callers use ``anyio.to_thread.run_sync``.
An S3-compatible store can implement :class:`ObjectStore` later, and run the same tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
import uuid
from collections.abc import Iterator, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from accord.jobs.errors import ObjectCorrupt, ObjectKeyInvalid, ObjectNotFound
from accord.jobs.framing import fsync_dir

_KEY = re.compile(r"sha256-[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object: its key, size in bytes and last-put time (seconds since the epoch)."""

    key: str
    size: int
    mtime: float


class ObjectStore(Protocol):
    """Immutable content-addressed storage for job results."""

    def put(self, data: bytes) -> str:
        """Store ``data`` durably and return its key; storing existing content is a no-op
        that only refreshes the object's age (so a collector does not take it from a new user).
        """
        ...

    def get(self, key: str) -> bytes: ...

    def exists(self, key: str) -> bool: ...

    def iter(self) -> Iterator[ObjectInfo]: ...

    def delete(self, key: str, *, unless_put_after: float | None = None) -> bool:
        """Remove the object; with ``unless_put_after``, keep it if it was put after that time.

        Returns whether it was removed.
        """
        ...


def key_for(data: bytes) -> str:
    """The content address of ``data``."""
    return "sha256-" + hashlib.sha256(data).hexdigest()


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ObjectKeyInvalid(key=key)
    return key


class LocalDirStore:
    """Objects as read-only files under ``root/<2 hex>/<key>``, written crash-safely."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        check_key(key)
        return self.root / key[7:9] / key

    def put(self, data: bytes) -> str:
        key = key_for(data)
        final = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            os.utime(final)  # already stored: restart its retention clock, write nothing
            return key
        self._ensure_dir(final.parent)
        temp = final.parent / f".{key}.{uuid.uuid4().hex}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, final)  # never replaces: a concurrent put of the same bytes wins
        except FileExistsError:
            pass
        finally:
            temp.unlink()
        fsync_dir(final.parent)
        return key

    def _ensure_dir(self, fan: Path) -> None:
        # A new directory's entry lives in its parent: fsync the parent so it survives a cut.
        if fan.is_dir():
            return
        if not self.root.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.root.parent)
        fan.mkdir(exist_ok=True)
        fsync_dir(self.root)

    def get(self, key: str) -> bytes:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFound(key=key) from exc
        if key_for(data) != key:
            raise ObjectCorrupt(key=key)
        return data

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def iter(self) -> Iterator[ObjectInfo]:
        if not self.root.is_dir():
            return
        for fan in sorted(self.root.iterdir()):
            if not fan.is_dir():
                continue
            for entry in sorted(fan.iterdir()):
                if not _KEY.fullmatch(entry.name):
                    continue  # temporary files of puts in progress
                with contextlib.suppress(FileNotFoundError):
                    st = entry.stat()
                    yield ObjectInfo(entry.name, st.st_size, st.st_mtime)

    def delete(self, key: str, *, unless_put_after: float | None = None) -> bool:
        path = self._path(key)
        # Move it aside first, then look at its age: a put that refreshed it before the move
        # is seen and undone below; a put after the move finds no file and writes a fresh one.
        aside = path.parent / f".{key}.{uuid.uuid4().hex}.deleting.tmp"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        if unless_put_after is not None and aside.stat().st_mtime > unless_put_after:
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
            aside.unlink()
            return False
        aside.unlink()
        fsync_dir(path.parent)
        return True


def collect_garbage(store: ObjectStore, referenced: Set[str], older_than_s: float) -> list[str]:
    """Delete objects no reference names that were last put more than ``older_than_s`` ago.

    Returns the deleted keys. Young objects are kept whether referenced or not: a worker may
    have put them for a publish that has not committed yet. The clock is the file system's
    (object mtimes), compared with this host's wall clock.
    """
    if older_than_s < 0:
        raise ValueError("older_than_s must be >= 0")
    cutoff = time.time() - older_than_s
    deleted: list[str] = []
    for info in list(store.iter()):
        if info.key in referenced or info.mtime > cutoff:
            continue
        if store.delete(info.key, unless_put_after=cutoff):
            deleted.append(info.key)
    return deleted
