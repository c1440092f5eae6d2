"""Observation points the service loops call: liveness beats and flow counts (process-local).

The relay, the consumers and the job runner call these one-liners from their loops and know
nothing of `/metrics`, `/healthz` or where the figures go; the composition root
(accord.ops.health, accord.ops.metrics) exposes them. This module sits below every other
layer so any of them may call it, and each call is a dictionary write or a counter
increment: never I/O, never a wait, safe from any thread.

Like the logging root and OpenTelemetry's global providers, these are process-wide by
nature (a process has one set of loops and one `/metrics`), so they are module state here
rather than objects threaded through every constructor. Counters only grow, so a scrape's
``rate()`` shows flow even after the outbox or inbox prunes the rows behind it. Labels are
bounded sets only (workflow class, consumer, typed outcome or reason): never a tenant, an
identifier or a payload.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: How long past its promised next beat a loop may be before /healthz calls it stuck.
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Stuck:
    """A loop that promised to beat again by now and has not."""

    loop: str
    overdue_s: float


@dataclass(slots=True)
class _Beat:
    loop: str
    deadline: float  # monotonic; inf while the loop waits for outside work (idle)
    task: weakref.ref[asyncio.Task[object]] | None


class Liveness:
    """The last beat of each running loop. A loop is keyed by its name and its task, so
    parallel loops of one name (consumer lanes, relay loops) are watched apart, and a
    loop whose task has ended is forgotten rather than reported stuck."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s
        self._beats: dict[tuple[str, int], _Beat] = {}
        self._lock = threading.Lock()

    def _set(self, loop: str, deadline: float) -> None:
        try:
            task: asyncio.Task[object] | None = asyncio.current_task()
        except RuntimeError:  # no running loop: a thread of its own
            task = None
        key = (loop, id(task) if task is not None else threading.get_ident())
        ref = weakref.ref(task) if task is not None else None
        with self._lock:
            self._beats[key] = _Beat(loop, deadline, ref)

    def beat(self, loop: str, within_s: float = 0.0) -> None:
        """``loop`` is alive now and will beat again within ``within_s`` (plus the grace)."""
        self._set(loop, time.monotonic() + within_s)

    def idle(self, loop: str) -> None:
        """``loop`` now waits for outside work (a delivery, a notification) with no bound;
        its next :meth:`beat` starts the clock again."""
        self._set(loop, math.inf)

    def loops(self) -> list[str]:
        with self._lock:
            return sorted({b.loop for b in self._beats.values()})

    def stuck(self, now: float | None = None) -> list[Stuck]:
        """The loops overdue by more than the grace (ended tasks are dropped first)."""
        now = time.monotonic() if now is None else now
        found: list[Stuck] = []
        with self._lock:
            for key, b in list(self._beats.items()):
                task = b.task() if b.task is not None else None
                if b.task is not None and (task is None or task.done()):
                    del self._beats[key]
                elif now > b.deadline + self.grace_s:
                    found.append(Stuck(b.loop, now - b.deadline))
        return sorted(found, key=lambda s: s.loop)


#: The process's loops (what /healthz reads).
LIVENESS = Liveness()
#: The process's flow counters and histograms (accord.ops.metrics serves them).
REGISTRY = CollectorRegistry(auto_describe=True)

# Seconds: a publish is milliseconds to minutes behind; a job may take an hour.
_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

EVENTS_PUBLISHED = Counter(
    "accord_relay_events_published", "Events the relay published (broker confirmed)",
    registry=REGISTRY,
)  # fmt: skip
PUBLISH_FAILURES = Counter(
    "accord_relay_publish_failures", "Publish attempts that failed, by typed reason",
    ["reason", "permanent"], registry=REGISTRY,
)  # fmt: skip
SETTLES_LOST = Counter(
    "accord_relay_settles_lost",
    "Rows a relay published or failed but could no longer settle: their lease ran out first"
    " and another relay claimed them (published again)",
    registry=REGISTRY,
)  # fmt: skip
RELAY_LAG = Histogram(
    "accord_relay_publish_lag_seconds", "Enqueued to broker-confirmed, per event",
    buckets=_LATENCY_BUCKETS, registry=REGISTRY,
)  # fmt: skip
DELIVERIES = Counter(
    "accord_consumer_deliveries", "Deliveries settled, by consumer and inbox outcome",
    ["consumer", "outcome"], registry=REGISTRY,
)  # fmt: skip
POISON_QUEUE = Gauge(
    "accord_consumer_poison_queue_messages",
    "Messages in a consumer's poison queue on the broker (those the broker dead-lettered"
    " past the delivery limit have no poison record)",
    ["consumer"], registry=REGISTRY,
)  # fmt: skip
EVENT_LATENCY = Histogram(
    "accord_consumer_event_latency_seconds", "Event enqueued to processed, per delivery",
    ["consumer"], buckets=_LATENCY_BUCKETS, registry=REGISTRY,
)  # fmt: skip
JOBS_FINISHED = Counter(
    "accord_jobs_finished", "Job attempts that ended, by workflow class and ending",
    ["workflow", "ending"], registry=REGISTRY,
)  # fmt: skip
JOB_LATENCY = Histogram(
    "accord_job_succeeded_latency_seconds", "Job submitted to succeeded, per job",
    ["workflow"], buckets=_LATENCY_BUCKETS, registry=REGISTRY,
)  # fmt: skip
EFFECTS = Counter(
    "accord_effects",
    "Effect outcomes, by workflow class and the outcome the database recorded (not_recorded:"
    " the fence refused it or the write gave up; the pending row remains)",
    ["workflow", "outcome"], registry=REGISTRY,
)  # fmt: skip
RESCUES = Counter(
    "accord_rescues", "Expired leases rescued, by the state the job went to",
    ["state"], registry=REGISTRY,
)  # fmt: skip
FENCE_REFUSALS = Counter(
    "accord_fence_refusals", "Write-backs the fence refused, by the failing check",
    ["reason"], registry=REGISTRY,
)  # fmt: skip
AUTHORITY_CHECKS = Counter(
    "accord_authority_checks",
    "A worker's authority (restore) checks, by what brought each on and how it ended",
    ["trigger", "outcome"], registry=REGISTRY,
)  # fmt: skip


def _age_s(since: datetime | None) -> float | None:
    if since is None:
        return None
    aware = since if since.tzinfo is not None else since.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - aware).total_seconds())


_measuring = False
# Set once this process has started: what its start had to do (recovery, checks, the first
# claim or consume) is done and it serves. /readyz says "starting" until then.
_serving = threading.Event()


def start_measuring() -> None:
    """This process serves /metrics: loops may spend a read on figures only metrics need."""
    global _measuring
    _measuring = True


def measuring() -> bool:
    return _measuring


def serving() -> None:
    """This process has started and serves (the moment it logs its ready line)."""
    _serving.set()


def starting() -> None:
    """A command's run begins: it does not serve until it says ready (``serving``). A
    process runs one command, but an in-process driver (a test) may run several."""
    _serving.clear()


def is_serving() -> bool:
    return _serving.is_set()


def beat(loop: str, within_s: float = 0.0) -> None:
    """This loop is alive; it promises its next beat within ``within_s`` (+ the grace)."""
    LIVENESS.beat(loop, within_s)


def idle(loop: str) -> None:
    """This loop waits for outside work with no bound (not stuck while it waits)."""
    LIVENESS.idle(loop)


def published(enqueued_at: datetime | None = None) -> None:
    """One event published; ``enqueued_at`` (the outbox row's) gives the relay lag."""
    EVENTS_PUBLISHED.inc()
    lag = _age_s(enqueued_at)
    if lag is not None:
        RELAY_LAG.observe(lag)


def settle_lost(rows: int) -> None:
    SETTLES_LOST.inc(rows)


def publish_failed(reason: str, *, permanent: bool) -> None:
    PUBLISH_FAILURES.labels(reason, str(permanent).lower()).inc()


def delivered(consumer: str, outcome: str, enqueued_at: datetime | None = None) -> None:
    """One delivery settled (new, duplicate, conflict, retried, poisoned); a committed one
    (new) with the event's enqueue time (``ce-time``) gives the end-to-end latency."""
    DELIVERIES.labels(consumer, outcome).inc()
    latency = _age_s(enqueued_at) if outcome == "new" else None
    if latency is not None:
        EVENT_LATENCY.labels(consumer).observe(latency)


def poison_queue_depth(consumer: str, messages: int) -> None:
    POISON_QUEUE.labels(consumer).set(messages)


def job_finished(workflow: str, ending: str, submitted_at: datetime | None = None) -> None:
    """One attempt ended (published, failed, deadline, fence_lost, ...); a published one with
    the job's ``submitted_at`` (created_at) gives submit-to-succeeded."""
    JOBS_FINISHED.labels(workflow, ending).inc()
    latency = _age_s(submitted_at) if ending == "published" else None
    if latency is not None:
        JOB_LATENCY.labels(workflow).observe(latency)


def effect(workflow: str, outcome: str) -> None:
    EFFECTS.labels(workflow, outcome).inc()


def rescued(state: str) -> None:
    RESCUES.labels(state).inc()


def fence_refused(reason: str) -> None:
    FENCE_REFUSALS.labels(reason).inc()


def authority_checked(trigger: str, outcome: str) -> None:
    """One pass of the authority watch: ``trigger`` is ``start``, ``interval``, ``connection``
    (a lost or new database connection brought it forward) or ``retry`` (the pass before it
    failed); ``outcome`` is ``passed``, ``connection_lost``, ``database_busy`` (a deadlock,
    a statement or lock timeout, a server short of resources) or ``ledger_unavailable``."""
    AUTHORITY_CHECKS.labels(trigger, outcome).inc()
