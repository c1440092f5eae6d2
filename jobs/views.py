"""Operators' read views of jobs: the list (`accord jobs list`) and one job in full (`accord
jobs show`): its fields, attempts, effects with outcome, receipt and evidence, its audit
rows, and why it waits.

Invariant: read-only, and nothing here reads a payload (``jobs.jobs.payload``) or a digest;
identifiers, states, typed reasons, counts and times only. ``show`` reads one snapshot (a
REPEATABLE READ read-only transaction), so its sections agree with each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from uuid import UUID

from accord.jobs import registry, repair, sql
from accord.jobs.errors import JobNotFound
from accord.jobs.models import UNRESOLVED_EFFECTS, EffectState, JobState

#: The default number of jobs `accord jobs list` shows.
DEFAULT_LIMIT = 50


def _build(cls: Any, row: Mapping[str, Any], **override: Any) -> Any:
    return cls(**{f.name: override.get(f.name, row.get(f.name)) for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class JobLine:
    """One job as a line of the list."""

    job_id: int
    tenant: str
    workflow: str
    operation_id: str
    state: JobState
    attempts: int
    max_attempts: int
    generation: int
    updated_at: datetime
    last_error: str | None

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> JobLine:
        built: JobLine = _build(cls, row, state=JobState(row["state"]))
        return built


@dataclass(frozen=True, slots=True)
class EffectDetail:
    """One effect record, its escalation, and the repair that resolved it (if any)."""

    effect_key: str
    seq: int
    state: EffectState
    receipt: str | None
    intent_digest: str
    attempt_id: UUID
    generation: int
    begun_at: datetime
    finished_at: datetime | None
    escalated_at: datetime | None
    age_s: float
    resolved_audit: int | None
    resolved_by: str | None
    resolved_evidence: str | None
    #: For one reconcile may resolve: since when nothing of its job's attempts can still be
    #: sending (jobs.reconciliation.quiet_since, 0058), and the seconds since (negative while
    #: a granted lease runs); None otherwise.
    quiet_since: datetime | None = None
    quiet_s: float | None = None

    @property
    def unresolved(self) -> bool:
        """Its outcome is not known (pending or unknown): reconcile or a person decides."""
        return self.state in UNRESOLVED_EFFECTS

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> EffectDetail:
        built: EffectDetail = _build(cls, row, state=EffectState(row["state"]))
        return built


@dataclass(frozen=True, slots=True)
class JobDetail:
    """One job in full (no payload): fields, attempts, lease, effects, audits, the wait."""

    job_id: int
    tenant: str
    workflow: str
    operation_id: str
    state: JobState
    generation: int
    attempts: int
    max_attempts: int
    last_error: str | None
    owner: str | None
    attempt_id: UUID | None
    epoch: int | None
    lease_expires_at: datetime | None
    run_after: datetime
    created_at: datetime
    updated_at: datetime
    resumed_generation: int | None
    unresolved_effects: int
    #: Its last attempt gave it up without a retry: once no effect of it is unresolved it is
    #: failed, never run again (0055).
    final_failure: bool
    #: The class's registration (None: the class is not registered).
    class_owner: str | None
    effects_enabled: bool | None
    #: Why it waits (jobs.waiting; None: it does not wait) and whether a claim would take it.
    waiting_reason: str | None
    claimable: bool
    effects: tuple[EffectDetail, ...]
    repair_audit: tuple[repair.AuditRow, ...]
    #: The registration audit of its class (jobs.registration_audit rows, oldest first).
    registration_audit: tuple[Mapping[str, Any], ...]

    @property
    def unresolved(self) -> tuple[EffectDetail, ...]:
        return tuple(e for e in self.effects if e.unresolved)


async def list_jobs(
    conn: Any,
    *,
    state: str | None = None,
    tenant: str | None = None,
    workflow: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[JobLine]:
    """Read-only: jobs newest first (by id), filtered by state, tenant and class."""
    if state is not None:
        state = JobState(state).value  # ValueError for a state that does not exist
    rows = await conn.fetch(sql.JOB_LIST, state, tenant, workflow, limit)
    return [JobLine.from_record(r) for r in rows]


async def show_job(conn: Any, job_id: int) -> JobDetail:
    """Read-only; one REPEATABLE READ read-only snapshot (or the caller's transaction).
    Raises JobNotFound."""
    if conn.is_in_transaction():
        return await _show(conn, job_id)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await _show(conn, job_id)


async def _show(conn: Any, job_id: int) -> JobDetail:
    row = await conn.fetchrow(sql.JOB_DETAIL, job_id)
    if row is None:
        raise JobNotFound(job_id=job_id)
    waiting = await conn.fetchrow(sql.JOB_WAITING, job_id)
    effects = tuple(EffectDetail.from_record(e) for e in await conn.fetch(sql.JOB_EFFECTS, job_id))
    built: JobDetail = _build(
        JobDetail,
        row,
        state=JobState(row["state"]),
        waiting_reason=None if waiting is None else waiting["reason"],
        claimable=False if waiting is None else bool(waiting["claimable"]),
        effects=effects,
        repair_audit=tuple(await repair.audit(conn, job_id=job_id)),
        registration_audit=tuple(await registry.audit(conn, row["workflow"])),
    )
    return built
