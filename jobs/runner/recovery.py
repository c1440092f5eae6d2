"""Starting a worker honestly: its journal opened (torn tail repaired, corrupt refused) and
the effects it began in an earlier run whose outcome the database never recorded, reported.

The journal is evidence, not authority: an effect listed here needs reconciliation against
the provider (its idempotency key names the request), never a blind redo.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from accord.jobs.framing import Journal, Tail
from accord.jobs.runner import sql
from accord.jobs.runner.journal_records import EffectRef, UnrecordedEffect, unrecorded_effects

log = logging.getLogger("accord.worker")


def open_journal(path: str | os.PathLike[str], runner_id: str) -> Journal:
    """Open (creating) and lock this runner's journal; a torn tail is quarantined and cut,
    a corrupt one is refused (JournalCorrupt, JournalLocked, JournalRunnerMismatch)."""
    journal_path = Path(path)
    journal_path.parent.mkdir(parents=True, exist_ok=True)
    journal = Journal.open(journal_path, runner_id)
    if journal.scan.tail is Tail.TORN:
        repair = journal.repair()
        if repair is not None:
            log.warning(
                "journal tail was torn: %d bytes at offset %d (%s) quarantined in %s",
                repair.length,
                repair.offset,
                repair.defect,
                repair.quarantine,
            )
    return journal


async def report_unrecorded(conn: Any, journal: Journal) -> list[UnrecordedEffect]:
    """Read-only: effects the journal says were begun whose outcome ``jobs.effects`` does not
    hold (still pending, or no row at all), logged one by one and returned."""
    records = journal.scan.records
    job_ids = sorted(
        {r["job_id"] for r in records if r.get("type") == "effect_begin" and _int(r.get("job_id"))}
    )
    rows = await conn.fetch(sql.RECORDED_EFFECTS, job_ids) if job_ids else []
    recorded = {EffectRef(r["job_id"], r["effect_key"], r["seq"]) for r in rows}
    found = unrecorded_effects(records, recorded)
    for entry in found:
        begin, outcome = entry.begin, entry.journal_outcome
        log.warning(
            "effect begun but its outcome is not in the database: tenant=%s job=%s key=%s"
            " seq=%s attempt=%s idempotency_key=%s journal_outcome=%s receipt=%s",
            begin.tenant,
            begin.job_id,
            begin.effect_key,
            begin.seq,
            begin.attempt_id,
            begin.idempotency_key,
            None if outcome is None else outcome.outcome,
            None if outcome is None else outcome.receipt,
        )
    return found


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
