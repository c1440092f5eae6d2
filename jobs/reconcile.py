"""Reconciliation: unknown effects are resolved only with evidence, never by a timeout.

Invariant it owns: an effect leaves ``unknown`` (or an orphaned ``pending``) only through
jobs.repair.resolve_effect with an evidence reference, i.e. through the repair path and its
audit row. Where the provider offers a receipt lookup by idempotency key, :func:`reconcile`
asks it: a receipt is evidence of acceptance (``succeeded``); a definite "never seen" is
evidence that nothing was dispatched (``failed_before_dispatch``: the job may run again). No
definite answer, or no lookup at all, leaves the effect unresolved; once it is older than the
configured age it is *escalated* (jobs.effect_escalations, a state for status and metrics).

A "never seen" is only trusted ``settle_s`` after the job's attempts could last have sent
(``jobs.reconciliation.quiet_since``, 0058: past the effect's begin and finish, and, once the
job stopped running, its last change and every lease it granted, since a worker cut off from
the database runs its handler until its own lease ends): a request still in flight towards
the provider could otherwise be accepted just after the lookup. This holds for calls that
end when their handler is cancelled (docs/runner.md).

A resolution that leaves its job ``unknown`` with nothing unresolved (an effect of it
succeeded: typically the provider accepted and the reply was lost) also *resumes* the job in
the same transaction, through the same repair path (jobs.repair.resume, its own audit row,
the provider's answer as evidence): the job is queued again, and its next run gets the
recorded receipt instead of dispatching again, then publishes. Only what this pass resolved
is resumed; an ``unknown`` job whose effects were already all known (e.g. its handler failed
after the effect) waits for a person (`accord repair resume`), so no loop reruns a job that
keeps failing after its effect. A job its handler gave up without a retry is never resumed:
the resolution that leaves it nothing unresolved makes it ``failed`` (0055). A held job (a
restore's, 0060) stays held whatever is resolved: a person's release decides.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

from accord.jobs import repair, repair_sql
from accord.jobs.errors import LookupUnavailable, RepairRefused
from accord.jobs.models import EffectState, JobState
from accord.schemas.db import Tx
from accord.schemas.errors import ConfigError
from accord.schemas.settings import MAX_DURATION_S


@dataclass(frozen=True, slots=True)
class UnresolvedEffect:
    """An effect record that needs reconciliation (a row of ``jobs.reconciliation``)."""

    tenant: str
    job_id: int
    workflow: str
    operation_id: str
    job_state: JobState
    effect_key: str
    seq: int
    intent_digest: str
    state: EffectState
    receipt: str | None
    attempt_id: uuid.UUID
    generation: int
    begun_at: datetime
    escalated_at: datetime | None
    age_s: float
    #: Seconds since the job's attempts could last have sent (``quiet_since``, 0058; negative
    #: while a granted lease runs); None where not read from jobs.reconciliation (then "never
    #: seen" is trusted only at settle 0).
    quiet_s: float | None = None

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> UnresolvedEffect:
        values = {f.name: row[f.name] for f in fields(cls)}
        values["job_state"] = JobState(values["job_state"])
        values["state"] = EffectState(values["state"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Answer:
    """A provider's definite answer about one effect: its receipt, or None if it never saw
    the request; ``evidence`` is the reference recorded in the audit row."""

    receipt: str | None
    evidence: str


#: Ask the provider about one effect (by the effect's idempotency key). Raises
#: LookupUnavailable when there is no definite answer.
Lookup = Callable[[UnresolvedEffect], Awaitable[Answer]]

#: The lookup of the provider that owns this effect's key, or None when its owner offers
#: none (or nothing owns it). Only the owner's answer is evidence: a provider's "never
#: accepted" says nothing about a key another provider owns.
LookupFor = Callable[[UnresolvedEffect], Lookup | None]


class Left(StrEnum):
    """Why an effect stayed unresolved in this pass."""

    NO_LOOKUP = "no_lookup"  # its key's owner offers no receipt lookup: a person resolves it
    LOOKUP_UNAVAILABLE = "lookup_unavailable"
    SETTLING = "settling"  # "never seen" is not trusted before settle_s
    REFUSED = "refused"  # the repair refused (e.g. the job is running again)


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What one pass did."""

    resolved: tuple[repair.EffectResolved, ...] = ()
    left: tuple[tuple[UnresolvedEffect, Left], ...] = ()
    escalated: tuple[repair.Escalated, ...] = ()
    #: Jobs a resolution of this pass left with every effect outcome known, resumed.
    resumed: tuple[repair.Repaired, ...] = ()


async def unresolved(conn: Any, *, limit: int = 100) -> list[UnresolvedEffect]:
    """Read-only: up to ``limit`` effects needing reconciliation, oldest first."""
    rows = await conn.fetch(repair_sql.RECONCILIATION, limit)
    return [UnresolvedEffect.from_record(row) for row in rows]


Resolution = tuple[repair.EffectResolved | None, repair.Repaired | None]


async def _resolve(conn: Any, effect: UnresolvedEffect, answer: Answer, who: str) -> Resolution:
    """One transaction: the resolution and, when it settles the job, the resume."""
    outcome = (
        EffectState.SUCCEEDED if answer.receipt is not None else EffectState.FAILED_BEFORE_DISPATCH
    )
    try:
        async with conn.transaction():
            done = await repair.resolve_effect(
                conn,
                effect.job_id,
                effect.effect_key,
                outcome,
                who=who,
                evidence=answer.evidence,
                receipt=answer.receipt,
                seq=effect.seq,  # the record the provider was asked about, no later one
            )
            return done, await _resume_settled(conn, done, answer, who)
    except RepairRefused:
        return None, None


async def _resume_settled(
    tx: Tx, done: repair.EffectResolved, answer: Answer, who: str
) -> repair.Repaired | None:
    """Resume the job if the resolution left it ``unknown`` (resolve_effect requeues it itself
    when nothing blocks a rerun; a held job stays held). A refusal (another effect still
    unresolved, an open restore) keeps the resolution and leaves the job unknown."""
    if done.job_state is not JobState.UNKNOWN:
        return None
    try:
        return await repair.resume(
            tx, done.job_id, who=who, evidence=f"reconciled {done.effect_key}: {answer.evidence}"
        )
    except RepairRefused:
        return None


async def reconcile(
    conn: Any,
    lookup_for: LookupFor | None,
    *,
    who: str,
    escalate_after_s: float,
    settle_s: float = 60.0,
    limit: int = 100,
) -> ReconcileReport:
    """Owns its transactions (one per resolution, on a repair-role connection ``conn``):
    resolves what the provider answers definitely (resuming a job the resolution leaves
    ``unknown`` with every outcome known), leaves the rest, then escalates unresolved effects
    older than ``escalate_after_s``. Never resolves anything by age. Each effect is asked of
    ``lookup_for(effect)`` only: the lookup of the provider owning its key."""
    if not (0 <= settle_s <= MAX_DURATION_S and 0 <= escalate_after_s <= MAX_DURATION_S):
        # A NaN or a negative settle would trust a provider's "never seen" at once: a request
        # still in flight would be resolved failed_before_dispatch, and sent again.
        raise ConfigError(
            "reconcile's durations are seconds in [0, MAX_DURATION_S]",
            settle_s=settle_s,
            escalate_after_s=escalate_after_s,
        )
    if not limit >= 1:
        raise ConfigError("reconcile's limit must be at least 1", limit=limit)
    resolved: list[repair.EffectResolved] = []
    resumed: list[repair.Repaired] = []
    left: list[tuple[UnresolvedEffect, Left]] = []
    for effect in await unresolved(conn, limit=limit):
        lookup = None if lookup_for is None else lookup_for(effect)
        if lookup is None:
            left.append((effect, Left.NO_LOOKUP))
            continue
        try:
            answer = await lookup(effect)
        except LookupUnavailable:
            left.append((effect, Left.LOOKUP_UNAVAILABLE))
            continue
        # "Never seen" is trusted once nothing of the job's attempts can still be on its way:
        # the window runs from their last possible send, not from the begin (NaN: settling).
        if answer.receipt is None and not (effect.quiet_s or 0.0) >= settle_s:
            left.append((effect, Left.SETTLING))
            continue
        done, resumed_job = await _resolve(conn, effect, answer, who)
        if done is None:
            left.append((effect, Left.REFUSED))
        else:
            resolved.append(done)
        if resumed_job is not None:
            resumed.append(resumed_job)
    async with conn.transaction():
        escalated = await repair.escalate(conn, escalate_after_s)
    return ReconcileReport(tuple(resolved), tuple(left), tuple(escalated), tuple(resumed))
