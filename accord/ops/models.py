"""The status report's rows: frozen slotted dataclasses built from records, typed reasons.

Only identifiers, states, typed reasons, counts, ages and revisions (epochs) appear here;
nothing that comes from a payload. ``WaitReason`` mirrors the reasons the ``WAITING``
statement in ``accord.ops.sql`` can produce, and each reason belongs to one ``WaitCategory``
(the four families of issue 7, plus scheduled retries and rescue).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

#: The job states the report counts (succeeded and failed are history, not work).
REPORTED_STATES = ("queued", "running", "poison", "unknown", "canceled", "held")
#: The terminal states the report counts over a time window (``accord status --since``),
#: by when the job reached them (its last update).
TERMINAL_STATES = ("succeeded", "failed", "poison", "canceled")
#: The terminal states whose jobs a person may have to look at (example ids are listed).
ACTIONABLE_TERMINAL_STATES = ("failed", "poison", "canceled")
#: Example job ids listed per group where a person must act.
EXAMPLE_IDS = 3
#: Effect states whose outcome is not known (escalation is a mark on such an effect, kept in
#: jobs.effect_escalations, not a state of its own).
UNRESOLVED_EFFECT_STATES = ("pending", "unknown")


class WaitCategory(StrEnum):
    """Why waiting work waits, in families."""

    NO_WORKER_CAPACITY = "no_worker_capacity"
    MISSING_AUTHORITY = "missing_authority"
    INVALID_CONFIGURATION = "invalid_configuration"
    AWAITING_RECONCILIATION = "awaiting_reconciliation"
    SCHEDULED_RETRY = "scheduled_retry"  # a healthy retry waiting out its backoff
    AWAITING_RESCUE = "awaiting_rescue"  # a running job the rescue loop should return


class WaitReason(StrEnum):
    """One typed reason per waiting job (see ``accord.ops.sql.WAITING`` for the order)."""

    NO_LIVE_WORKER = "no_live_worker"
    WORKERS_BUSY = "workers_busy"
    TENANT_FROZEN = "tenant_frozen"
    HELD = "held"
    UNREGISTERED_WORKFLOW = "unregistered_workflow"
    EFFECTS_DISABLED = "effects_disabled"
    UNRESOLVED_EFFECT = "unresolved_effect"
    AWAITING_RESUME = "awaiting_resume"  # unknown, every effect known: `accord repair resume`
    BLOCKED_BY_EFFECT = "blocked_by_effect"
    BACKOFF = "backoff"
    LEASE_EXPIRED = "lease_expired"
    EPOCH_ROTATED = "epoch_rotated"

    @property
    def category(self) -> WaitCategory:
        return _CATEGORY[self]

    @property
    def needs_person(self) -> bool:
        """A person must act (start a worker, register a class, resolve an effect, repair):
        everything but a scheduled retry and what rescue returns by itself."""
        return self.category not in (WaitCategory.SCHEDULED_RETRY, WaitCategory.AWAITING_RESCUE)


_CATEGORY = {
    WaitReason.NO_LIVE_WORKER: WaitCategory.NO_WORKER_CAPACITY,
    WaitReason.WORKERS_BUSY: WaitCategory.NO_WORKER_CAPACITY,
    WaitReason.TENANT_FROZEN: WaitCategory.MISSING_AUTHORITY,
    WaitReason.HELD: WaitCategory.MISSING_AUTHORITY,
    WaitReason.UNREGISTERED_WORKFLOW: WaitCategory.INVALID_CONFIGURATION,
    WaitReason.EFFECTS_DISABLED: WaitCategory.INVALID_CONFIGURATION,
    WaitReason.UNRESOLVED_EFFECT: WaitCategory.AWAITING_RECONCILIATION,
    WaitReason.AWAITING_RESUME: WaitCategory.AWAITING_RECONCILIATION,
    WaitReason.BLOCKED_BY_EFFECT: WaitCategory.AWAITING_RECONCILIATION,
    WaitReason.BACKOFF: WaitCategory.SCHEDULED_RETRY,
    WaitReason.LEASE_EXPIRED: WaitCategory.AWAITING_RESCUE,
    WaitReason.EPOCH_ROTATED: WaitCategory.AWAITING_RESCUE,
}

Record = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class JobGroup:
    """Jobs of one (state, tenant, workflow class)."""

    state: str
    tenant: str
    workflow: str
    jobs: int
    oldest_age_s: float
    attempts: int
    rescued: int

    @classmethod
    def from_record(cls, r: Record) -> JobGroup:
        return cls(
            r["state"], r["tenant"], r["workflow"], r["jobs"], r["oldest_age_s"],
            r["attempts"], r["rescued"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class WaitingGroup:
    """Waiting jobs of one (reason, state, tenant, workflow class)."""

    reason: WaitReason
    state: str
    tenant: str
    workflow: str
    jobs: int
    oldest_age_s: float
    #: The oldest few job ids of the group where a person must act (``needs_person``).
    example_ids: tuple[int, ...] = ()

    @property
    def category(self) -> WaitCategory:
        return self.reason.category

    @classmethod
    def from_record(cls, r: Record) -> WaitingGroup:
        return cls(
            WaitReason(r["reason"]), r["state"], r["tenant"], r["workflow"], r["jobs"],
            r["oldest_age_s"], tuple(r["example_ids"] or ()),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class FinishedGroup:
    """Jobs of one (terminal state, tenant, workflow class) that reached it within the
    window; the newest few ids of the states a person may look at (failed, poison, canceled)."""

    state: str
    tenant: str
    workflow: str
    jobs: int
    last_age_s: float
    example_ids: tuple[int, ...]

    @classmethod
    def from_record(cls, r: Record) -> FinishedGroup:
        return cls(
            r["state"], r["tenant"], r["workflow"], r["jobs"], r["last_age_s"],
            tuple(r["example_ids"] or ()),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class EffectGroup:
    """Effects with an unknown outcome (pending, unknown) by job and effect state; how many of
    them were escalated to a human."""

    tenant: str
    workflow: str
    effect_state: str
    job_state: str
    effects: int
    escalated: int
    oldest_age_s: float

    @classmethod
    def from_record(cls, r: Record) -> EffectGroup:
        return cls(
            r["tenant"], r["workflow"], r["effect_state"], r["job_state"], r["effects"],
            r["escalated"], r["oldest_age_s"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class TenantAuthority:
    """A tenant's authority epoch, whether it is frozen, its held jobs, and the ledger epoch of
    an open restore detection (None: none open)."""

    tenant: str
    epoch: int
    frozen: bool
    held: int
    restore_ledger_epoch: int | None

    @classmethod
    def from_record(cls, r: Record, held: int = 0) -> TenantAuthority:
        return cls(r["tenant"], r["epoch"], r["frozen"], held, r["restore_ledger_epoch"])


@dataclass(frozen=True, slots=True)
class JournalEvidence:
    """A begin a worker's journal holds that the database has no record of (a restore's
    doing, noted at the worker's start: 0054), unacknowledged: the journal keeps it until
    `accord repair acknowledge-evidence --id` (after asking the provider by its key)."""

    evidence_id: int
    tenant: str
    job_id: int
    effect_key: str
    seq: int
    runner_id: str
    idempotency_key: str | None
    age_s: float

    @classmethod
    def from_record(cls, r: Record) -> JournalEvidence:
        return cls(**{f.name: r[f.name] for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class WorkflowClass:
    """A registered workflow class: owner, effects flag, and worker evidence (live leases)."""

    workflow: str
    owner: str
    effects_enabled: bool
    live_leases: int
    last_lease_activity_s: float | None

    @classmethod
    def from_record(cls, r: Record) -> WorkflowClass:
        return cls(
            r["workflow"], r["owner"], r["effects_enabled"], r["live_leases"],
            r["last_lease_activity_s"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RelayFigures:
    """The outbox: unpublished rows, held rows, relay lag (oldest unpublished age), and how
    long a relay's promise to poll still runs (0: none; enqueues skip NOTIFY meanwhile)."""

    pending: int
    held: int
    lag_s: float
    pending_attempts: int
    awake_s: float

    @classmethod
    def from_record(cls, r: Record) -> RelayFigures:
        return cls(r["pending"], r["held"], r["lag_s"], r["pending_attempts"], r["awake_s"])


@dataclass(frozen=True, slots=True)
class MiscountedJob:
    """A job whose row counts a different number of unresolved effects than its records."""

    job_id: int
    tenant: str
    state: str
    counted: int
    recorded: int

    @classmethod
    def from_record(cls, r: Record) -> MiscountedJob:
        return cls(r["job_id"], r["tenant"], r["state"], r["counted"], r["recorded"])


@dataclass(frozen=True, slots=True)
class KeyMismatch:
    """A job without its operation key row, or a key row without its job (``problem``)."""

    job_id: int
    tenant: str
    workflow: str
    operation_id: str
    problem: str

    @classmethod
    def from_record(cls, r: Record) -> KeyMismatch:
        return cls(r["job_id"], r["tenant"], r["workflow"], r["operation_id"], r["problem"])


@dataclass(frozen=True, slots=True)
class StrandedJob:
    """A queued job no claim reads, ever: flagged frozen under a tenant that is not (cause
    ``tenant_frozen``, 0037), or parked for disabled effects in a class whose effects are
    enabled (``effects_parked``, 0038)."""

    job_id: int
    tenant: str
    workflow: str
    state: str
    cause: str

    @classmethod
    def from_record(cls, r: Record) -> StrandedJob:
        return cls(r["job_id"], r["tenant"], r["workflow"], r["state"], r["cause"])


@dataclass(frozen=True, slots=True)
class HeldRows:
    """Held outbox rows of one typed reason."""

    reason: str
    rows: int
    oldest_age_s: float

    @classmethod
    def from_record(cls, r: Record) -> HeldRows:
        return cls(r["reason"], r["rows"], r["oldest_age_s"])


@dataclass(frozen=True, slots=True)
class DeliveryGroup:
    """Inbox decisions of one (consumer, tenant, outcome): new, duplicate or conflict."""

    consumer: str
    tenant: str
    outcome: str
    deliveries: int

    @classmethod
    def from_record(cls, r: Record) -> DeliveryGroup:
        return cls(r["consumer"], r["tenant"], r["outcome"], r["deliveries"])


@dataclass(frozen=True, slots=True)
class PoisonGroup:
    """Poison messages of one (consumer, typed reason)."""

    consumer: str
    reason: str
    messages: int
    oldest_age_s: float

    @classmethod
    def from_record(cls, r: Record) -> PoisonGroup:
        return cls(r["consumer"], r["reason"], r["messages"], r["oldest_age_s"])


@dataclass(frozen=True, slots=True)
class ReplayWindow:
    """A consumer's declared replay window (consumers.replay_windows, 0027) and its effective
    horizon (0028: the window plus margin, or the longer one a lowering declaration replaced,
    while it lasts): finished jobs are kept at least the longest horizon, its poison records
    and inbox rows at least its own."""

    consumer: str
    replay_window_s: float
    margin_s: float
    horizon_s: float
    declared_age_s: float

    @classmethod
    def from_record(cls, r: Record) -> ReplayWindow:
        return cls(
            r["consumer"], r["replay_window_s"], r["margin_s"], r["horizon_s"], r["declared_age_s"]
        )


@dataclass(frozen=True, slots=True)
class RefusalGroup:
    """Replay refusals of one (workflow, typed reason)."""

    workflow: str
    reason: str
    refusals: int

    @classmethod
    def from_record(cls, r: Record) -> RefusalGroup:
        return cls(r["workflow"], r["reason"], r["refusals"])


@dataclass(frozen=True, slots=True)
class StatusReport:
    """One snapshot of everything above, taken at ``taken_at`` (the database clock)."""

    taken_at: datetime
    #: The start of the window ``finished`` and ``deliveries`` cover (the database clock).
    since: datetime
    jobs: tuple[JobGroup, ...]
    finished: tuple[FinishedGroup, ...]
    waiting: tuple[WaitingGroup, ...]
    effects: tuple[EffectGroup, ...]
    miscounted: tuple[MiscountedJob, ...]
    key_mismatches: tuple[KeyMismatch, ...]
    stranded: tuple[StrandedJob, ...]
    tenants: tuple[TenantAuthority, ...]
    #: Unacknowledged notes of begins a restore left without a record (0054).
    journal_evidence: tuple[JournalEvidence, ...]
    workflows: tuple[WorkflowClass, ...]
    relay: RelayFigures
    relay_held: tuple[HeldRows, ...]
    #: Inbox decisions within the window (since).
    deliveries: tuple[DeliveryGroup, ...]
    #: Conflicts among all retained deliveries (0040: by an index of conflicts only).
    inbox_conflicts: int
    poison: tuple[PoisonGroup, ...]
    replay_refusals: tuple[RefusalGroup, ...]
    replay_windows: tuple[ReplayWindow, ...]

    @property
    def poison_messages(self) -> int:
        return sum(p.messages for p in self.poison)

    @property
    def escalated_effects(self) -> int:
        return sum(e.escalated for e in self.effects)

    def count(self, state: str) -> int:
        """Jobs in ``state`` across tenants and workflow classes."""
        return sum(g.jobs for g in self.jobs if g.state == state)

    def finished_count(self, state: str) -> int:
        """Jobs that reached terminal ``state`` within the window, across tenants and classes."""
        return sum(g.jobs for g in self.finished if g.state == state)
