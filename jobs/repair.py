"""Repairs: the only operations the repair principal (role ``accord_repair``) can run.

Invariant it owns: repair authority is narrower than execution authority. Each repair is one
checked SQL function (jobs.repair_*, jobs/schema.sql) that locks its row, refuses running
(leased) jobs, needs a named principal and evidence, and writes a ``jobs.repair_audit`` row
in the same transaction; the worker role cannot call them, and the repair role cannot claim, renew,
publish or begin an effect. The repair role has no DML on the jobs tables at all.

Every function takes the caller's transaction (on a connection whose role is
``accord_repair``, or the owner) and never commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from accord.jobs import authority, repair_sql
from accord.jobs.errors import RepairRefused
from accord.jobs.ledger import Ledger, LedgerRecord, LedgerWhy
from accord.jobs.models import EffectState, JobState
from accord.schemas.db import Tx, require_transaction

#: The execution and repair principals (NOLOGIN group roles, schemas/roles.sql; grant them
#: to LOGIN users).
WORKER_ROLE = "accord_worker"
REPAIR_ROLE = "accord_repair"


@dataclass(frozen=True, slots=True)
class Repaired:
    """A job a repair changed: its new state and the audit row that records it."""

    job_id: int
    state: JobState
    audit_id: int


@dataclass(frozen=True, slots=True)
class EffectResolved:
    """An unresolved effect record resolved with evidence."""

    job_id: int
    effect_key: str
    seq: int
    outcome: EffectState
    job_state: JobState
    audit_id: int


@dataclass(frozen=True, slots=True)
class EvidenceAcknowledged:
    """A journal evidence note (a begin a restore left without a record) acknowledged."""

    evidence_id: int
    job_id: int
    audit_id: int


@dataclass(frozen=True, slots=True)
class EpochAdvanced:
    """A tenant's epoch advanced past the ledger by a repair principal."""

    tenant: str
    epoch: int
    ledger_epoch: int
    audit_id: int


@dataclass(frozen=True, slots=True)
class Escalated:
    """An unresolved effect escalated by age (a state, never a resolution)."""

    job_id: int
    effect_key: str
    seq: int
    tenant: str
    age_s: float

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> Escalated:
        return cls(row["job_id"], row["effect_key"], row["seq"], row["tenant"], row["age_s"])


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One ``jobs.repair_audit`` row."""

    audit_id: int
    at: datetime
    action: str
    who: str
    db_user: str
    db_role: str
    tenant: str
    job_id: int | None
    effect_key: str | None
    seq: int | None
    outcome: str
    evidence: str

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> AuditRow:
        return cls(**{f.name: row[f.name] for f in fields(cls)})


def _require_principal(who: str, evidence: str) -> None:
    if not who.strip():
        raise RepairRefused(reason="no_principal")
    if not evidence.strip():
        raise RepairRefused(reason="no_evidence")


def _refused(status: str | None, **ids: Any) -> None:
    if status is not None:
        raise RepairRefused(reason=status, **ids)


async def resolve_effect(
    tx: Tx,
    job_id: int,
    effect_key: str,
    outcome: EffectState,
    *,
    who: str,
    evidence: str,
    receipt: str | None = None,
    seq: int | None = None,
) -> EffectResolved:
    """Runs in the caller's transaction; never commits. Resolves the latest record of
    ``effect_key`` (unknown, or pending on a job no longer running) to ``outcome``
    (succeeded or failed_before_dispatch) with evidence; an ``unknown`` job with nothing left
    forbidding a rerun goes back to ``queued``. ``seq``: the record the evidence is about,
    refused when the key began again since (seq_moved). Raises RepairRefused (reason:
    running, missing, missing_effect, not_unresolved, seq_moved, invalid_outcome,
    no_principal, no_evidence)."""
    require_transaction(tx)
    outcome = EffectState(outcome)
    row = await tx.fetchrow(
        repair_sql.RESOLVE_EFFECT, job_id, effect_key, str(outcome), receipt, who, evidence, seq
    )
    _refused(row["status"], job_id=job_id, effect_key=effect_key)
    state = JobState(row["job_state"])
    return EffectResolved(job_id, effect_key, row["seq"], outcome, state, row["audit_id"])


async def release_hold(tx: Tx, job_id: int, *, who: str, evidence: str) -> Repaired:
    """Runs in the caller's transaction; never commits. A held job goes to queued, or unknown
    if an effect forbids running it again, or failed if its handler gave it up for good and
    nothing of it is unresolved (0060). Raises RepairRefused (running, not_held, missing,
    restore_unresolved: advance the tenant's epoch first)."""
    require_transaction(tx)
    row = await tx.fetchrow(repair_sql.RELEASE_HOLD, job_id, who, evidence)
    _refused(row["status"], job_id=job_id, state=row["job_state"])
    return Repaired(job_id, JobState(row["job_state"]), row["audit_id"])


async def requeue_poison(tx: Tx, job_id: int, *, who: str, evidence: str) -> Repaired:
    """Runs in the caller's transaction; never commits. A poison job goes back to queued with
    a fresh attempt budget. Raises RepairRefused (running, not_poison, effects_unresolved)."""
    require_transaction(tx)
    row = await tx.fetchrow(repair_sql.REQUEUE_POISON, job_id, who, evidence)
    _refused(row["status"], job_id=job_id, state=row["job_state"])
    return Repaired(job_id, JobState(row["job_state"]), row["audit_id"])


async def resume(tx: Tx, job_id: int, *, who: str, evidence: str) -> Repaired:
    """Runs in the caller's transaction; never commits. An ``unknown`` job whose effects all
    have a known outcome (e.g. one succeeded, then the reply, the worker or a later step was
    lost) goes back to ``queued``, resumable for exactly one claim: that run gets each
    succeeded effect's recorded outcome (``Store.start_effect``) instead of dispatching it
    again. No automatic loop does this. Raises RepairRefused (running, missing,
    not_resumable: only ``unknown`` resumes, a canceled job stays canceled; final_failure:
    its handler gave it up without a retry (0059); effects_unresolved: resolve them first;
    restore_unresolved; no_principal; no_evidence)."""
    require_transaction(tx)
    row = await tx.fetchrow(repair_sql.RESUME, job_id, who, evidence)
    _refused(row["status"], job_id=job_id, state=row["job_state"])
    return Repaired(job_id, JobState(row["job_state"]), row["audit_id"])


async def acknowledge_evidence(
    tx: Tx, evidence_id: int, *, who: str, evidence: str
) -> EvidenceAcknowledged:
    """Runs in the caller's transaction; never commits. A journal evidence note (0054: a begin
    a worker's journal holds that this database has no record of, noted at the worker's start
    and shown by `accord status`) is acknowledged: its worker's journal drops the begin at its
    next rotation. Acknowledge only once what it is evidence of is resolved (the provider asked
    by its idempotency key). Raises RepairRefused (missing, already_acknowledged,
    no_principal, no_evidence)."""
    require_transaction(tx)
    row = await tx.fetchrow(repair_sql.ACKNOWLEDGE_EVIDENCE, evidence_id, who, evidence)
    _refused(row["status"], evidence_id=evidence_id)
    return EvidenceAcknowledged(evidence_id, row["job_id"], row["audit_id"])


async def advance_epoch(
    tx: Tx, ledger: Ledger, tenant: str, *, who: str, evidence: str
) -> EpochAdvanced:
    """Runs in the caller's transaction; never commits. After a detected restore only:
    validates and advances the tenant's epoch past both the database and the ledger, and
    resolves the open restore detection. The tenant's restriction becomes the one the ledger
    records (a restriction survives the restore; lifting it is the owner's ``lift``); held
    work stays held (release it per job, after looking). Ledger first: the new epoch is
    appended (durable) under the tenant row lock before the row changes, so a rollback leaves
    the ledger ahead, which the next check treats as a restore again. Raises RepairRefused
    (no_restore: no restore is open, so the repair role has nothing to advance: run
    ``accord repair restore-check`` if the database is behind the ledger; missing;
    not_past_ledger; keeps_restriction: the database function refuses to clear a restriction
    the detection recorded from the ledger; no_principal; no_evidence)."""
    require_transaction(tx)
    _require_principal(who, evidence)
    row = await tx.fetchrow(repair_sql.AUTHORITY_LOCK, tenant)
    if not row["open_restore"]:
        raise RepairRefused(reason="no_restore", tenant=tenant)
    entry = (await ledger.read()).get(tenant)
    await authority.require_ledger_holds(tx, ledger, tenant, entry)
    ledger_epoch = entry.epoch if entry is not None else 0
    frozen = entry.frozen if entry is not None else False
    epoch = max(int(row["epoch"]), ledger_epoch) + 1
    await ledger.append(
        LedgerRecord(
            tenant=tenant,
            epoch=epoch,
            frozen=frozen,
            why=LedgerWhy.REPAIR_ADVANCE,
            who=who,
            evidence=evidence,
        )
    )
    done = await tx.fetchrow(
        repair_sql.ADVANCE_EPOCH, tenant, epoch, ledger_epoch, frozen, who, evidence
    )
    _refused(done["status"], tenant=tenant)
    return EpochAdvanced(tenant, epoch, ledger_epoch, done["audit_id"])


async def escalate(tx: Tx, older_than_s: float, *, limit: int = 1000) -> list[Escalated]:
    """Runs in the caller's transaction; never commits. Marks unresolved effects begun more
    than ``older_than_s`` ago as escalated (once each). Never resolves anything."""
    require_transaction(tx)
    rows = await tx.fetch(repair_sql.ESCALATE, float(older_than_s), limit)
    return [Escalated.from_record(row) for row in rows]


async def audit(
    conn: Any, *, job_id: int | None = None, tenant: str | None = None
) -> list[AuditRow]:
    """Read-only: the audit rows of one job or one tenant, oldest first."""
    if job_id is not None:
        rows = await conn.fetch(repair_sql.AUDIT_FOR_JOB, job_id)
    elif tenant is not None:
        rows = await conn.fetch(repair_sql.AUDIT_FOR_TENANT, tenant)
    else:
        raise ValueError("audit needs a job_id or a tenant")
    return [AuditRow.from_record(row) for row in rows]
