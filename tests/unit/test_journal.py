"""The runner journal's format, tail classification, repair and records (no services)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

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


@pytest.mark.timeout(60)
def test_scan_stays_linear_in_the_journal_size() -> None:
    # A guard, not a benchmark: a per-frame look at the rest of the file (quadratic) took
    # minutes at this size; a linear scan takes about a second.
    frame = journal.encode_frame({"seq": 1, "pad": "p" * 150})
    data = journal.encode_header(RUNNER) + frame * 50_000
    torn = data + frame[:-1]
    scan = scan_bytes(torn)
    assert (len(scan.records), scan.tail, scan.end) == (50_000, Tail.TORN, len(data))
