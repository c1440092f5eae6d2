"""The framed file: an append-only, checksummed, fsynced local log (the runner journal's format,
and the file authority ledger's: jobs.runner and jobs.ledger both build on it).

Invariant it owns: every record :meth:`Journal.append` (or :meth:`Journal.append_payloads`)
returned for is on disk and is returned, in order, by every later scan; bytes after the verified
prefix are never dropped unless they are a *torn* tail, and then only after a copy of them is
fsynced to a quarantine file. A journal is only ever replaced whole (:meth:`Journal.rotate`).

Format (integers little-endian)::

    header v1  magic "ACCJRNL\\0" | version u16 = 1 | runner id length u16 | runner id (UTF-8)
               | CRC-32C u32 of everything before it
    header v2  magic | version u16 = 2 | runner id length u16 | runner id | segment u64
               | carried u32 | CRC-32C u32 of everything before it
    frame v1   length u32 | CRC-32C u32 of (length + payload) | payload (JSON object)
    frame v2   length u32 | CRC-32C u32 of (length + group + payload) | group u64 | payload

Version 1 (the ledger, and runner journals written by 0.2) writes one frame at a time, each
fsynced before the next is written, so a crash or power cut can only tear the *last* frame.
Version 2 (runner journal segments) writes a *group* of frames with one write and one fsync
(group commit), and writes the next group only once that fsync returned, so at most one group
is in flight. Each frame of a group names the offset where its group began: a frame of the
unacknowledged last group (its group began at or before the damage) can then be told from a
frame of a later group, which only a prefix that was durable once can precede. The v2 header
also numbers the segment and counts the records at its start that were carried forward from
the segment it replaced (jobs.runner.journal).

The reader classifies what follows the verified prefix (which ends at offset P) as

* ``clean``   nothing follows;
* ``torn``    a short frame, a zero-filled tail, a length past end-of-file or a bad CRC, with
              no valid frame after it (v1), or with only valid frames of P's own group after it
              (v2: their group began at or before P): repairable (quarantine, then truncate);
* ``corrupt`` a bad frame followed by a valid frame (v1) or by a valid frame of a later group
              (v2: its group began after P), or a frame whose CRC holds but whose payload is
              not a JSON object (v2: or whose group offset is impossible where it stands):
              fatal, reported with its offset, never truncated.

The header is written to a temporary file, fsynced and hard-linked into place (then the
directory is fsynced), so a journal either exists with a whole header or not at all. A CRC
detects accidents, not malice. The journal is evidence for reconciliation, not a replacement
for the database.

Here: :mod:`.format` the bytes (encoding, the scan and its tail classes; pure) and
:mod:`.file` the file on disk (created, locked, appended, repaired, rotated).
"""

from accord.jobs.framing.file import (
    Journal,
    Verified,
    fsync_dir,
    make_dirs,
    quarantine_tail,
    read_after,
    scan_journal,
    truncate_journal,
)
from accord.jobs.framing.format import (
    MAGIC,
    MAX_PAYLOAD,
    MAX_RUNNER_ID_BYTES,
    MIN_PAYLOAD,
    VERSION,
    VERSION_GROUPED,
    Defect,
    Frames,
    JournalScan,
    Repair,
    Tail,
    crc32c,
    encode_frame,
    encode_header,
    encode_payload,
    frame_payload,
    scan_after,
    scan_bytes,
    scan_frames,
)

__all__ = [
    "MAGIC",
    "MAX_PAYLOAD",
    "MAX_RUNNER_ID_BYTES",
    "MIN_PAYLOAD",
    "VERSION",
    "VERSION_GROUPED",
    "Defect",
    "Frames",
    "Journal",
    "JournalScan",
    "Repair",
    "Tail",
    "Verified",
    "crc32c",
    "encode_frame",
    "encode_header",
    "encode_payload",
    "frame_payload",
    "fsync_dir",
    "make_dirs",
    "quarantine_tail",
    "read_after",
    "scan_after",
    "scan_bytes",
    "scan_frames",
    "scan_journal",
    "truncate_journal",
]
