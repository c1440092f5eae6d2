"""How a claimed job left a worker, as the worker saw it (the database is the truth), and the
process-local counters a worker keeps of them for logs, tests and metrics."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from enum import StrEnum

from accord.jobs.models import EffectState, JobState
from accord.jobs.runner.journal_records import EffectRef


class Ending(StrEnum):
    """How one claimed job left this worker."""

    PUBLISHED = "published"  # the fenced publish committed
    FAILED = "failed"  # the handler failed; the job went to the state the jobs module chose
    DEADLINE = "deadline"  # the handler ran out of time; likewise
    STOPPED = "stopped"  # cancelled by shutdown; likewise
    FENCE_LOST = "fence_lost"  # the lease was gone: nothing could be written back
    UNRECORDED = "unrecorded"  # the database did not answer: the lease runs out, rescue acts


@dataclass(frozen=True, slots=True)
class Finished:
    """One claimed job's end as this worker saw it (the database is the truth)."""

    job_id: int
    generation: int
    ending: Ending
    state: JobState | None  # the job's state after our write-back, when we made one
    reason: str | None
    unresolved: tuple[tuple[EffectRef, EffectState], ...] = ()


@dataclass(slots=True)
class WorkerStats:
    """Process-local counters for logs, tests and metrics."""

    claimed: int = 0
    claims: int = 0  # claim statements, empty or not
    renewals: int = 0
    endings: Counter[str] = field(default_factory=Counter)
    rescued: Counter[str] = field(default_factory=Counter)
    recent: deque[Finished] = field(default_factory=lambda: deque(maxlen=1000))
    # The latest effects this process left pending or unknown (each also logged).
    unresolved: deque[tuple[EffectRef, EffectState]] = field(
        default_factory=lambda: deque(maxlen=1000)
    )


def error_reason(error: BaseException) -> str:
    """The typed reason stored as the job's last error (never a payload or message text)."""
    typed = getattr(type(error), "reason", None)
    if isinstance(typed, str):
        return typed
    return f"handler:{type(error).__name__}"
