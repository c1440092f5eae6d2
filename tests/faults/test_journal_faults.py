"""The runner journal under damage and crashes: bit flips, repair crashes, kill -9, power cuts.

Each scenario states precisely what the reader must do: which records it returns, where the
verified prefix ends, and whether the tail is torn (repairable) or corrupt (fatal, untouched).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord.jobs import framing as journal
from accord.jobs.errors import JournalCorrupt, JournalLocked
from accord.jobs.framing import Journal, Tail, quarantine_tail, scan_bytes, scan_journal
from tests.support import scaled

RUNNER = "runner-faults"
ROOT = Path(__file__).resolve().parents[2]


def make_records(n: int) -> list[dict[str, Any]]:
    return [{"seq": i, "pad": "y" * ((i * 53) % 120)} for i in range(n)]


def build(records: list[dict[str, Any]]) -> tuple[bytes, list[int]]:
    data = journal.encode_header(RUNNER)
    boundaries = [len(data)]
    for record in records:
        data += journal.encode_frame(record)
        boundaries.append(len(data))
    return data, boundaries


def frame_index(boundaries: list[int], offset: int) -> int:
    """The index of the frame holding byte ``offset`` (offset >= header end)."""
    return max(i for i, b in enumerate(boundaries[:-1]) if b <= offset)


def quarantines(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if ".quarantine-" in p.name)


# -- bit flips -------------------------------------------------------------------------------


def test_random_bit_flips_are_never_accepted_nor_auto_truncated() -> None:
    records = make_records(40)
    data, boundaries = build(records)
    last = len(records) - 1
    rng = random.Random(20240607)
    seen = {Tail.CORRUPT: 0, Tail.TORN: 0}
    for _ in range(10_000):
        bit = rng.randrange(boundaries[0] * 8, len(data) * 8)
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        scan = scan_bytes(bytes(damaged))
        k = frame_index(boundaries, bit // 8)
        # Never accepted: exactly the frames before the flipped one are returned.
        assert list(scan.records) == records[:k]
        assert scan.end == boundaries[k]
        # Never auto-truncated: a flip with valid frames after it is corrupt (fatal). Only a
        # flip in the final frame, which nothing valid follows, looks like a torn last write:
        # repair then quarantines that frame's bytes rather than dropping them.
        assert scan.tail is (Tail.TORN if k == last else Tail.CORRUPT)
        seen[scan.tail] += 1
    assert seen[Tail.CORRUPT] > 9000 and seen[Tail.TORN] > 0


def test_bit_flips_on_disk_refuse_open_and_leave_the_file_alone(tmp_path: Path) -> None:
    records = make_records(20)
    data, boundaries = build(records)
    rng = random.Random(7)
    path = tmp_path / "j"
    for _ in range(scaled(40, 400)):
        bit = rng.randrange(boundaries[0] * 8, boundaries[-2] * 8)  # never the last frame
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(damaged))
        with pytest.raises(JournalCorrupt) as caught:
            Journal.open(path, RUNNER)
        assert caught.value.fields["offset"] == boundaries[frame_index(boundaries, bit // 8)]
        assert path.read_bytes() == bytes(damaged)
    assert quarantines(tmp_path) == []


def test_flip_in_the_final_frame_is_quarantined_not_lost(tmp_path: Path) -> None:
    records = make_records(6)
    data, boundaries = build(records)
    damaged = bytearray(data)
    damaged[boundaries[-2] + 10] ^= 0x08
    path = tmp_path / "j"
    path.write_bytes(bytes(damaged))
    with Journal.open(path, RUNNER) as j:
        assert j.scan.tail is Tail.TORN
        repair = j.repair()
    assert repair is not None
    assert repair.quarantine.read_bytes() == bytes(damaged[boundaries[-2] :])
    assert list(scan_journal(path).records) == records[:-1]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_short_bursts_before_the_last_frame_are_corrupt(data: st.DataObject) -> None:
    records = make_records(12)
    image, boundaries = build(records)
    start = data.draw(st.integers(boundaries[0], boundaries[-2] - 1), label="start")
    burst = data.draw(st.binary(min_size=1, max_size=4), label="burst")
    damaged = bytearray(image)
    damaged[start : start + len(burst)] = burst
    damaged = damaged[: len(image)]
    changed = [i for i in range(len(image)) if damaged[i] != image[i]]
    if not changed:
        return
    k = frame_index(boundaries, changed[0])
    scan = scan_bytes(bytes(damaged))
    assert list(scan.records) == records[:k] and scan.end == boundaries[k]
    if frame_index(boundaries, changed[-1]) < len(records) - 1:
        assert scan.tail is Tail.CORRUPT


# -- repair crashes --------------------------------------------------------------------------


def torn_journal(path: Path) -> tuple[list[dict[str, Any]], int, bytes]:
    records = make_records(5)
    with Journal.open(path, RUNNER) as j:
        for record in records:
            j.append(record)
        end = j.end
    tail = journal.encode_frame({"seq": 5, "in": "flight"})[:-4] + bytes(100)
    with path.open("ab") as f:
        f.write(tail)
    return records, end, tail


def finish_repair_and_check(
    path: Path, records: list[dict[str, Any]], end: int, tail: bytes
) -> Path:
    with Journal.open(path, RUNNER) as j:
        j.repair()
        assert j.repair() is None
        j.append({"seq": 5, "after": "repair"})
    assert list(scan_journal(path).records) == [*records, {"seq": 5, "after": "repair"}]
    kept = quarantines(path.parent)
    assert len(kept) == 1, kept  # nothing lost, nothing duplicated
    assert kept[0].read_bytes() == tail and kept[0].name.startswith(f"j.quarantine-{end}-")
    return kept[0]


def test_repair_crash_while_writing_the_quarantine_copy(tmp_path: Path) -> None:
    path = tmp_path / "j"
    records, end, tail = torn_journal(path)
    partial = tmp_path / f".j.quarantine-{end}-1.tmp"  # the temp copy, never linked into place
    partial.write_bytes(tail[:10])
    finish_repair_and_check(path, records, end, tail)
    assert not partial.exists()


def test_repair_crash_after_quarantine_before_truncation(tmp_path: Path) -> None:
    path = tmp_path / "j"
    records, end, tail = torn_journal(path)
    first = quarantine_tail(path, scan_journal(path))  # step 1 done, then the process dies
    assert path.stat().st_size == end + len(tail)
    assert quarantine_tail(path, scan_journal(path)) == first  # rerunning the step reuses it
    assert finish_repair_and_check(path, records, end, tail) == first


def test_repair_crash_after_truncation(tmp_path: Path) -> None:
    path = tmp_path / "j"
    records, end, tail = torn_journal(path)
    quarantine_tail(path, scan_journal(path))
    os.truncate(path, end)  # step 2 done (whether or not its fsync ran, the rerun is the same)
    with Journal.open(path, RUNNER) as j:
        assert j.scan.tail is Tail.CLEAN
    finish_repair_and_check(path, records, end, tail)


def test_repair_of_a_corrupt_journal_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j"
    torn_journal(path)
    with Journal.open(path, RUNNER) as j:
        damaged = bytearray(path.read_bytes())
        damaged[len(journal.encode_header(RUNNER)) + 9] ^= 0x01  # first frame's payload
        path.write_bytes(bytes(damaged))
        with pytest.raises(JournalCorrupt):
            j.repair()
    assert path.read_bytes() == bytes(damaged)
    assert quarantines(tmp_path) == []


# -- a second process ------------------------------------------------------------------------

HOLDER = """
import sys, time
from accord.jobs.framing import Journal
j = Journal.open(sys.argv[1], "runner-faults")
print("locked", flush=True)
time.sleep(60)
"""


def child(code: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, text=True, cwd=ROOT, **kwargs
    )


@pytest.mark.timeout(60)
def test_second_opener_in_another_process_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "j"
    Journal.open(path, RUNNER).close()  # control: free to open
    holder = child(HOLDER, str(path), stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        started = time.monotonic()
        with pytest.raises(JournalLocked):
            Journal.open(path, RUNNER)
        assert time.monotonic() - started < 1.0  # refused at once, not after waiting
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    Journal.open(path, RUNNER).close()  # the dead holder's lock is gone with it


# -- kill -9 ---------------------------------------------------------------------------------

APPENDER = """
import sys
from accord.jobs.framing import Journal, Tail
j = Journal.open(sys.argv[1], "runner-faults")
if j.scan.tail is Tail.TORN:
    j.repair()
seq = j.scan.records[-1]["seq"] + 1 if j.scan.records else 0
while True:
    j.append({"seq": seq, "pad": "z" * (seq % 300)})
    print(seq, flush=True)
    seq += 1
"""


def wait_for_first_ack(out: Path, proc: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not out.read_text().strip():
        assert proc.poll() is None, "the appender died on its own"
        assert time.monotonic() < deadline, "the appender never acknowledged a record"
        time.sleep(0.01)


@pytest.mark.timeout(300)
def test_kill_9_never_loses_an_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "j"
    rng = random.Random()
    acknowledged: list[int] = []
    for round_ in range(scaled(4, 40)):
        out = tmp_path / f"acks-{round_}"
        with out.open("w") as sink:
            proc = child(APPENDER, str(path), stdout=sink)
            if round_ % 2:
                # Anywhere from start-up (open, lock, repair of the last round's tail) on.
                time.sleep(rng.uniform(0.0, 1.5))
            else:
                wait_for_first_ack(out, proc)  # mid-append, however slow start-up is
                time.sleep(rng.uniform(0.0, 0.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        acknowledged += [int(line) for line in out.read_text().split()]
    assert acknowledged  # the rounds that waited for a first ack guarantee some
    with Journal.open(path, RUNNER) as j:
        if j.scan.tail is Tail.TORN:
            j.repair()
        seqs = [r["seq"] for r in j.scan.records]
    assert seqs == list(range(len(seqs)))  # in order, no gaps, no duplicates
    assert set(acknowledged) <= set(seqs)


# -- power cuts ------------------------------------------------------------------------------


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(["drop", "garbage", "zeros", "partial_pages", "whole"]),
    data=st.data(),
)
def test_power_cut_keeps_every_fsynced_record(
    tmp_path: Path, kind: str, data: st.DataObject
) -> None:
    path = tmp_path / f"j-{time.time_ns()}"
    records = make_records(data.draw(st.integers(0, 6), label="n"))
    with Journal.open(path, RUNNER) as j:
        for record in records:
            j.append(record)
        synced = j.end
    # One append was in flight (appends are serialised and fsynced one by one): its bytes,
    # and anything the file system allocated after them, may be lost, zeroed or garbage.
    frame = journal.encode_frame({"seq": len(records), "pad": "w" * 200})
    rng = random.Random(data.draw(st.integers(0, 2**32), label="seed"))
    if kind == "drop":
        unsynced = frame[: rng.randrange(len(frame))]
    elif kind == "garbage":
        unsynced = rng.randbytes(rng.randrange(1, 4096))
    elif kind == "zeros":
        unsynced = bytes(rng.randrange(1, 4096))
    elif kind == "partial_pages":  # some 64-byte pieces reached the disk, others did not
        pieces = [frame[i : i + 64] for i in range(0, len(frame), 64)]
        unsynced = b"".join(p if rng.random() < 0.5 else rng.randbytes(len(p)) for p in pieces)
    else:
        unsynced = frame
    with path.open("ab") as f:
        f.write(unsynced)
    scan = scan_journal(path)
    assert scan.tail is not Tail.CORRUPT
    assert list(scan.records[: len(records)]) == records
    with Journal.open(path, RUNNER) as j:
        j.repair()
        j.append({"seq": "after"})
    final = scan_journal(path)
    assert final.tail is Tail.CLEAN
    assert list(final.records[: len(records)]) == records and final.records[-1] == {"seq": "after"}
    assert len(final.records) == len(records) + (2 if unsynced == frame else 1)
    assert synced <= final.end


# -- group commit (version 2): one write and one fsync per group -----------------------------

GROUPED = journal.VERSION_GROUPED


def build_groups(groups: list[list[dict[str, Any]]]) -> tuple[bytes, list[int], list[int]]:
    """A version-2 image: where each frame ends, and the index of the group of each frame."""
    data = journal.encode_header(RUNNER, version=GROUPED)
    boundaries, group_of = [len(data)], []
    for g, group in enumerate(groups):
        start = len(data)
        for record in group:
            data += journal.encode_frame(record, group=start)
            boundaries.append(len(data))
            group_of.append(g)
    return data, boundaries, group_of


def test_a_group_whose_middle_frame_never_reached_the_disk_is_torn_and_repaired(
    tmp_path: Path,
) -> None:
    synced, unsynced = make_records(3), make_records(4)
    data, boundaries, _ = build_groups([synced, unsynced])
    # A power cut in the last group's write: its second frame's pages stayed zero (or never
    # got written) while the pages after them, its third and fourth frames, persisted.
    damaged = bytearray(data)
    damaged[boundaries[4] : boundaries[5]] = bytes(boundaries[5] - boundaries[4])
    path = tmp_path / "j"
    path.write_bytes(bytes(damaged))
    scan = scan_journal(path)
    assert (scan.tail, scan.end) == (Tail.TORN, boundaries[4])
    assert list(scan.records) == synced + unsynced[:1]  # a whole frame of it stays
    with Journal.open(path, RUNNER) as j:
        repair = j.repair()
        assert repair is not None and repair.quarantine.read_bytes() == damaged[boundaries[4] :]
        j.append({"seq": "after"})
    assert list(scan_journal(path).records) == [*synced, unsynced[0], {"seq": "after"}]


def test_a_bad_frame_before_a_later_group_is_corrupt(tmp_path: Path) -> None:
    first, second = make_records(3), make_records(2)
    data, boundaries, _ = build_groups([first, second])
    # control: the same damage in the last group is a torn write
    last = bytearray(data)
    last[boundaries[4] : boundaries[5]] = bytes(boundaries[5] - boundaries[4])
    assert scan_bytes(bytes(last)).tail is Tail.TORN
    # forbidden: a frame of a later group proves the damaged group was fsynced once
    damaged = bytearray(data)
    damaged[boundaries[1] : boundaries[2]] = bytes(boundaries[2] - boundaries[1])
    path = tmp_path / "j"
    path.write_bytes(bytes(damaged))
    with pytest.raises(JournalCorrupt) as caught:
        Journal.open(path, RUNNER)
    assert caught.value.fields["offset"] == boundaries[1]
    assert path.read_bytes() == bytes(damaged) and quarantines(tmp_path) == []


def test_random_bit_flips_in_groups_are_never_accepted_nor_truncated_before_a_later_group() -> None:
    groups = [make_records(n) for n in (3, 1, 4, 2, 3)]
    records = [r for g in groups for r in g]
    data, boundaries, group_of = build_groups(groups)
    last = len(groups) - 1
    rng = random.Random(20261201)
    seen = {Tail.CORRUPT: 0, Tail.TORN: 0}
    for _ in range(5_000):
        bit = rng.randrange(boundaries[0] * 8, len(data) * 8)
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        scan = scan_bytes(bytes(damaged))
        k = frame_index(boundaries, bit // 8)
        assert list(scan.records) == records[:k] and scan.end == boundaries[k]
        # A flip in the last group looks like its torn write (quarantined by repair, not
        # lost); any flip before a later group is corrupt.
        assert scan.tail is (Tail.TORN if group_of[k] == last else Tail.CORRUPT)
        seen[scan.tail] += 1
    assert seen[Tail.CORRUPT] > 3500 and seen[Tail.TORN] > 0


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(["drop", "garbage", "zeros", "partial_pages", "holes", "whole"]),
    data=st.data(),
)
def test_power_cut_in_a_group_keeps_every_fsynced_group(
    tmp_path: Path, kind: str, data: st.DataObject
) -> None:
    path = tmp_path / f"j-{time.time_ns()}"
    groups = [make_records(n) for n in data.draw(st.lists(st.integers(1, 4), max_size=4))]
    synced_records = [r for g in groups for r in g]
    with Journal.open(path, RUNNER, version=GROUPED) as j:
        for group in groups:
            j.append_payloads([journal.encode_payload(r) for r in group])
        synced = j.end
    # One group was in flight: any of its pages, and whatever the file system allocated
    # after them, may be lost, zeroed or garbage, in any combination.
    size = data.draw(st.integers(1, 6), label="frames in flight")
    flight = [{"seq": f"flight-{i}", "pad": "w" * (40 * i)} for i in range(size)]
    frames = b"".join(journal.encode_frame(r, group=synced) for r in flight)
    rng = random.Random(data.draw(st.integers(0, 2**32), label="seed"))
    pieces = [frames[i : i + 64] for i in range(0, len(frames), 64)]
    if kind == "drop":
        unsynced = frames[: rng.randrange(len(frames))]
    elif kind == "garbage":
        unsynced = rng.randbytes(rng.randrange(1, 4096))
    elif kind == "zeros":
        unsynced = bytes(rng.randrange(1, 4096))
    elif kind == "partial_pages":
        unsynced = b"".join(p if rng.random() < 0.5 else rng.randbytes(len(p)) for p in pieces)
    elif kind == "holes":  # pages never written read back as zeros, later ones persisted
        unsynced = b"".join(p if rng.random() < 0.6 else bytes(len(p)) for p in pieces)
    else:
        unsynced = frames
    with path.open("ab") as f:
        f.write(unsynced)
    scan = scan_journal(path)
    assert scan.tail is not Tail.CORRUPT
    assert list(scan.records[: len(synced_records)]) == synced_records
    assert all(r in flight for r in scan.records[len(synced_records) :])  # nothing invented
    with Journal.open(path, RUNNER) as j:
        j.repair()
        j.append({"seq": "after"})
    final = scan_journal(path)
    assert final.tail is Tail.CLEAN and final.records[-1] == {"seq": "after"}
    assert list(final.records[: len(synced_records)]) == synced_records
    if unsynced == frames:
        assert list(final.records[len(synced_records) : -1]) == flight
    assert synced <= final.end


# -- kill -9 while jobs write concurrently and the journal rotates -----------------------------

GROUP_APPENDER = """
import sys
import anyio
from accord.jobs.runner.journal import RunnerJournal
from accord.jobs.runner.journal_records import EffectRef

def recorded(job_id):  # the database recorded every third begin: rotations drop those
    return job_id % 3 == 0

async def main(path):
    journal = RunnerJournal.open(path, "runner-faults")
    if journal.scan.tail.value == "torn":
        journal.repair()
    start = 1 + max([r["job_id"] for r in journal.scan.records] or [0])

    async def job(k):
        n = 0
        while True:
            job_id = start + k + 8 * n
            # as a worker's job: its claim noted (nobody waits), its begin written
            journal.note({"type": "claim", "job_id": job_id})
            await journal.write({"type": "effect_begin", "job_id": job_id, "effect_key": "k",
                                 "seq": 1})
            print(job_id, flush=True)
            n += 1

    async def rotations():
        while True:
            await anyio.sleep(0.01)
            done = {b for b in journal.begun() if recorded(b.ref.job_id)}
            await journal.rotate(done)

    async with anyio.create_task_group() as tg:
        for k in range(8):
            tg.start_soon(job, k)
        if rotating:
            tg.start_soon(rotations)
        tg.start_soon(journal.flush_noted)

rotating = sys.argv[2] == "rotate"
anyio.run(main, sys.argv[1])
"""


@pytest.mark.timeout(300)
def test_kill_9_during_group_commit_and_rotation_never_loses_what_can_still_matter(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.journal"
    rng = random.Random()
    acknowledged: list[int] = []
    noted_seen = 0
    for round_ in range(scaled(4, 40)):
        out = tmp_path / f"acks-{round_}"
        # Every fourth round without rotations: its segment (the start rotates) then holds
        # every group it wrote, so an acknowledged begin shows the claim noted before it.
        # (With a rotation every 10 ms the last segment of a round may hold none.)
        mode = "steady" if round_ % 4 == 0 else "rotate"
        with out.open("w") as sink:
            proc = child(GROUP_APPENDER, str(path), mode, stdout=sink)
            if round_ % 2:
                time.sleep(rng.uniform(0.0, 1.5))
            else:
                wait_for_first_ack(out, proc)
                time.sleep(rng.uniform(0.0, 0.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        acknowledged += [int(line) for line in out.read_text().split()]
        scan = scan_journal(path)
        assert scan.tail is not Tail.CORRUPT
        noted_seen += sum(1 for r in scan.records if r["type"] == "claim")
    assert acknowledged
    assert noted_seen  # the noted claims reached the disk in the groups beside the begins
    with Journal.open(path, RUNNER) as j:  # never corrupt, whenever the kill came
        if j.scan.tail is Tail.TORN:
            j.repair()
        jobs = [r["job_id"] for r in j.scan.records if r["type"] == "effect_begin"]
    assert len(jobs) == len(set(jobs))  # nothing carried twice
    # Every acknowledged begin the database did not record is still there, whatever
    # rotations happened; recorded ones may be gone (that is what rotation is for).
    assert {a for a in acknowledged if a % 3} <= set(jobs)
