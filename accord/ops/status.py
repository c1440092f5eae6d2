"""`accord status`: one consistent snapshot of work, delivery and consumption, and why work waits.

Invariant: every figure of one ``StatusReport`` comes from one database snapshot (a
REPEATABLE READ read-only transaction), so the figures agree with each other: a job counted
as queued is the same job classified as waiting. The report holds identifiers, states,
typed reasons, counts, ages and epochs only; no statement reads a payload or body column.
Finished work (succeeded, failed, poison, canceled) is counted over a window that ends at
the snapshot (default the last 24 hours), and where a person must act the report names a
few job ids (``e.g. jobs 26, 27``) so `accord jobs show ID` can take it from there.
https://www.postgresql.org/docs/15/transaction-iso.html#XACT-REPEATABLE-READ
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar

from accord.consumers import inbox, poison
from accord.ops import models, sql
from accord.ops.models import (
    DeliveryGroup,
    EffectGroup,
    FinishedGroup,
    HeldRows,
    JobGroup,
    JournalEvidence,
    KeyMismatch,
    MiscountedJob,
    PoisonGroup,
    RefusalGroup,
    RelayFigures,
    ReplayWindow,
    StatusReport,
    StrandedJob,
    TenantAuthority,
    WaitingGroup,
    WorkflowClass,
)
from accord.relay import outbox

T = TypeVar("T")

#: The default window of finished work: the last 24 hours.
DEFAULT_SINCE_S = 86_400.0


async def collect_status(
    conn: Any,
    since: datetime | float = DEFAULT_SINCE_S,
    *,
    integrity: bool = True,
    window: bool = True,
) -> StatusReport:
    """Read-only; opens its own REPEATABLE READ read-only transaction (or, when ``conn`` is
    already in a transaction, reads in the caller's snapshot). Never writes. ``since``: the
    start of the window (finished work, inbox decisions), a timestamp or seconds before the
    snapshot. ``integrity``: also run the checks that read every job kept (miscounted effects,
    jobs and keys that do not name each other, stranded jobs). ``window``: also read what
    finished and what the inbox decided within the window, which costs what the window holds.
    /metrics exports none of these and leaves all out: its snapshot reads the work not done,
    not the history nor the throughput (migrations 0034, 0040)."""
    if conn.is_in_transaction():
        return await _collect(conn, since, integrity, window)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await _collect(conn, since, integrity, window)


async def _rows(conn: Any, build: Callable[[Any], T], statement: str, *args: Any) -> tuple[T, ...]:
    return tuple(build(r) for r in await conn.fetch(statement, *args))


async def _collect(
    conn: Any, since: datetime | float, integrity: bool, window: bool
) -> StatusReport:
    unresolved = list(models.UNRESOLVED_EFFECT_STATES)
    start: datetime = (
        since if isinstance(since, datetime) else await conn.fetchval(sql.AGO, float(since))
    )
    acting = [str(r) for r in models.WaitReason if r.needs_person]
    finished = (
        list(models.TERMINAL_STATES), start, list(models.ACTIONABLE_TERMINAL_STATES),
        models.EXAMPLE_IDS,
    )  # fmt: skip
    jobs = await _rows(conn, JobGroup.from_record, sql.JOB_GROUPS, list(models.REPORTED_STATES))
    held: dict[str, int] = {}
    for group in jobs:
        if group.state == "held":
            held[group.tenant] = held.get(group.tenant, 0) + group.jobs
    return StatusReport(
        taken_at=await conn.fetchval(sql.NOW),
        since=start,
        jobs=jobs,
        finished=(
            await _rows(conn, FinishedGroup.from_record, sql.FINISHED, *finished) if window else ()
        ),
        waiting=await _rows(
            conn, WaitingGroup.from_record, sql.WAITING, acting, models.EXAMPLE_IDS
        ),
        effects=await _rows(conn, EffectGroup.from_record, sql.UNRESOLVED_EFFECTS, unresolved),
        miscounted=(
            await _rows(conn, MiscountedJob.from_record, sql.MISCOUNTED_EFFECTS, unresolved)
            if integrity
            else ()
        ),
        key_mismatches=(
            await _rows(conn, KeyMismatch.from_record, sql.KEY_MISMATCHES) if integrity else ()
        ),
        stranded=await _rows(conn, StrandedJob.from_record, sql.STRANDED) if integrity else (),
        tenants=await _rows(
            conn, lambda r: TenantAuthority.from_record(r, held.get(r["tenant"], 0)), sql.TENANTS
        ),
        journal_evidence=await _rows(conn, JournalEvidence.from_record, sql.JOURNAL_EVIDENCE),
        workflows=await _rows(conn, WorkflowClass.from_record, sql.WORKFLOWS),
        relay=RelayFigures.from_record(await outbox.figures(conn)),
        relay_held=tuple(HeldRows.from_record(r) for r in await outbox.held_by_reason(conn)),
        deliveries=(
            tuple(DeliveryGroup.from_record(r) for r in await inbox.delivery_counts(conn, start))
            if window
            else ()
        ),
        inbox_conflicts=await inbox.conflict_count(conn),
        poison=tuple(PoisonGroup.from_record(r) for r in await poison.poison_counts(conn)),
        replay_refusals=await _rows(conn, RefusalGroup.from_record, sql.REPLAY_REFUSALS),
        replay_windows=tuple(ReplayWindow.from_record(r) for r in await inbox.replay_windows(conn)),
    )


# -- rendering ------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)  # example ids: what JSON reads back
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float):
        return round(value, 3)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _dict(row: Any) -> dict[str, Any]:
    out = {f.name: _plain(getattr(row, f.name)) for f in dataclasses.fields(row)}
    if isinstance(row, WaitingGroup):
        out["category"] = row.category.value
    return out


def to_json(report: StatusReport) -> dict[str, Any]:
    """The report as JSON-ready data (stable keys; what `accord status --json` prints)."""
    sections = {
        f.name: [_dict(r) for r in getattr(report, f.name)]
        for f in dataclasses.fields(report)
        if isinstance(getattr(report, f.name), tuple)
    }
    return {
        "taken_at": _plain(report.taken_at),
        # The window's length (its start is taken_at minus this): a clock reading, like ages.
        "window_s": _plain((report.taken_at - report.since).total_seconds()),
        "totals": {
            **{state: report.count(state) for state in models.REPORTED_STATES},
            "finished": {s: report.finished_count(s) for s in models.TERMINAL_STATES},
            "relay_lag_s": _plain(report.relay.lag_s),
            "relay_pending": report.relay.pending,
            "relay_held": report.relay.held,
            "relay_awake_s": _plain(report.relay.awake_s),
            "inbox_conflicts": report.inbox_conflicts,
            "poison_messages": report.poison_messages,
            "escalated_effects": report.escalated_effects,
            "journal_evidence": len(report.journal_evidence),
            "rescued": sum(g.rescued for g in report.jobs),
            "replay_refusals": sum(r.refusals for r in report.replay_refusals),
        },
        "relay": _dict(report.relay),
        **sections,
    }


def _table(title: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    body = [[_cell(v) for v in row] for row in rows]
    if not body:
        return [f"{title}: none", ""]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    lines = [title] + [
        ("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in [list(headers), *body]
    ]
    return [*lines, ""]


def _cell(value: Any) -> str:
    value = _plain(value)
    if value is None or value == []:
        return "-"
    if isinstance(value, list):
        return "e.g. jobs " + ", ".join(map(str, value))
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def render_table(report: StatusReport) -> str:
    """The human view: one table per section (identifiers, reasons and numbers only)."""
    r = report
    lines = [f"accord status at {_plain(r.taken_at)}", ""]
    lines += _table(
        "jobs",
        ["state", "tenant", "workflow", "jobs", "oldest_s", "attempts", "rescued"],
        [(g.state, g.tenant, g.workflow, g.jobs, g.oldest_age_s, g.attempts, g.rescued)
         for g in r.jobs],
    )  # fmt: skip
    lines += _table(
        f"finished since {_plain(r.since)}",
        ["state", "tenant", "workflow", "jobs", "last_s", "jobs to look at"],
        [(g.state, g.tenant, g.workflow, g.jobs, g.last_age_s, g.example_ids)
         for g in r.finished],
    )  # fmt: skip
    lines += _table(
        "why waiting work waits",
        ["category", "reason", "state", "tenant", "workflow", "jobs", "oldest_s", "act on"],
        [(w.category, w.reason, w.state, w.tenant, w.workflow, w.jobs, w.oldest_age_s,
          w.example_ids) for w in r.waiting],
    )  # fmt: skip
    lines += _table(
        "effects with unknown outcome",
        ["tenant", "workflow", "effect", "job_state", "effects", "escalated", "oldest_s"],
        [(e.tenant, e.workflow, e.effect_state, e.job_state, e.effects, e.escalated,
          e.oldest_age_s) for e in r.effects],
    )  # fmt: skip
    lines += _table(
        "jobs whose effect count disagrees with their effect records (recount as migration 0010)",
        ["job_id", "tenant", "state", "counted", "recorded"],
        [(m.job_id, m.tenant, m.state, m.counted, m.recorded) for m in r.miscounted],
    )  # fmt: skip
    lines += _table(
        "jobs and operation keys that do not name each other (see migration 0011)",
        ["job_id", "tenant", "workflow", "operation_id", "problem"],
        [(u.job_id, u.tenant, u.workflow, u.operation_id, u.problem) for u in r.key_mismatches],
    )  # fmt: skip
    lines += _table(
        "jobs which no claim reads: tenant_frozen, flagged under a thawed tenant (freeze and"
        " thaw the tenant: migration 0037); effects_parked, parked for disabled effects in a"
        " class whose effects are enabled (register it with effects disabled, then enabled:"
        " migration 0038)",
        ["job_id", "tenant", "workflow", "state", "cause"],
        [(j.job_id, j.tenant, j.workflow, j.state, j.cause) for j in r.stranded],
    )  # fmt: skip
    lines += _table(
        "tenants", ["tenant", "epoch", "frozen", "held", "restore_ledger_epoch"],
        [(t.tenant, t.epoch, t.frozen, t.held, t.restore_ledger_epoch) for t in r.tenants],
    )  # fmt: skip
    lines += _table(
        "journal evidence: begins a worker's journal holds that this database has no record of"
        " (a restore's doing); ask the provider by the key, then `accord repair"
        " acknowledge-evidence --id N`",
        ["id", "tenant", "job_id", "effect", "seq", "runner", "idempotency_key", "age_s"],
        [(v.evidence_id, v.tenant, v.job_id, v.effect_key, v.seq, v.runner_id,
          v.idempotency_key, v.age_s) for v in r.journal_evidence],
    )  # fmt: skip
    lines += _table(
        "workflow classes", ["workflow", "owner", "effects", "live_leases", "last_activity_s"],
        [(w.workflow, w.owner, w.effects_enabled, w.live_leases, w.last_lease_activity_s)
         for w in r.workflows],
    )  # fmt: skip
    lines += _table(
        "relay", ["pending", "held", "lag_s", "pending_attempts", "awake_s"],
        [(r.relay.pending, r.relay.held, r.relay.lag_s, r.relay.pending_attempts,
          r.relay.awake_s)],
    )  # fmt: skip
    lines += _table(
        "held outbox rows", ["reason", "rows", "oldest_s"],
        [(h.reason, h.rows, h.oldest_age_s) for h in r.relay_held],
    )  # fmt: skip
    lines += _table(
        "inbox decisions since the window's start", ["consumer", "tenant", "outcome", "deliveries"],
        [(d.consumer, d.tenant, d.outcome, d.deliveries) for d in r.deliveries],
    )  # fmt: skip
    lines += _table(
        "poison messages", ["consumer", "reason", "messages", "oldest_s"],
        [(p.consumer, p.reason, p.messages, p.oldest_age_s) for p in r.poison],
    )  # fmt: skip
    lines += _table(
        "replay refusals", ["workflow", "reason", "refusals"],
        [(x.workflow, x.reason, x.refusals) for x in r.replay_refusals],
    )  # fmt: skip
    lines += _table(
        "replay windows (no retention of jobs or poison records may be shorter than a horizon)",
        ["consumer", "window_s", "margin_s", "horizon_s", "declared_s_ago"],
        [(w.consumer, w.replay_window_s, w.margin_s, w.horizon_s, w.declared_age_s)
         for w in r.replay_windows],
    )  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"
