"""Result objects: content addressing, immutability, crash-safe writes and garbage collection."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from accord.jobs.errors import ObjectCorrupt, ObjectKeyInvalid, ObjectNotFound
from accord.jobs.runner.objects import LocalDirStore, ObjectStore, collect_garbage, key_for

HOUR = 3600.0


def age(store: LocalDirStore, key: str, seconds: float) -> None:
    """Pretend the object was last put ``seconds`` ago."""
    then = time.time() - seconds
    os.utime(store.root / key[7:9] / key, (then, then))


def test_keys_are_content_addresses(tmp_path: Path) -> None:
    store: ObjectStore = LocalDirStore(tmp_path / "objects")
    key = store.put(b"report body")
    assert key == "sha256-" + hashlib.sha256(b"report body").hexdigest() == key_for(b"report body")
    assert store.get(key) == b"report body"
    assert store.exists(key)
    other = store.put(b"")
    assert other != key and store.get(other) == b""
    assert sorted(i.key for i in store.iter()) == sorted([key, other])


def test_a_second_put_is_a_no_op_that_refreshes_age(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    key = store.put(b"x" * 1000)
    path = tmp_path / key[7:9] / key
    inode = path.stat().st_ino
    age(store, key, HOUR)
    assert store.put(b"x" * 1000) == key
    assert path.stat().st_ino == inode  # not rewritten
    assert path.stat().st_mtime > time.time() - 60  # but young again: GC will not take it
    assert [p.name for p in path.parent.iterdir()] == [key]  # no temp files left


def test_objects_are_immutable_files(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    key = store.put(b"final")
    path = tmp_path / key[7:9] / key
    assert path.stat().st_mode & 0o222 == 0
    if os.geteuid() != 0:  # root ignores permission bits
        with pytest.raises(PermissionError):
            path.open("wb")


def test_bad_keys_missing_and_corrupt_objects(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    key = store.put(b"good")
    for bad in ("sha256-XYZ", "../etc/passwd", "sha256-" + "A" * 64, key + "0"):
        with pytest.raises(ObjectKeyInvalid):
            store.get(bad)
    missing = key_for(b"never stored")
    assert not store.exists(missing)
    with pytest.raises(ObjectNotFound):
        store.get(missing)
    path = tmp_path / key[7:9] / key
    path.chmod(0o644)
    path.write_bytes(b"evil")
    with pytest.raises(ObjectCorrupt):
        store.get(key)


def test_iter_skips_temporary_files_and_strays(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    key = store.put(b"a")
    (tmp_path / key[7:9] / f".{key}.abc.tmp").write_bytes(b"half")
    (tmp_path / "README").write_text("not an object")
    assert [i.key for i in store.iter()] == [key]
    assert list(LocalDirStore(tmp_path / "absent").iter()) == []


def test_gc_keeps_referenced_and_young_objects(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    old_ref = store.put(b"old, referenced")
    old_unref = store.put(b"old, unreferenced")
    young_unref = store.put(b"young, unreferenced")
    young_ref = store.put(b"young, referenced")
    age(store, old_ref, 2 * HOUR)
    age(store, old_unref, 2 * HOUR)
    deleted = collect_garbage(store, {old_ref, young_ref}, older_than_s=HOUR)
    assert deleted == [old_unref]
    assert not store.exists(old_unref)
    for kept in (old_ref, young_unref, young_ref):
        assert store.exists(kept)
    assert collect_garbage(store, {old_ref, young_ref}, older_than_s=HOUR) == []
    # Zero retention: everything unreferenced goes.
    deleted = collect_garbage(store, {old_ref}, older_than_s=0)
    assert sorted(deleted) == sorted([young_unref, young_ref])
    assert [i.key for i in store.iter()] == [old_ref]


def test_gc_spares_an_object_put_again_after_the_listing(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    key = store.put(b"reused")
    age(store, key, 2 * HOUR)
    cutoff = time.time() - HOUR
    store.put(b"reused")  # a new job stores the same bytes between listing and delete
    assert store.delete(key, unless_put_after=cutoff) is False
    assert store.get(key) == b"reused"
    assert store.delete(key) is True  # control: an unconditional delete removes it
    assert not store.exists(key) and store.delete(key) is False


def test_a_touch_restarts_an_objects_age_and_fails_once_it_is_gone(tmp_path: Path) -> None:
    """What a publish does to the object it names: an old object touched is young again, so
    a collection keeps it (control: the same object untouched is collected); a touch of an
    object collected, or never put, raises ObjectNotFound."""
    store = LocalDirStore(tmp_path)
    kept, taken = store.put(b"named by a publish"), store.put(b"named by nothing")
    age(store, kept, 2 * HOUR)
    age(store, taken, 2 * HOUR)
    store.touch(kept)
    assert collect_garbage(store, set(), HOUR) == [taken]
    assert store.get(kept) == b"named by a publish"
    for key in (taken, key_for(b"never put")):
        with pytest.raises(ObjectNotFound):
            store.touch(key)
    with pytest.raises(ObjectKeyInvalid):
        store.touch("results/report.json")


def test_gc_rejects_negative_retention(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        collect_garbage(LocalDirStore(tmp_path), set(), older_than_s=-1)


# -- one durable write per object, and what a crash between its steps can leave ------------


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each fsync (file or directory) and link, in order."""
    calls: list[str] = []
    fsync, link = os.fsync, os.link

    def recording_fsync(fd: int) -> None:
        calls.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        fsync(fd)

    def recording_link(*args: object, **kwargs: object) -> None:
        calls.append("link")
        link(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "link", recording_link)
    return calls


@pytest.mark.parametrize("tmpfile", [True, False], ids=["O_TMPFILE", "named temp"])
def test_a_new_object_is_linked_whole_then_one_file_fsync_and_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmpfile: bool
) -> None:
    store = LocalDirStore(tmp_path)
    store.put(b"first")  # creates the root and a fan directory (their own fsyncs)
    if not tmpfile:
        store._tmpfile = False
    calls = _fsyncs(monkeypatch)
    key = store.put(b"a result")
    # the name appears only once every byte is written; one fsync commits bytes and name
    assert calls[-3:] == ["link", "fsync file", "fsync dir"]
    assert calls.count("fsync file") == 1
    assert store.get(key) == b"a result"
    assert [p.name for p in (tmp_path / key[7:9]).iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("tmpfile", [True, False], ids=["O_TMPFILE", "named temp"])
@pytest.mark.parametrize("torn", ["empty", "prefix", "zeros"])
def test_a_torn_body_under_the_final_name_is_never_served_and_the_next_put_replaces_it(
    tmp_path: Path, tmpfile: bool, torn: str
) -> None:
    """A crash between the link and the fsync can leave the final name on a torn body (no
    manifest names it: its publish never ran). get refuses it; the next put of the same
    bytes finds the mismatch and puts the whole object over it."""
    store = LocalDirStore(tmp_path)
    store._tmpfile = tmpfile
    data = b"the whole report " * 100
    key = key_for(data)
    # control: a good object is served
    assert store.get(store.put(data)) == data
    path = tmp_path / key[7:9] / key
    path.unlink()
    body = {"empty": b"", "prefix": data[:500], "zeros": bytes(len(data))}[torn]
    path.write_bytes(body)
    path.chmod(0o444)
    inode = path.stat().st_ino
    with pytest.raises(ObjectCorrupt):
        store.get(key)
    assert store.put(data) == key
    assert store.get(key) == data
    assert path.stat().st_ino != inode and path.stat().st_mode & 0o222 == 0
    assert [p.name for p in path.parent.iterdir()] == [key]  # no temporary file left


def test_a_put_racing_an_identical_put_keeps_the_winner_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other put links the same bytes between this put's look and its link: this put
    finds them in place (and makes them durable) instead of replacing them."""
    store = LocalDirStore(tmp_path)
    data = b"same bytes"
    key = key_for(data)
    other = LocalDirStore(tmp_path)
    looked = store._stored

    def race(final: Path, content: bytes) -> bool:
        monkeypatch.setattr(store, "_stored", looked)
        assert looked(final, content) is False  # not there yet when this put looks
        other.put(content)  # ... then the other put wins
        return False

    monkeypatch.setattr(store, "_stored", race)
    assert store.put(data) == key
    path = tmp_path / key[7:9] / key
    inode = path.stat().st_ino
    assert store.put(data) == key and path.stat().st_ino == inode
    assert [p.name for p in path.parent.iterdir()] == [key]


def test_concurrent_puts_of_the_same_and_other_bytes(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    payloads = [b"shared"] * 8 + [f"own {i}".encode() for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        keys = list(pool.map(store.put, payloads))
    assert keys == [key_for(p) for p in payloads]
    assert all(store.get(k) == p for k, p in zip(keys, payloads, strict=True))
    assert sorted(i.key for i in store.iter()) == sorted(set(keys))
    assert not [p for p in tmp_path.rglob(".*")]  # no temporary file anywhere
