"""Rows and states of the jobs module: frozen slotted dataclasses, StrEnums mirroring SQL CHECKs.

``JobState`` mirrors ``jobs_state_check`` and ``EffectState`` mirrors ``effects_state_check``
(a test compares them with pg_constraint).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    """The states of ``jobs.jobs.state``."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    POISON = "poison"
    CANCELED = "canceled"
    UNKNOWN = "unknown"  # an effect outcome needs reconciliation
    HELD = "held"  # under an old authority epoch or frozen authority (issue 7)


class EffectState(StrEnum):
    """The states of ``jobs.effects.state``."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED_BEFORE_DISPATCH = "failed_before_dispatch"
    UNKNOWN = "unknown"


#: Effect states after which no automatic loop runs a job again (claim skips it; a succeeded
#: one only until the repair role resumes the job).
BLOCKING_EFFECTS = frozenset({EffectState.PENDING, EffectState.SUCCEEDED, EffectState.UNKNOWN})
#: Effect states whose outcome is not known.
UNRESOLVED_EFFECTS = frozenset({EffectState.PENDING, EffectState.UNKNOWN})


def _payload(value: Any) -> dict[str, Any]:
    """asyncpg returns jsonb as text unless a codec is set; accept both."""
    if value is None:
        return {}
    if isinstance(value, str):
        loaded: dict[str, Any] = json.loads(value)
        return loaded
    return dict(value)


@dataclass(frozen=True, slots=True)
class Submitted:
    """The outcome of ``submit``: the job and whether this call created it."""

    job_id: int
    created: bool
    state: JobState


# The attempt context a claim returns with each job (jobs.claim, 0036).
_CONTEXT = frozenset({"trace", "attempt_trace", "attempts", "last_error", "created_at"})


@dataclass(frozen=True, slots=True)
class Lease:
    """One claim of one job: every field is checked by the fence on each write-back."""

    job_id: int
    tenant: str
    workflow: str
    operation_id: str
    owner: str
    attempt_id: uuid.UUID
    generation: int
    epoch: int
    lease_expires_at: datetime
    payload: dict[str, Any] = field(default_factory=dict, compare=False)
    #: What the claim returned of the attempt's context (its stored trace contexts,
    #: ``attempts`` with this claim, the previous attempt's ``last_error``, ``created_at``),
    #: for the attempt span and the submit-to-finish histogram; None for a lease built
    #: otherwise.
    context: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> Lease:
        keys = row.keys()
        return cls(
            job_id=row["job_id"],
            tenant=row["tenant"],
            workflow=row["workflow"],
            operation_id=row["operation_id"],
            owner=row["owner"],
            attempt_id=row["attempt_id"],
            generation=row["generation"],
            epoch=row["epoch"],
            lease_expires_at=row["lease_expires_at"],
            payload=_payload(row["payload"]),
            context={k: row[k] for k in _CONTEXT} if set(keys) >= _CONTEXT else None,
        )

    def fence_args(self) -> tuple[Any, ...]:
        """The fence's eight parameters, in the order of the SQL functions."""
        return (
            self.job_id,
            self.tenant,
            self.workflow,
            self.operation_id,
            self.owner,
            self.attempt_id,
            self.generation,
            self.epoch,
        )


@dataclass(frozen=True, slots=True)
class Rescued:
    """One job rescue moved out of ``running``."""

    job_id: int
    tenant: str
    state: JobState
    generation: int

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> Rescued:
        return cls(row["job_id"], row["tenant"], JobState(row["state"]), row["generation"])


@dataclass(frozen=True, slots=True)
class RescueReport:
    """What one rescue pass did, by destination state."""

    rescued: tuple[Rescued, ...] = ()

    def ids(self, state: JobState) -> list[int]:
        return [r.job_id for r in self.rescued if r.state is state]

    @property
    def requeued(self) -> list[int]:
        return self.ids(JobState.QUEUED)

    @property
    def poisoned(self) -> list[int]:
        return self.ids(JobState.POISON)

    @property
    def unknown(self) -> list[int]:
        return self.ids(JobState.UNKNOWN)


@dataclass(frozen=True, slots=True)
class Cancellation:
    """The outcome of ``cancel``: ``changed`` is False when the job had already finished."""

    job_id: int
    changed: bool
    state: JobState
    generation: int
    unresolved_effects: bool


@dataclass(frozen=True, slots=True)
class Effect:
    """One effect record (one begin of one key)."""

    job_id: int
    effect_key: str
    seq: int
    intent_digest: str
    state: EffectState
    receipt: str | None
    attempt_id: uuid.UUID
    generation: int

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> Effect:
        return cls(
            job_id=row["job_id"],
            effect_key=row["effect_key"],
            seq=row["seq"],
            intent_digest=row["intent_digest"],
            state=EffectState(row["state"]),
            receipt=row["receipt"],
            attempt_id=row["attempt_id"],
            generation=row["generation"],
        )


@dataclass(frozen=True, slots=True)
class EffectStart:
    """What ``Store.start_effect`` did for one key: began a new pending record (``reused`` is
    False: dispatch it now), or found the key succeeded in an earlier attempt of this job (a
    run the repair role resumed): ``reused`` is True, ``seq`` and ``receipt`` are that
    record's, and nothing may be dispatched."""

    seq: int
    reused: bool = False
    receipt: str | None = None


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as operators see it, with every effect record it ever had."""

    job_id: int
    tenant: str
    workflow: str
    operation_id: str
    state: JobState
    generation: int
    attempts: int
    max_attempts: int
    last_error: str | None
    effects: tuple[Effect, ...]
    #: The generation at which the repair role resumed the job (None: never resumed).
    resumed_generation: int | None = None

    @property
    def needs_reconciliation(self) -> bool:
        """True while any effect's outcome is unknown or still pending (even when canceled)."""
        return any(e.state in UNRESOLVED_EFFECTS for e in self.effects)

    @property
    def awaiting_resume(self) -> bool:
        """``unknown`` with every effect outcome known: nothing is left to reconcile, and only
        a repair (``jobs.repair.resume``) lets it run again (reusing the recorded outcomes)."""
        return self.state is JobState.UNKNOWN and not self.needs_reconciliation

    @classmethod
    def from_record(cls, row: Mapping[str, Any], effects: tuple[Effect, ...]) -> JobView:
        return cls(
            job_id=row["job_id"],
            tenant=row["tenant"],
            workflow=row["workflow"],
            operation_id=row["operation_id"],
            state=JobState(row["state"]),
            generation=row["generation"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            last_error=row["last_error"],
            effects=effects,
            resumed_generation=row["resumed_generation"],
        )


@dataclass(frozen=True, slots=True)
class Registration:
    """The one queue owner registered for a workflow class."""

    workflow: str
    owner: str
    effects_enabled: bool

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> Registration:
        return cls(row["workflow"], row["owner"], row["effects_enabled"])


@dataclass(frozen=True, slots=True)
class Health:
    """A read-only probe's answer: the database clock and the registered workflow count."""

    database_now: datetime
    workflows: int
