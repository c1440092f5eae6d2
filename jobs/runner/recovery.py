"""Starting a worker honestly: its journal opened (torn tail repaired, corrupt refused), the
effects it began in an earlier run whose outcome the database never recorded reported, and the
segment they were found in sealed, carrying exactly those forward (jobs.runner.journal).

The journal is evidence, not authority: an effect listed here needs reconciliation against
the provider (its idempotency key names the request), never a blind redo. What the database
says of a begin's own attempt (its outcome recorded, its effects pruned with a tombstone, or
its note acknowledged by a person) is the only reason a journal record is ever left behind
by a rotation.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from accord.jobs.errors import JournalRecordInvalid, JournalUnavailable
from accord.jobs.framing import Journal, Tail, make_dirs
from accord.jobs.runner import sql
from accord.jobs.runner.journal import (
    DEFAULT_SEGMENT_BYTES,
    DEFAULT_SEGMENT_S,
    Rotation,
    RunnerJournal,
    effect_of,
)
from accord.jobs.runner.journal_records import (
    Begun,
    EffectRef,
    RecordType,
    UnrecordedEffect,
    unrecorded_effects,
)

log = logging.getLogger("accord.worker")
_EFFECT_TYPES = frozenset({RecordType.EFFECT_BEGIN.value, RecordType.EFFECT_OUTCOME.value})


def open_journal(
    path: str | os.PathLike[str],
    runner_id: str,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    segment_s: float = DEFAULT_SEGMENT_S,
) -> RunnerJournal:
    """Open (creating) and lock this runner's journal; a torn tail is quarantined and cut,
    a corrupt one is refused (JournalCorrupt, JournalLocked, JournalRunnerMismatch). Reads
    the live segment only: what its start needs, never the history rotations left behind.
    A path that cannot be created or opened is JournalUnavailable (one line at a start)."""
    journal_path = Path(path)
    try:
        make_dirs(journal_path.parent)
        journal = RunnerJournal.open(
            journal_path, runner_id, segment_bytes=segment_bytes, segment_s=segment_s
        )
    except OSError as exc:
        raise JournalUnavailable(path=str(journal_path), detail=str(exc)) from exc
    if journal.scan.tail is Tail.TORN:
        try:  # the quarantine copy and the cut write: a full disk is this start's end
            repair = journal.repair()
        except OSError as exc:
            journal.close()
            raise JournalUnavailable(path=str(journal_path), detail=str(exc)) from exc
        if repair is not None:
            log.warning(
                "journal tail was torn: %d bytes at offset %d (%s) quarantined in %s",
                repair.length,
                repair.offset,
                repair.defect,
                repair.quarantine,
            )
    return journal


async def settled_effects(conn: Any, begun: Collection[Begun]) -> set[Begun]:
    """Read-only, one query: of the begins ``begun``, those the journal may let go, by what
    the database says of each begin's own attempt (``sql.SETTLED_EFFECTS``): an outcome
    recorded on the row it began; its effects removed by retention, resolved (a tombstone in
    jobs.pruned_attempts, 0054); its note acknowledged by a person (0054); or, never noted,
    its job gone at or below what retention removed before 0054 (jobs.pruned). A begin whose
    attempt is unknown, whose row another attempt holds (a job id a restore rewound and a new
    job took), or whose attempt the database never saw, stays evidence: job ids alone never
    let one go (before 0054 a new job that took a rewound id, once pruned, did)."""
    known = [(entry, attempt) for entry in begun if (attempt := _uuid(entry.attempt_id))]
    if not known:
        return set()
    rows = await conn.fetch(
        sql.SETTLED_EFFECTS,
        [entry.ref.job_id for entry, _ in known],
        [entry.ref.effect_key for entry, _ in known],
        [entry.ref.seq for entry, _ in known],
        [attempt for _, attempt in known],
    )
    found = {(r["job_id"], r["effect_key"], r["seq"], r["attempt_id"]) for r in rows}
    return {
        entry
        for entry, attempt in known
        if (entry.ref.job_id, entry.ref.effect_key, entry.ref.seq, attempt) in found
    }


async def note_evidence(
    conn: Any, runner_id: str, found: Sequence[UnrecordedEffect]
) -> list[UnrecordedEffect]:
    """Note in jobs.journal_evidence (0054) each of ``found`` whose attempt began no effect row
    in this database (a restore's doing; a pending row of its own attempt is the database's
    own record and is not noted), idempotently; ``found`` with each note's id (none when the
    database takes no writes: logged, noted at a later start)."""
    if not found:
        return []
    begins = [entry.begin for entry in found]
    try:
        rows = await conn.fetch(
            sql.NOTE_EVIDENCE,
            runner_id,
            [b.tenant for b in begins],
            [b.job_id for b in begins],
            [b.effect_key for b in begins],
            [b.seq for b in begins],
            [b.attempt_id for b in begins],
            [b.idempotency_key for b in begins],
        )
    except asyncpg.ReadOnlySQLTransactionError:
        # A standby, or a primary stepping down: the journal keeps every begin whatever the
        # notes say (a note only shows it and lets a person let it go), so the start goes on
        # as it did before notes existed, and the next start notes them.
        log.warning("journal evidence not noted: the database takes no writes (next start)")
        return list(found)
    notes = {
        (EffectRef(r["job_id"], r["effect_key"], r["seq"]), r["attempt_id"]): r["evidence_id"]
        for r in rows
    }
    return [
        dataclasses.replace(e, evidence_id=notes.get((e.ref, e.begin.attempt_id))) for e in found
    ]


def _uuid(attempt: str | None) -> uuid.UUID | None:
    """An attempt id as a UUID (None when absent or not one)."""
    try:
        return uuid.UUID(attempt) if attempt else None
    except ValueError:
        return None


async def report_unrecorded(conn: Any, journal: RunnerJournal | Journal) -> list[UnrecordedEffect]:
    """Effects the journal says were begun whose outcome the database does not hold (still
    pending, no row, a row of another attempt, the job gone though retention never removed
    it), logged one by one and returned (``settled_effects`` says which the journal may let
    go). Writes only the notes of a restore's evidence (``note_evidence``, 0054): each begin
    its attempt began no row of, which the journal then keeps until a person acknowledges it
    (`accord repair acknowledge-evidence --id N`, N logged here).

    A publish in the journal is not taken as proof: the database a worker starts on may be
    a restore from before it (before 0047 such a start let the begin go, the only evidence
    that the call went out); and a job retention removed is known by jobs.pruned, published
    or not (before, one that failed and was pruned while its worker was down was reported,
    and carried, at every start)."""
    records = journal.scan.records
    asked: set[Begun] = set()  # each begin, by its ref and its attempt
    for record in records:
        kind, begun = effect_of(record)
        if kind == RecordType.EFFECT_BEGIN.value and begun is not None:
            asked.add(begun)
        elif begun is None and record.get("type") in _EFFECT_TYPES:
            # Not indexed, so never carried: refuse the start rather than report it once.
            raise JournalRecordInvalid(
                type=record.get("type"), detail="job_id, effect_key or seq is not int, str, int"
            )
    recorded = await settled_effects(conn, asked)
    # Only the records of effects the database has not recorded are parsed (the cost grows
    # with unresolved work, not with the segment): a record of a recorded begin cannot be in
    # the answer, and one whose other fields are missing or malformed is still refused.
    candidates = [r for r in records if _unrecorded_candidate(r, recorded)]
    found = await note_evidence(
        conn, journal.scan.runner_id, unrecorded_effects(candidates, recorded)
    )
    for entry in found:
        begin, outcome = entry.begin, entry.journal_outcome
        log.warning(
            "effect begun but its outcome is not in the database: tenant=%s job=%s key=%s"
            " seq=%s attempt=%s idempotency_key=%s journal_outcome=%s receipt=%s evidence=%s",
            begin.tenant,
            begin.job_id,
            begin.effect_key,
            begin.seq,
            begin.attempt_id,
            begin.idempotency_key,
            None if outcome is None else outcome.outcome,
            None if outcome is None else outcome.receipt,
            entry.evidence_id,
        )
    return found


async def seal_at_start(
    journal: RunnerJournal, unrecorded: Sequence[UnrecordedEffect]
) -> Rotation | None:
    """Begin this run on a new segment that carries exactly ``unrecorded`` (what
    :func:`report_unrecorded` found, begins with their journal outcomes); the segment they
    were found in holds nothing else that can still matter and goes. Before any claim."""
    keep = {entry.begun for entry in unrecorded}
    try:
        rotation = await journal.rotate({b for b in journal.begun() if b not in keep})
    except OSError as exc:  # before the switch (a full disk): the live segment is as it was
        raise JournalUnavailable(path=str(journal.path), detail=str(exc)) from exc
    _log_rotation(journal, rotation, "start")
    return rotation


async def rotate_journal(conn: Any, journal: RunnerJournal) -> Rotation | None:
    """Seal the live segment while running: asks the database which of its effects have a
    recorded outcome (writes go on meanwhile), then carries every other one forward (writes
    wait for that alone). Raises what the query raises, changing nothing."""
    recorded = await settled_effects(conn, journal.begun())
    rotation = await journal.rotate(recorded)
    _log_rotation(journal, rotation, "size")
    return rotation


def _log_rotation(journal: RunnerJournal, rotation: Rotation | None, why: str) -> None:
    if rotation is not None:
        log.info(
            "journal rotated (%s): segment=%d carried=%d dropped=%d sealed_bytes=%d path=%s",
            why,
            rotation.segment,
            rotation.carried,
            rotation.dropped,
            rotation.sealed_bytes,
            journal.path,
        )


def _unrecorded_candidate(record: dict[str, Any], recorded: set[Begun]) -> bool:
    """Whether ``record`` is an effect record whose begin the database did not record."""
    if record.get("type") not in _EFFECT_TYPES:
        return False
    _, begun = effect_of(record)
    return begun not in recorded
