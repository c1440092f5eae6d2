"""The framed file's bytes: header and frame encoding, and the scan that verifies a journal image
and classifies its tail (pure: no file is touched here; see jobs.framing for the format).
"""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

import google_crc32c
from pydantic import BaseModel

from accord.jobs.errors import JournalHeaderInvalid, JournalRecordInvalid

MAGIC = b"ACCJRNL\x00"
#: One frame in flight at a time: the ledger, and runner journals written by 0.2.
VERSION = 1
#: Frames written in groups (one write, one fsync each): runner journal segments.
VERSION_GROUPED = 2
MAX_RUNNER_ID_BYTES = 255
# The smallest payload is "{}"; anything above MAX_PAYLOAD is an impossible length.
MIN_PAYLOAD = 2
MAX_PAYLOAD = 1 << 20
_HEADER = struct.Struct("<8sHH")
_SEGMENT = struct.Struct("<QI")
_FRAME = struct.Struct("<II")
_GROUP = struct.Struct("<Q")
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
    BAD_GROUP = "bad_group"
    # A version 2 segment holds fewer whole records than its header says were carried.
    CARRIED_MISSING = "carried_missing"


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
    version: int = VERSION
    # Version 2: the segment's number and how many records at its start were carried forward.
    segment: int = 0
    carried: int = 0
    # Where each record's frame begins (records[i] at offsets[i]); 8 bytes a record.
    offsets: Sequence[int] = ()
    # Where the verification began: 0 for a whole image; after a prefix verified before
    # (scan_after), that prefix's end, and records and offsets hold only what follows it.
    after: int = 0

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


class _Head(NamedTuple):
    runner_id: str
    version: int
    segment: int
    carried: int
    end: int


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, hardware-accelerated where google-crc32c can."""
    return int(google_crc32c.value(data))


def encode_header(
    runner_id: str, *, version: int = VERSION, segment: int = 1, carried: int = 0
) -> bytes:
    raw = runner_id.encode("utf-8")
    if not raw or len(raw) > MAX_RUNNER_ID_BYTES:
        raise JournalHeaderInvalid("runner id must be 1-255 bytes of UTF-8", runner_id=runner_id)
    head = _HEADER.pack(MAGIC, version, len(raw)) + raw
    if version == VERSION_GROUPED:
        head += _SEGMENT.pack(segment, carried)
    elif version != VERSION:
        raise JournalHeaderInvalid(detail="unsupported version", version=version)
    return head + _U32.pack(crc32c(head))


def encode_payload(record: Mapping[str, Any] | BaseModel) -> bytes:
    """The payload of ``record`` (a JSON object, or a journal record model), checked."""
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
    return payload


def frame_payload(payload: bytes, group: int | None = None) -> bytes:
    """The frame of an encoded payload: version 1 without ``group``, else version 2 in the
    group that began at offset ``group``."""
    length = _U32.pack(len(payload))
    if group is None:
        return length + _U32.pack(crc32c(length + payload)) + payload
    at = _GROUP.pack(group)
    return length + _U32.pack(crc32c(length + at + payload)) + at + payload


def encode_frame(record: Mapping[str, Any] | BaseModel, *, group: int | None = None) -> bytes:
    """One frame for ``record`` (a JSON object, or a journal record model)."""
    return frame_payload(encode_payload(record), group)


def _parse_header(data: bytes) -> _Head:
    if len(data) < _HEADER.size:
        raise JournalHeaderInvalid(detail="short header", size=len(data))
    magic, version, n = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise JournalHeaderInvalid(detail="bad magic")
    if version not in (VERSION, VERSION_GROUPED):
        raise JournalHeaderInvalid(detail="unsupported version", version=version)
    end = _HEADER.size + n + (_SEGMENT.size if version == VERSION_GROUPED else 0)
    if len(data) < end + _U32.size:
        raise JournalHeaderInvalid(detail="short header", size=len(data))
    if _U32.unpack_from(data, end)[0] != crc32c(data[:end]):
        raise JournalHeaderInvalid(detail="bad header CRC")
    try:
        runner_id = data[_HEADER.size : _HEADER.size + n].decode("utf-8")
    except UnicodeDecodeError as exc:  # pragma: no cover - the CRC held, so we wrote it
        raise JournalHeaderInvalid(detail="runner id not UTF-8") from exc
    segment, carried = (0, 0)
    if version == VERSION_GROUPED:
        segment, carried = _SEGMENT.unpack_from(data, _HEADER.size + n)
    return _Head(runner_id, version, segment, carried, end + _U32.size)


def _head_size(grouped: bool) -> int:
    return _FRAME.size + (_GROUP.size if grouped else 0)


def _frame_fits(data: bytes, pos: int, grouped: bool) -> tuple[int, int] | None:
    """(length, stored CRC) when a frame header at ``pos`` has a possible length inside the file."""
    head = _head_size(grouped)
    if len(data) - pos < head:
        return None
    length, crc = _FRAME.unpack_from(data, pos)
    if length < MIN_PAYLOAD or length > MAX_PAYLOAD or pos + head + length > len(data):
        return None
    return length, crc


def _crc_holds(data: bytes, pos: int, length: int, crc: int, grouped: bool) -> bool:
    # The CRC covers everything in the frame but itself: length, (group,) payload.
    covered = data[pos : pos + 4] + data[pos + _FRAME.size : pos + _head_size(grouped) + length]
    return crc32c(covered) == crc


def _group(data: bytes, pos: int) -> int:
    return int(_GROUP.unpack_from(data, pos + _FRAME.size)[0])


def _read_frame(data: bytes, pos: int, grouped: bool) -> tuple[Defect, dict[str, Any] | None, int]:
    """The frame at ``pos``: (NONE, record, next offset) or (defect, None, pos)."""
    head = _head_size(grouped)
    if len(data) - pos < head:
        return Defect.SHORT_FRAME, None, pos
    length, crc = _FRAME.unpack_from(data, pos)
    if length < MIN_PAYLOAD or length > MAX_PAYLOAD:
        return Defect.BAD_LENGTH, None, pos
    if pos + head + length > len(data):
        return Defect.LENGTH_PAST_EOF, None, pos
    if not _crc_holds(data, pos, length, crc, grouped):
        return Defect.BAD_CRC, None, pos
    start = pos + head
    try:
        record = json.loads(data[start : start + length].decode("utf-8"))
    except ValueError:
        return Defect.BAD_PAYLOAD, None, pos
    if not isinstance(record, dict):
        return Defect.BAD_PAYLOAD, None, pos
    return Defect.NONE, record, start + length


def _valid_frame_after(data: bytes, pos: int) -> int | None:
    """Version 1: the offset of the first frame after ``pos`` whose CRC holds, if any.

    Any such frame means the damage at ``pos`` is not a torn last write (only the last frame
    can be in flight), so truncating there would drop acknowledged records.
    """
    for candidate in range(pos + 1, len(data) - _FRAME.size - MIN_PAYLOAD + 1):
        fits = _frame_fits(data, candidate, False)
        if fits is not None and _crc_holds(data, candidate, *fits, False):
            return candidate
    return None


def _later_group_after(data: bytes, bad: int) -> int | None:
    """Version 2: the offset of a valid frame after ``bad`` whose group began after ``bad``.

    Such a frame proves ``bad`` was durable once (a group is written only after the one before
    it was fsynced), so truncating there would drop acknowledged records. Valid frames whose
    group began at or before ``bad`` are of ``bad``'s own group, written by the same write and
    never acknowledged if the damage is a torn write: they are stepped over, not evidence.
    """
    head = _head_size(True)
    pos = bad + 1
    while pos <= len(data) - head - MIN_PAYLOAD:
        fits = _frame_fits(data, pos, True)
        if fits is None or not _crc_holds(data, pos, *fits, True):
            pos += 1
            continue
        group = _group(data, pos)
        if bad < group <= pos:
            return pos
        # A group that begins after its own frame is no frame we wrote: look further.
        pos = pos + 1 if group > pos else pos + head + fits[0]
    return None


def _tail(data: bytes, pos: int, defect: Defect, grouped: bool) -> tuple[Tail, Defect]:
    if data.count(0, pos) == len(data) - pos:
        return Tail.TORN, Defect.ZERO_FILL  # a frame is never all zeros: the tail is unwritten
    if defect in (Defect.BAD_PAYLOAD, Defect.BAD_GROUP):
        return Tail.CORRUPT, defect  # its CRC holds: written whole, and not by us
    later = _later_group_after(data, pos) if grouped else _valid_frame_after(data, pos)
    return (Tail.TORN if later is None else Tail.CORRUPT), defect


def scan_bytes(data: bytes) -> JournalScan:
    """Verify a whole journal image: its header, the verified prefix and its tail class.

    Pure. Raises JournalHeaderInvalid for a bad header; a corrupt body is a classification,
    not an exception (:meth:`Journal.open` turns it into JournalCorrupt).
    """
    head = _parse_header(data)
    grouped = head.version == VERSION_GROUPED
    pos = group = head.end
    records: list[dict[str, Any]] = []
    offsets = array("q")

    def scan(end: int, tail: Tail, defect: Defect) -> JournalScan:
        return JournalScan(
            head.runner_id,
            tuple(records),
            end,
            len(data),
            tail,
            defect,
            version=head.version,
            segment=head.segment,
            carried=head.carried,
            offsets=offsets,
        )

    while pos < len(data):
        defect, record, nxt = _read_frame(data, pos, grouped)
        if record is not None and grouped:
            # A frame begins its group or continues the current one; anything else is not ours.
            at = _group(data, pos)
            if at not in (pos, group):
                defect, record = Defect.BAD_GROUP, None
            group = at
        if record is None:
            tail, defect = _tail(data, pos, defect, grouped)
            if len(records) < head.carried:
                # The carried group was fsynced before its segment took the journal's name:
                # damage inside it was never a torn write, and cutting it would drop the
                # evidence of effects the database has not recorded.
                tail = Tail.CORRUPT
            return scan(pos, tail, defect)
        records.append(record)
        offsets.append(pos)
        pos = nxt
    if len(records) < head.carried:
        return scan(pos, Tail.CORRUPT, Defect.CARRIED_MISSING)
    return scan(pos, Tail.CLEAN, Defect.NONE)


class Frames(NamedTuple):
    """Version 1 frames verified after a prefix already verified (:func:`scan_frames`)."""

    records: tuple[dict[str, Any], ...]
    # Where each record's frame begins in ``data``.
    offsets: tuple[int, ...]
    # Bytes of ``data`` they take: the verified prefix now ends that much further on.
    end: int
    tail: Tail
    defect: Defect


def scan_frames(data: bytes) -> Frames:
    """Verify ``data``, the bytes of a version 1 journal that follow a prefix already verified
    (so it begins at a frame boundary), and classify what follows the frames that hold, as
    :func:`scan_bytes` would classify it in the whole file: a reader that keeps what it
    verified reads only what was appended since. Pure."""
    pos = 0
    records: list[dict[str, Any]] = []
    offsets: list[int] = []
    while pos < len(data):
        defect, record, nxt = _read_frame(data, pos, False)
        if record is None:
            tail, defect = _tail(data, pos, defect, False)
            return Frames(tuple(records), tuple(offsets), pos, tail, defect)
        records.append(record)
        offsets.append(pos)
        pos = nxt
    return Frames(tuple(records), tuple(offsets), pos, Tail.CLEAN, Defect.NONE)


#: Enough of a file's first bytes to hold any header (its runner id at the longest).
HEADER_MAX = _HEADER.size + MAX_RUNNER_ID_BYTES + _SEGMENT.size + _U32.size


def scan_after(head: bytes, end: int, rest: bytes) -> JournalScan | None:
    """The scan of a version 1 journal whose first ``end`` bytes were verified before:
    ``head`` its first bytes (the header at least), ``rest`` every byte from ``end`` on. The
    header is verified again and the frames of ``rest`` as :func:`scan_frames` verifies them;
    the scan holds only their records (``after`` is ``end``; offsets from the file's start).
    None for a version 2 journal, whose groups and carried records need the whole image.
    Pure; raises JournalHeaderInvalid for a bad header."""
    h = _parse_header(head)
    if h.version != VERSION:
        return None
    frames = scan_frames(rest)
    return JournalScan(
        h.runner_id,
        frames.records,
        end + frames.end,
        end + len(rest),
        frames.tail,
        frames.defect,
        version=VERSION,
        offsets=tuple(end + o for o in frames.offsets),
        after=end,
    )


def head_size(version: int) -> int:
    """The bytes of a frame before its payload, in format ``version``."""
    return _head_size(version == VERSION_GROUPED)


def payload_length(head: bytes) -> int:
    """The payload length a frame's first bytes state (unchecked until its CRC holds)."""
    return int(_FRAME.unpack_from(head)[0])


def verified_payload(frame: bytes, version: int) -> bytes | None:
    """The payload of the whole frame ``frame`` (format ``version``) if its CRC holds, else None."""
    grouped = version == VERSION_GROUPED
    fits = _frame_fits(frame, 0, grouped)
    if fits is None or not _crc_holds(frame, 0, *fits, grouped):
        return None
    return frame[_head_size(grouped) :]
