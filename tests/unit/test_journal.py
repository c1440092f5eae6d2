"""The runner journal's format, tail classification, repair and records (no services)."""

from __future__ import annotations

import errno
import json
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.jobs import framing as journal
from accord.jobs.errors import (
    JournalBroken,
    JournalCorrupt,
    JournalHeaderInvalid,
    JournalLocked,
    JournalRecordInvalid,
    JournalRunnerMismatch,
    JournalTornTail,
)
from accord.jobs.framing import Defect, Journal, Tail, scan_bytes, scan_journal
from accord.jobs.framing import file as framing_file
from accord.jobs.runner.journal import RunnerJournal
from accord.jobs.runner.journal_records import Begun, EffectRef
from tests.support import wait_for

RUNNER = "runner-1"


def make_records(n: int) -> list[dict[str, Any]]:
    # Varying sizes so frame boundaries do not fall on a regular grid.
    return [{"seq": i, "pad": "x" * ((i * 37) % 90)} for i in range(n)]


def build(records: list[dict[str, Any]]) -> tuple[bytes, list[int]]:
    """A journal image and the offset where each frame ends (boundaries[0] = header end)."""
    data = journal.encode_header(RUNNER)
    boundaries = [len(data)]
    for record in records:
        data += journal.encode_frame(record)
        boundaries.append(len(data))
    return data, boundaries


def write_journal(path: Path, records: list[dict[str, Any]]) -> None:
    with Journal.open(path, RUNNER) as j:
        for record in records:
            j.append(record)


def test_round_trip_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "j"
    records = make_records(5)
    with Journal.open(path, RUNNER) as j:
        assert j.scan.tail is Tail.CLEAN and j.scan.records == ()
        ends = [j.append(r) for r in records]
    assert ends == sorted(ends) and ends[-1] == path.stat().st_size
    scan = scan_journal(path)
    assert list(scan.records) == records
    assert (scan.tail, scan.defect, scan.end, scan.runner_id) == (
        Tail.CLEAN,
        Defect.NONE,
        ends[-1],
        RUNNER,
    )
    with Journal.open(path, RUNNER) as j:
        assert j.end == ends[-1]
        j.append({"seq": 99})
    assert scan_journal(path).records[-1] == {"seq": 99}
    assert [p.name for p in tmp_path.iterdir()] == ["j"]  # no creation leftovers


def test_frame_layout_is_length_crc_payload() -> None:
    frame = journal.encode_frame({"b": 1, "a": "é"})
    payload = json.dumps({"a": "é", "b": 1}, separators=(",", ":"), ensure_ascii=False).encode()
    length = len(payload).to_bytes(4, "little")
    assert frame == length + journal.crc32c(length + payload).to_bytes(4, "little") + payload


def test_header_checks(tmp_path: Path) -> None:
    path = tmp_path / "j"
    write_journal(path, make_records(1))
    with pytest.raises(JournalRunnerMismatch):
        Journal.open(path, "runner-2")
    data = bytearray(path.read_bytes())
    for index, detail in ((0, "bad magic"), (8, "unsupported version"), (13, "bad header CRC")):
        damaged = bytearray(data)
        damaged[index] ^= 0x01
        with pytest.raises(JournalHeaderInvalid) as caught:
            scan_bytes(bytes(damaged))
        assert caught.value.fields["detail"] == detail
    with pytest.raises(JournalHeaderInvalid):
        scan_bytes(b"")
    with pytest.raises(JournalHeaderInvalid):
        journal.encode_header("")
    path.write_bytes(b"not a journal, a file left at its path")  # opened: named by its path
    with pytest.raises(JournalHeaderInvalid) as caught:
        Journal.open(path, "runner-1")
    assert caught.value.fields["path"] == str(path) and str(path) in str(caught.value)


def test_invalid_records_refused(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j", RUNNER) as j:
        j.append({"ok": True})  # control
        for bad in ([1, 2], {"x": float("nan")}, {"x": object()}):
            with pytest.raises(JournalRecordInvalid):
                j.append(bad)  # type: ignore[arg-type]
        with pytest.raises(JournalRecordInvalid):
            j.append({"x": "y" * journal.MAX_PAYLOAD})
        assert j.end == (tmp_path / "j").stat().st_size


def test_truncation_at_every_byte_returns_the_whole_record_prefix() -> None:
    records = make_records(8)
    data, boundaries = build(records)
    # Every cut from inside the fourth-last record to the end of the file.
    for cut in range(boundaries[-4] + 1, len(data) + 1):
        scan = scan_bytes(data[:cut])
        whole = max(i for i, b in enumerate(boundaries) if b <= cut)
        assert list(scan.records) == records[:whole]
        assert scan.end == boundaries[whole]
        if cut == boundaries[whole]:
            assert (scan.tail, scan.defect) == (Tail.CLEAN, Defect.NONE)
        else:
            assert scan.tail is Tail.TORN
            expected = Defect.SHORT_FRAME if cut - scan.end < 8 else Defect.LENGTH_PAST_EOF
            assert scan.defect is expected


def test_zero_filled_tail_is_torn_but_zeros_before_valid_frames_are_corrupt() -> None:
    records = make_records(4)
    data, boundaries = build(records)
    for zeros in (1, 7, 8, 4096):
        scan = scan_bytes(data + bytes(zeros))
        assert (scan.tail, scan.defect, scan.end) == (Tail.TORN, Defect.ZERO_FILL, len(data))
    # A partly written last frame followed by zeros (size extended, data never reached disk).
    torn = data[: boundaries[-1] - 5] + bytes(64)
    scan = scan_bytes(torn)
    assert (scan.tail, scan.end, len(scan.records)) == (Tail.TORN, boundaries[-2], 3)
    # The same zeros in the middle, with valid frames after them, are corruption.
    middle = data[: boundaries[2]] + bytes(32) + data[boundaries[2] :]
    scan = scan_bytes(middle)
    assert (scan.tail, scan.defect, scan.end) == (Tail.CORRUPT, Defect.BAD_LENGTH, boundaries[2])


def test_valid_crc_over_a_non_object_payload_is_corrupt() -> None:
    data, _ = build(make_records(2))
    payload = b"[1,2]"
    length = len(payload).to_bytes(4, "little")
    frame = length + journal.crc32c(length + payload).to_bytes(4, "little") + payload
    scan = scan_bytes(data + frame)
    assert (scan.tail, scan.defect, scan.end) == (Tail.CORRUPT, Defect.BAD_PAYLOAD, len(data))


def test_torn_tail_refuses_append_until_repaired(tmp_path: Path) -> None:
    path = tmp_path / "j"
    records = make_records(3)
    write_journal(path, records)
    clean_size = path.stat().st_size
    tail = journal.encode_frame({"seq": "in flight"})[:-3]
    with path.open("ab") as f:
        f.write(tail)
    with Journal.open(path, RUNNER) as j:
        assert (j.scan.tail, j.scan.end) == (Tail.TORN, clean_size)
        with pytest.raises(JournalTornTail) as caught:
            j.append({"seq": 3})
        assert caught.value.fields["offset"] == clean_size
        repair = j.repair()
        assert repair is not None
        assert (repair.offset, repair.length, repair.defect) == (
            clean_size,
            len(tail),
            Defect.LENGTH_PAST_EOF,
        )
        assert repair.quarantine.read_bytes() == tail
        assert repair.quarantine.name.startswith(f"j.quarantine-{clean_size}-")
        assert path.stat().st_size == clean_size
        assert j.repair() is None  # idempotent
        j.append({"seq": 3})
    assert list(scan_journal(path).records) == [*records, {"seq": 3}]


def test_a_repair_makes_the_quarantine_durable_before_it_cuts_and_the_cut_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order a power cut must not undo (DESIGN §9): the tail's copy fsynced and its
    directory entry committed, then the journal cut, then the cut fsynced. A process crash
    cannot tell a missing fsync, so the calls are recorded (as ``_dir_fsyncs`` does)."""
    path = tmp_path / "j"
    write_journal(path, make_records(3))
    with path.open("ab") as f:
        f.write(journal.encode_frame({"seq": "in flight"})[:-3])
    calls: list[tuple[str, str]] = []
    fsync, ftruncate = os.fsync, os.ftruncate

    def named(fd: int) -> str:
        return Path(os.readlink(f"/proc/self/fd/{fd}")).name

    def recording_fsync(fd: int) -> None:
        calls.append(("fsync", named(fd)))
        fsync(fd)

    def recording_ftruncate(fd: int, length: int) -> None:
        calls.append(("ftruncate", named(fd)))
        ftruncate(fd, length)

    with Journal.open(path, RUNNER) as j:
        monkeypatch.setattr(os, "fsync", recording_fsync)
        monkeypatch.setattr(os, "ftruncate", recording_ftruncate)
        repair = j.repair()
    assert repair is not None
    temp = f".{repair.quarantine.name}.tmp"
    assert calls == [
        ("fsync", temp),  # the copy's bytes
        ("fsync", tmp_path.name),  # its name, linked in the directory
        ("ftruncate", "j"),
        ("fsync", "j"),  # the cut
    ]


def test_corrupt_journal_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "j"
    write_journal(path, make_records(5))
    _, boundaries = build(make_records(5))
    data = bytearray(path.read_bytes())
    data[boundaries[2] + 12] ^= 0x40  # inside the third frame's payload
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as caught:
        Journal.open(path, RUNNER)
    assert caught.value.fields["offset"] == boundaries[2]
    assert caught.value.fields["defect"] == "bad_crc"
    assert path.read_bytes() == bytes(data)
    assert [p.name for p in tmp_path.iterdir()] == ["j"]
    # The lock was released with the refusal: a fixed file opens at once.
    data[boundaries[2] + 12] ^= 0x40
    path.write_bytes(bytes(data))
    Journal.open(path, RUNNER).close()


def test_second_opener_in_the_same_process_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "j"
    first = Journal.open(path, RUNNER)
    try:
        with pytest.raises(JournalLocked):
            Journal.open(path, RUNNER)
        first.append({"still": "writable"})
    finally:
        first.close()
    Journal.open(path, RUNNER).close()  # control: free again once closed


def test_closed_handle_refuses_appends(tmp_path: Path) -> None:
    j = Journal.open(tmp_path / "j", RUNNER)
    j.close()
    with pytest.raises(JournalBroken):
        j.append({"a": 1})


def test_failed_fsync_breaks_the_handle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal.open(tmp_path / "j", RUNNER)
    j.append({"a": 0})  # control

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "simulated fsync failure")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(JournalBroken):
        j.append({"a": 1})
    monkeypatch.undo()
    # After a failed fsync the page cache cannot be trusted: no retry on this handle.
    with pytest.raises(JournalBroken):
        j.append({"a": 2})
    # Reopening rescans what is really there.
    with Journal.open(tmp_path / "j", RUNNER) as again:
        assert again.scan.records[0] == {"a": 0}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=5), max_size=12))
def test_any_json_objects_round_trip(records: list[dict[str, Any]]) -> None:
    data, boundaries = build(records)
    scan = scan_bytes(data)
    assert list(scan.records) == records
    assert (scan.tail, scan.end) == (Tail.CLEAN, boundaries[-1])


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=8),
    data=st.data(),
)
def test_frames_after_a_verified_prefix_read_as_the_whole_file_reads_them(
    n: int, data: st.DataObject
) -> None:
    """A reader that kept a verified prefix (the file ledger's) verifies only what follows it
    (``scan_frames``): the records, the end and the tail class are the whole scan's, whatever
    damage follows (cut, zeroed, flipped bytes, junk appended)."""
    image, boundaries = build(make_records(n))
    damage = data.draw(st.sampled_from(["none", "cut", "zero", "flip", "junk"]))
    body = bytearray(image)
    if damage == "cut" and n:
        body = body[: data.draw(st.integers(boundaries[0] + 1, len(body) - 1))]
    elif damage in ("zero", "flip") and n:
        at = data.draw(st.integers(boundaries[0], len(body) - 1))
        body[at] = 0 if damage == "zero" else body[at] ^ 0xFF
    elif damage == "junk":
        body += data.draw(st.binary(min_size=1, max_size=40))
    whole = scan_bytes(bytes(body))
    kept = data.draw(st.integers(0, len(whole.records)))  # records a reader verified before
    start = boundaries[kept]
    frames = journal.scan_frames(bytes(body[start:]))
    assert list(frames.records) == list(whole.records[kept:])
    assert [start + at for at in frames.offsets] == list(whole.offsets[kept:])
    assert (start + frames.end, frames.tail, frames.defect) == (
        whole.end,
        whole.tail,
        whole.defect,
    )
    # The scan an open that trusts the prefix takes (the file ledger's append): the same,
    # with the header read again.
    after = journal.scan_after(bytes(body[:start]), start, bytes(body[start:]))
    assert after is not None
    assert (after.runner_id, after.version, after.size, after.after) == (
        whole.runner_id,
        whole.version,
        whole.size,
        start,
    )
    assert list(after.records) == list(whole.records[kept:])
    assert list(after.offsets) == list(whole.offsets[kept:])
    assert (after.end, after.tail, after.defect) == (whole.end, whole.tail, whole.defect)


def test_a_grouped_journal_is_never_scanned_after_a_prefix() -> None:
    """A version 2 segment's groups and carried records need the whole image: scan_after
    declines it (an open then scans the whole file). Control: version 1 is scanned."""
    for version, trusted in ((journal.VERSION_GROUPED, False), (journal.VERSION, True)):
        head = journal.encode_header(RUNNER, version=version)
        assert (journal.scan_after(head, len(head), b"") is not None) is trusted


@pytest.mark.timeout(60)
def test_scan_stays_linear_in_the_journal_size() -> None:
    # A guard, not a benchmark: a per-frame look at the rest of the file (quadratic) took
    # minutes at this size; a linear scan takes about a second.
    frame = journal.encode_frame({"seq": 1, "pad": "p" * 150})
    data = journal.encode_header(RUNNER) + frame * 50_000
    torn = data + frame[:-1]
    scan = scan_bytes(torn)
    assert (len(scan.records), scan.tail, scan.end) == (50_000, Tail.TORN, len(data))


# -- version 2: grouped frames, segments, rotation ------------------------------------------

GROUPED = journal.VERSION_GROUPED


def build_grouped(groups: list[list[dict[str, Any]]], carried: int = 0) -> tuple[bytes, list[int]]:
    """A version-2 image of ``groups`` (each one write) and where each frame ends; its header
    says ``carried`` records were carried forward (the first group, at a rotation)."""
    data = journal.encode_header(RUNNER, version=GROUPED, carried=carried)
    boundaries = [len(data)]
    for group in groups:
        start = len(data)
        for record in group:
            data += journal.encode_frame(record, group=start)
            boundaries.append(len(data))
    return data, boundaries


def test_grouped_frame_layout_names_where_its_group_began() -> None:
    frame = journal.encode_frame({"a": 1}, group=4242)
    payload, group = b'{"a":1}', (4242).to_bytes(8, "little")
    length = len(payload).to_bytes(4, "little")
    crc = journal.crc32c(length + group + payload).to_bytes(4, "little")
    assert frame == length + crc + group + payload
    assert (
        journal.encode_frame({"a": 1})
        == length + journal.crc32c(length + payload).to_bytes(4, "little") + payload
    )  # control: version 1 is unchanged


def test_grouped_append_is_one_group_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "j"
    records = make_records(5)
    with Journal.open(path, RUNNER, version=GROUPED) as j:
        first = j.append_payloads([journal.encode_payload(r) for r in records[:3]])
        second = j.append_payloads([journal.encode_payload(r) for r in records[3:]])
        end = j.end
    data = path.read_bytes()
    group_of = [int.from_bytes(data[o + 8 : o + 16], "little") for o in first + second]
    assert group_of == [first[0]] * 3 + [second[0]] * 2  # each frame names its group's start
    scan = scan_journal(path)
    assert (scan.version, scan.segment, scan.carried, scan.tail) == (GROUPED, 1, 0, Tail.CLEAN)
    assert list(scan.records) == records and list(scan.offsets) == first + second
    assert scan.end == end == len(data)
    with Journal.open(path, RUNNER) as j:  # an existing journal keeps its own format
        assert j.version == GROUPED
    write_journal(tmp_path / "v1", records)
    with Journal.open(tmp_path / "v1", RUNNER, version=GROUPED) as j:
        assert j.version == journal.VERSION


def test_grouped_header_checks() -> None:
    data = journal.encode_header(RUNNER, version=GROUPED, segment=7, carried=3)
    scan = scan_bytes(data)
    assert (scan.version, scan.segment, scan.carried, scan.records) == (GROUPED, 7, 3, ())
    segment_at = len(data) - 4 - 12  # segment u64 | carried u32 | CRC
    for index in (segment_at, segment_at + 8):
        damaged = bytearray(data)
        damaged[index] ^= 0x01
        with pytest.raises(JournalHeaderInvalid) as caught:
            scan_bytes(bytes(damaged))
        assert caught.value.fields["detail"] == "bad header CRC"
    with pytest.raises(JournalHeaderInvalid):
        journal.encode_header(RUNNER, version=3)


def test_grouped_truncation_at_every_byte_of_the_last_group() -> None:
    groups = [make_records(3), make_records(4)]
    records = groups[0] + groups[1]
    data, boundaries = build_grouped(groups)
    # Every cut inside the last group: its whole frames before the cut stay, the rest is torn.
    for cut in range(boundaries[3] + 1, len(data) + 1):
        scan = scan_bytes(data[:cut])
        whole = max(i for i, b in enumerate(boundaries) if b <= cut)
        assert list(scan.records) == records[:whole] and scan.end == boundaries[whole]
        assert scan.tail is (Tail.CLEAN if cut == boundaries[whole] else Tail.TORN)


def test_a_frame_whose_group_is_impossible_where_it_stands_is_corrupt() -> None:
    data, boundaries = build_grouped([make_records(2)])
    # A whole, CRC-valid frame naming a group that began after the last frame's group did
    # (and not at itself): no writer of this format puts it there.
    stray = journal.encode_frame({"seq": "stray"}, group=boundaries[1])
    scan = scan_bytes(data + stray)
    assert (scan.tail, scan.defect, scan.end) == (Tail.CORRUPT, Defect.BAD_GROUP, len(data))
    control = journal.encode_frame({"seq": "next"}, group=len(data))  # a new group, at itself
    assert scan_bytes(data + control).tail is Tail.CLEAN


def test_damage_inside_the_carried_group_is_corrupt_never_torn() -> None:
    """The carried group is fsynced before its segment takes the journal's name: a cut or a
    flipped bit inside it, even as the last group, is damage to acknowledged evidence, never a
    torn write to cut away (control: the same bytes as an ordinary last group are torn)."""
    carried = make_records(3)
    data, boundaries = build_grouped([carried], carried=3)
    ordinary, _ = build_grouped([carried])
    assert scan_bytes(data).tail is Tail.CLEAN and len(scan_bytes(data).records) == 3
    for cut in range(boundaries[0] + 1, len(data)):
        assert scan_bytes(ordinary[:cut]).tail in (Tail.TORN, Tail.CLEAN)  # control
        scan = scan_bytes(data[:cut])
        assert scan.tail is Tail.CORRUPT, cut
        if cut in boundaries:  # whole frames, but fewer than the header carried
            assert scan.defect is Defect.CARRIED_MISSING
    flipped = bytearray(data)
    flipped[boundaries[1] + 9] ^= 0x04  # inside the second carried frame
    assert scan_bytes(bytes(flipped)).tail is Tail.CORRUPT
    flipped_ordinary = bytearray(ordinary)
    flipped_ordinary[boundaries[1] + 9] ^= 0x04
    assert scan_bytes(bytes(flipped_ordinary)).tail is Tail.TORN  # control
    # After the carried group, the tail is judged as before: a torn write there stays torn.
    more, ends = build_grouped([carried, make_records(2)], carried=3)
    assert scan_bytes(more[: ends[4] + 5]).tail is Tail.TORN


def test_a_damaged_carried_group_stops_the_open_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j"
    old = Journal.open(path, RUNNER, version=GROUPED)
    old.append({"seq": "sealed"})
    new = old.rotate([journal.encode_payload({"seq": "kept", "n": n}) for n in range(2)])
    new.close()
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # inside the last carried frame, the segment's last bytes
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt):
        Journal.open(path, RUNNER)
    assert path.read_bytes() == bytes(data)  # nothing truncated, nothing quarantined


def test_rotate_replaces_the_journal_whole_and_locks_the_new_segment(tmp_path: Path) -> None:
    path = tmp_path / "j"
    write_journal(path, make_records(4))  # a version 1 journal (0.2) rotates to version 2
    old = Journal.open(path, RUNNER)
    carried = [journal.encode_payload({"seq": "kept", "n": n}) for n in range(2)]
    new = old.rotate(carried)
    try:
        scan = scan_journal(path)
        assert (scan.version, scan.segment, scan.carried) == (GROUPED, 1, 2)
        assert list(scan.records) == [{"seq": "kept", "n": 0}, {"seq": "kept", "n": 1}]
        with pytest.raises(JournalBroken):
            old.append({"a": 1})  # the sealed segment's handle is closed
        with pytest.raises(JournalLocked):
            Journal.open(path, RUNNER)  # locked before it got the name
        new.append({"seq": "after"})
        again = new.rotate([])
        assert again.segment == 2 and scan_journal(path).records == ()
    finally:
        new.close()
        again.close()
    assert [p.name for p in tmp_path.iterdir()] == ["j"]  # no temp file left


def test_rotate_failing_before_the_rename_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "j"
    write_journal(path, make_records(3))
    before = path.read_bytes()
    j = Journal.open(path, RUNNER)

    def failing_rename(src: Any, dst: Any) -> None:
        raise OSError(errno.ENOSPC, "simulated")

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(OSError):
        j.rotate([journal.encode_payload({"x": 1})])
    monkeypatch.undo()
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["j"]
    j.append({"still": "usable"})
    j.close()


def test_rotate_failing_after_the_rename_breaks_both_handles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "j"
    write_journal(path, make_records(3))
    j = Journal.open(path, RUNNER)

    def failing_fsync_dir(directory: Any) -> None:
        raise OSError(errno.EIO, "simulated")

    monkeypatch.setattr(framing_file, "fsync_dir", failing_fsync_dir)
    with pytest.raises(JournalBroken):
        j.rotate([journal.encode_payload({"x": 1})])
    monkeypatch.undo()
    with pytest.raises(JournalBroken):
        j.append({"a": 1})
    # The name holds the new segment, whole; whether the rename survives a power cut was
    # not known, so nothing was acknowledged in it: reopening rescans what is there.
    with Journal.open(path, RUNNER) as again:
        assert again.scan.records == ({"x": 1},)


def test_open_retries_when_the_journal_was_replaced_before_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "j"
    write_journal(path, make_records(1))
    answers = iter([False, True])
    monkeypatch.setattr(framing_file, "_still_named", lambda fd, p: next(answers))
    with Journal.open(path, RUNNER) as j:  # the first lock was on a replaced file: again
        assert j.scan.records == tuple(make_records(1))
    assert next(answers, None) is None


def test_open_removes_what_a_crashed_rotation_left(tmp_path: Path) -> None:
    path = tmp_path / "j"
    write_journal(path, make_records(2))
    stale = tmp_path / ".j.next-1-2"  # written (maybe partly) but never renamed into place
    stale.write_bytes(b"half a segment")
    with Journal.open(path, RUNNER) as j:
        assert j.scan.records == tuple(make_records(2))
    assert not stale.exists()


# -- the runner journal: group commit and rotation -------------------------------------------


def effect(kind: str, job_id: int, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "job_id": job_id, "effect_key": "k", "seq": 1, **extra}


def begun(job_id: int, attempt: str | None = None) -> Begun:
    """The begin ``effect("effect_begin", job_id)`` writes (by ``attempt``)."""
    return Begun(EffectRef(job_id, "k", 1), attempt)


async def test_concurrent_writes_share_fsyncs_and_keep_each_writers_order(tmp_path: Path) -> None:
    path = tmp_path / "w.journal"
    seen_on_disk: list[bool] = []
    with RunnerJournal.open(path, RUNNER) as j:

        async def writer(k: int) -> None:
            for n in range(25):
                await j.write({"writer": k, "n": n})
                # Returned: it is in the file (another reader sees it).
                seen_on_disk.append({"writer": k, "n": n} in scan_journal(path).records)

        async with anyio.create_task_group() as tg:
            for k in range(8):
                tg.start_soon(writer, k)
        assert j.stats.records == 200 and j.stats.groups < 200  # shared fsyncs
    assert all(seen_on_disk)
    records = scan_journal(path).records
    for k in range(8):
        assert [r["n"] for r in records if r["writer"] == k] == list(range(25))


async def test_a_failed_group_fails_each_of_its_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = RunnerJournal.open(tmp_path / "w.journal", RUNNER)
    await j.write({"a": 0})  # control
    with pytest.raises(JournalRecordInvalid):
        await j.write({"bad": float("nan")})  # refused alone, before any write

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "simulated fsync failure")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    failures: list[BaseException] = []

    async def writer(n: int) -> None:
        try:
            await j.write({"a": n})
        except JournalBroken as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for n in range(1, 5):
            tg.start_soon(writer, n)
    monkeypatch.undo()
    assert len(failures) == 4
    with pytest.raises(JournalBroken):
        await j.write({"a": 9})  # the handle is finished: reopen to rescan
    j.close()


async def test_a_writer_cancelled_meanwhile_has_its_record_written_then_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.journal"
    real_fsync = os.fsync
    with RunnerJournal.open(path, RUNNER) as j:
        # control: cancelled before the call, nothing is written
        with anyio.CancelScope() as early:
            early.cancel()
            await j.write({"cancelled": "before"})
        assert early.cancelled_caught and scan_journal(path).records == ()

        def slow_fsync(fd: int) -> None:
            time.sleep(0.2)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", slow_fsync)
        after: list[str] = []
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as scope:
                tg.start_soon(_cancel_soon, scope)
                await j.write({"cancelled": "during"})
                after.append("went on")  # pragma: no cover - the cancellation comes first
        assert scope.cancelled_caught and after == []
    assert scan_journal(path).records == ({"cancelled": "during"},)


async def _cancel_soon(scope: anyio.CancelScope) -> None:
    await anyio.sleep(0.05)
    scope.cancel()


# -- noted records: queued without waiting, carried by the next group --------------------------


async def test_a_noted_record_rides_the_next_write_in_queue_order(tmp_path: Path) -> None:
    path = tmp_path / "w.journal"
    with RunnerJournal.open(path, RUNNER) as j:
        await j.write({"n": 0})  # control: a write is on disk when it returns
        assert scan_journal(path).records == ({"n": 0},)
        j.note({"n": 1})
        assert scan_journal(path).records == ({"n": 0},)  # noted: nothing waited for it
        await j.write({"n": 2})  # one group carries both, the noted one first
        assert scan_journal(path).records == ({"n": 0}, {"n": 1}, {"n": 2})
        assert (j.stats.records, j.stats.groups, j.stats.noted) == (3, 2, 1)
        with pytest.raises(JournalRecordInvalid):
            j.note({"bad": float("nan")})  # refused when noted, nothing queued
        await j.write({"n": 3})
    assert scan_journal(path).records[-1] == {"n": 3} and len(scan_journal(path).records) == 4


async def test_flush_noted_writes_what_nothing_else_carried_within_its_linger(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.journal"
    with RunnerJournal.open(path, RUNNER) as j:
        async with anyio.create_task_group() as tg:
            tg.start_soon(j.flush_noted, 0.05)
            await anyio.sleep(0.2)
            assert j.stats.groups == 0  # nothing noted: no group, however long it waits
            j.note({"n": 1})
            j.note({"n": 2})
            assert scan_journal(path).records == ()

            async def written() -> bool:
                # the group's count, not the file: the file holds the records a moment
                # before the loop hears that the group's thread is done
                return j.stats.groups >= 1

            await wait_for(written, within=2, every=0.01)
            assert j.stats.groups == 1  # one group for both
            assert scan_journal(path).records == ({"n": 1}, {"n": 2})
            j.note({"n": 3})
            tg.cancel_scope.cancel()  # ending, it writes what is still noted
        assert scan_journal(path).records == ({"n": 1}, {"n": 2}, {"n": 3})


async def test_close_writes_what_is_still_noted(tmp_path: Path) -> None:
    path = tmp_path / "w.journal"
    with RunnerJournal.open(path, RUNNER) as j:
        j.note({"n": 1})
        assert scan_journal(path).records == ()
    assert scan_journal(path).records == ({"n": 1},)  # written and fsynced by close


async def test_a_rotation_failing_after_its_switch_breaks_the_runner_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker watches ``broken``: a rotation that fails once the new segment has the name
    sets it, as a failed write does, so the worker stops at once and its jobs say why."""
    j = RunnerJournal.open(tmp_path / "w.journal", RUNNER)
    await j.write({"n": 1})
    assert j.broken is None

    def failing_fsync_dir(directory: Any) -> None:
        raise OSError(errno.EIO, "simulated")

    monkeypatch.setattr(framing_file, "fsync_dir", failing_fsync_dir)
    with pytest.raises(JournalBroken):
        await j.rotate(set())
    monkeypatch.undo()
    assert isinstance(j.broken, JournalBroken)
    with anyio.fail_after(1):
        await j.wait_broken()
    with pytest.raises(JournalBroken):
        await j.write({"n": 2})
    j.close()


async def test_a_noted_record_lost_to_a_failed_group_breaks_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    j = RunnerJournal.open(tmp_path / "w.journal", RUNNER)

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "simulated fsync failure")

    j.note({"n": 1})
    monkeypatch.setattr(os, "fsync", failing_fsync)
    async with anyio.create_task_group() as tg:
        tg.start_soon(j.flush_noted, 0.01)

        async def logged() -> bool:  # the flusher says so: nobody waits for a noted record
            return "noted records not written" in caplog.text

        await wait_for(logged, within=2, every=0.01)
        tg.cancel_scope.cancel()
    monkeypatch.undo()
    with pytest.raises(JournalBroken):  # no write after it pretends the journal is whole
        await j.write({"n": 2})
    j.close()


async def test_rotation_carries_the_unrecorded_effects_and_drops_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "w.journal"
    with RunnerJournal.open(path, RUNNER) as j:
        for record in (
            {"type": "claim", "job_id": 1},
            effect("effect_begin", 1),
            effect("effect_outcome", 1, outcome="succeeded"),
            effect("effect_begin", 2),  # no outcome yet: in flight
            effect("effect_begin", 3),
            effect("effect_outcome", 3, outcome="failed_before_dispatch"),
            effect("effect_outcome", 3, outcome="unknown"),  # the latest outcome is carried
            {"type": "publish", "job_id": 1},
            effect("effect_outcome", 4, outcome="succeeded", reused=True),  # no begin here
        ):
            await j.write(record)
        assert j.begun() == [begun(1), begun(2), begun(3)]
        rotation = await j.rotate({begun(1)})  # the database recorded job 1's
        assert rotation is not None
        assert (rotation.segment, rotation.carried, rotation.dropped) == (2, 3, 6)
        carried = [effect("effect_begin", 2), effect("effect_begin", 3)]
        carried.append(effect("effect_outcome", 3, outcome="unknown"))
        assert list(j.scan.records) == carried
        # Nothing would be left behind now: no rotation.
        assert await j.rotate({begun(1)}) is None
        await j.write(effect("effect_outcome", 2, outcome="succeeded"))
        assert j.begun() == [begun(2), begun(3)]
        second = await j.rotate({begun(2), begun(3)})
        assert second is not None and (second.segment, second.carried) == (3, 0)
    scan = scan_journal(path)
    assert (scan.version, scan.segment, scan.carried, scan.records) == (GROUPED, 3, 0, ())


async def test_two_attempts_begins_of_one_ref_are_carried_each_on_its_own(tmp_path: Path) -> None:
    """A restore that rewinds job ids lets a new attempt begin the ref an old attempt's
    begin still names in the journal. Each begin is its own evidence: recording one (the
    control: it is left behind) never lets the other go, and each keeps its own outcome."""
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    with RunnerJournal.open(tmp_path / "w.journal", RUNNER) as j:
        for record in (
            effect("effect_begin", 5, attempt_id=old),
            effect("effect_outcome", 5, attempt_id=old, outcome="succeeded", receipt="r-old"),
            effect("effect_begin", 5, attempt_id=new),  # in flight when the worker stopped
        ):
            await j.write(record)
        assert j.begun() == [begun(5, old), begun(5, new)]
        # the database recorded the old attempt's row: only the new attempt's begin is carried
        rotation = await j.rotate({begun(5, old)})
        assert rotation is not None and rotation.carried == 1
        assert list(j.scan.records) == [effect("effect_begin", 5, attempt_id=new)]
        await j.write(effect("effect_outcome", 5, attempt_id=old, outcome="unknown"))
        assert j.begun() == [begun(5, new)]  # an outcome with no begin of its attempt: none
        # and the other way round: the new one recorded, the old one's begin and outcome stay
        await j.write(effect("effect_begin", 5, attempt_id=old))
        await j.write(effect("effect_outcome", 5, attempt_id=old, outcome="unknown"))
        await j.write(effect("effect_outcome", 5, attempt_id=new, outcome="succeeded"))
        rotation = await j.rotate({begun(5, new)})
        assert rotation is not None and rotation.carried == 2
        assert list(j.scan.records) == [
            effect("effect_begin", 5, attempt_id=old),
            effect("effect_outcome", 5, attempt_id=old, outcome="unknown"),
        ]


async def test_rotation_is_due_by_size_or_by_age(tmp_path: Path) -> None:
    with RunnerJournal.open(tmp_path / "a", RUNNER, segment_bytes=1000) as j:
        assert not j.rotation_due
        while j.end < 1000:
            await j.write({"pad": "p" * 90})
        assert j.rotation_due
        await j.rotate(set())
        assert not j.rotation_due
    with RunnerJournal.open(tmp_path / "b", RUNNER, segment_s=0.01) as j:
        await anyio.sleep(0.02)
        assert not j.rotation_due  # old, but nothing written since it began: nothing to drop
        await j.write({"a": 1})
        assert j.rotation_due


async def test_writes_during_a_rotation_land_in_one_segment_or_the_other(tmp_path: Path) -> None:
    path = tmp_path / "w.journal"
    with RunnerJournal.open(path, RUNNER) as j:
        acked: list[int] = []

        async def writer(k: int) -> None:
            for n in range(40):
                await j.write(effect("effect_begin", k * 1000 + n))
                acked.append(k * 1000 + n)

        async with anyio.create_task_group() as tg:
            for k in range(4):
                tg.start_soon(writer, k)
            for _ in range(5):
                await anyio.sleep(0.005)
                await j.rotate(set())  # nothing recorded: every begin is carried
    # Every acknowledged begin is in the live segment, once.
    jobs = [r["job_id"] for r in scan_journal(path).records]
    assert sorted(jobs) == sorted(acked) and len(jobs) == 160


async def test_a_0_2_journal_opens_as_it_is_and_its_first_rotation_migrates_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.journal"
    write_journal(path, [effect("effect_begin", 1), {"type": "claim", "job_id": 2}])
    with RunnerJournal.open(path, RUNNER) as j:
        assert j.version == journal.VERSION
        await j.write(effect("effect_begin", 3))  # appended as version 1 frames, one by one
        assert scan_journal(path).version == journal.VERSION
        rotation = await j.rotate(set())
        assert rotation is not None and rotation.dropped == 1
    scan = scan_journal(path)
    assert (scan.version, scan.carried) == (GROUPED, 2)
    assert [r["job_id"] for r in scan.records] == [1, 3]


# -- new directories are durable: each entry fsynced in its parent ---------------------------


def _dir_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Record the directories fsynced, in order (by the path their descriptor names)."""
    synced: list[Path] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return synced


def test_make_dirs_fsyncs_each_new_directorys_parent_top_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = _dir_fsyncs(monkeypatch)
    (tmp_path / "a").mkdir()  # exists already: its own entry committed again, once
    journal.make_dirs(tmp_path / "a" / "b" / "c")
    assert (tmp_path / "a" / "b" / "c").is_dir()
    assert synced == [tmp_path, tmp_path / "a", tmp_path / "a" / "b"]
    synced.clear()
    journal.make_dirs(tmp_path / "a" / "b" / "c")  # nothing new: one fsync, c's entry
    assert synced == [tmp_path / "a" / "b"]


def test_make_dirs_commits_a_directory_a_crashed_start_made_and_never_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that crashed between its mkdir and the parent's fsync left the directory with
    an entry nothing committed; the next start's make_dirs finds it existing and still
    fsyncs its parent (the old make_dirs took an existing directory as durable)."""
    (tmp_path / "journals").mkdir()  # the crashed start's mkdir, no fsync after it
    synced = _dir_fsyncs(monkeypatch)
    journal.make_dirs(tmp_path / "journals")
    assert synced == [tmp_path]


def test_make_dirs_leaves_an_existing_directory_whose_parent_it_may_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's directory (another user's) in a parent this process may only traverse:
    the start goes on, and a missing level under it is still created and committed. The
    same directory owned by this user may be a crashed start's: the start stops."""
    (tmp_path / "given").mkdir()
    real = journal.fsync_dir
    synced: list[Path] = []

    def refusing(directory: str | os.PathLike[str]) -> None:
        if Path(directory) == tmp_path:
            raise PermissionError(13, "Permission denied", str(directory))
        synced.append(Path(directory))
        real(directory)

    monkeypatch.setattr(framing_file, "fsync_dir", refusing)
    with pytest.raises(PermissionError):  # ours: it may be a crashed start's
        journal.make_dirs(tmp_path / "given" / "journals")
    assert synced == []
    owner = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # now another user's
    journal.make_dirs(tmp_path / "given" / "journals")
    assert (tmp_path / "given" / "journals").is_dir()
    assert synced == [tmp_path / "given"]  # the new level's entry, committed
    with pytest.raises(PermissionError):  # a new level's parent must be committed
        journal.make_dirs(tmp_path / "new")


def test_an_object_store_commits_fans_a_crashed_process_left_before_its_first_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that crashed between a fan directory's mkdir and the root's fsync left the
    fan; a later put opens it (it exists) and fsyncs only the fan, so the fan's own entry
    needs the root fsynced the first time a store uses that fan, before its object's name
    is committed, and also when the object is found already stored. The old store never
    did: a power cut then took the fan with the objects in it."""
    from accord.jobs.runner.objects import LocalDirStore, key_for

    root = tmp_path / "objects"

    def in_fan(fan: str, tag: bytes) -> bytes:
        return next(d for i in range(10_000) if key_for(d := tag + b"%d" % i)[7:9] == fan)

    fan = root / key_for(b"x")[7:9]
    fan.mkdir(parents=True)  # the crashed process's mkdirs, no fsync after them
    synced = _dir_fsyncs(monkeypatch)
    store = LocalDirStore(root)
    store.put(b"x")
    assert synced == [root, fan]  # the fan's entry, then the object's name
    synced.clear()
    store.put(in_fan(fan.name, b"y"))  # control: once per fan and store, not per put
    assert synced == [fan]

    # A fan whose object is already there (a crashed put linked it): found stored, and the
    # fan's entry still committed first.
    other = root / "ff" if fan.name != "ff" else root / "fe"
    data = in_fan(other.name, b"z")
    other.mkdir()
    (other / key_for(data)).write_bytes(data)
    synced.clear()
    assert LocalDirStore(root).put(data) == key_for(data)
    assert synced == [root, other]


@pytest.mark.parametrize("opener", ["runner journal", "authority ledger", "object store"])
def test_a_start_in_a_new_directory_commits_that_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opener: str
) -> None:
    """A journal (or ledger, or object) in a directory the start creates: a power cut after
    the first acknowledged write must not lose the directory's entry, and with it the file."""
    from accord.jobs.ledger import FileLedger, LedgerRecord, LedgerWhy
    from accord.jobs.runner.objects import LocalDirStore
    from accord.jobs.runner.recovery import open_journal

    base = tmp_path / "state"
    synced = _dir_fsyncs(monkeypatch)
    if opener == "runner journal":
        open_journal(base / "journals" / "r.journal", "runner-1").close()
        made = base / "journals"
    elif opener == "authority ledger":
        ledger = FileLedger(base / "ledgers" / "authority.ledger")
        ledger.append_sync(LedgerRecord(tenant="t", epoch=1, frozen=False, why=LedgerWhy.ROTATE))
        made = base / "ledgers"
    else:
        key = LocalDirStore(base / "objects").put(b"x")
        made = base / "objects" / key[7:9]
    assert base in synced and tmp_path in synced  # base's entry, then the new leaf's
    assert made.parent in synced
