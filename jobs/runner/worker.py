"""The worker: claim → handler under a deadline, with heartbeats → fenced write-backs.

Invariant it owns: the worker never writes back except through the jobs module's fenced
calls, and it never pretends. A handler runs under a deadline of min(handler timeout,
lease remaining by the local monotonic clock, measured conservatively from *before* the
claim or renewal call); a heartbeat in the same task group renews the lease at most every
third of the lease and, once the fence is lost, stops renewing and cancels the handler. What
the handler began is recorded honestly whatever ends it: a handler error with no unresolved
effect is retried (``store.fail(retry=True)``), with an unknown or pending effect the job
becomes ``unknown`` (the jobs module decides that, in the same fenced statement), a lost
fence writes nothing, and SIGTERM stops claiming, lets handlers finish within a grace
period, then cancels them (an interrupted effect is recorded unknown).

Loops of one worker process (each polls; polling is the truth): one claim loop per
registered workflow class, sharing ``concurrency`` slots; optionally the jobs module's
rescue, called periodically (rescue itself stays ``Store.rescue``); optionally retention,
one bounded batch at a time (``jobs.retention.prune``); with a pool, the journal's rotation
(``jobs.runner.journal``: the live segment sealed once it passes its bound).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import anyio
import anyio.abc
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from accord import observe
from accord.jobs import retention
from accord.jobs.errors import EffectsUnresolved, EffectUndeclared, FenceLost, PruneBlocked
from accord.jobs.models import EffectState, JobState, Lease
from accord.jobs.runner import recovery
from accord.jobs.runner import sql as runner_sql
from accord.jobs.runner.context import JobContext
from accord.jobs.runner.journal import RunnerJournal
from accord.jobs.runner.journal_records import Claim, EffectRef, UnrecordedEffect
from accord.jobs.runner.objects import ObjectStore
from accord.jobs.store import Store
from accord.schemas import telemetry
from accord.schemas.backoff import Backoff, BackoffPolicy, Reconnect
from accord.schemas.db import DB_CONNECTION_LOST
from accord.schemas.errors import ConfigError

log = logging.getLogger("accord.worker")
_TRACER = telemetry.tracer()

# The reasons jobs.rescue gives a job it takes back from an expired or rotated lease.
RESCUE_REASONS = frozenset({"lease_expired", "epoch_rotated"})

#: A job handler: does the work of one claimed job through its context.
Handler = Callable[[JobContext], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Registered:
    """One workflow class this worker serves: its handler, the handler's timeout, and the
    effect keys (or prefixes ending in a dot) it may begin (None: not declared, any key)."""

    workflow: str
    handler: Handler
    timeout_s: float
    effects: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker process runs; built by the composition root."""

    owner: str  # the registered queue owner of the classes served
    concurrency: int = 4
    lease_s: float = 60.0
    claim_batch: int = 16
    poll_s: float = 1.0
    rescue_every_s: float | None = 5.0  # None: this process does not host the rescue call
    rescue_limit: int = 100
    grace_s: float = 10.0
    record_timeout_s: float = 10.0
    # Retention (jobs.retention.prune, needs the worker's pool): None: this process does not
    # host the prune call. The composition root keeps the retention past the replay horizon.
    prune_every_s: float | None = None
    prune_batch: int = 200
    prune_retention_s: float = 14 * 24 * 3600.0
    prune_audit_retention_s: float = 90 * 24 * 3600.0

    def __post_init__(self) -> None:
        if min(self.concurrency, self.claim_batch, self.rescue_limit) < 1:
            raise ConfigError("worker sizes must be positive", concurrency=self.concurrency)
        if not (self.lease_s > 0 and self.poll_s > 0 and self.grace_s >= 0):
            raise ConfigError("worker times must be positive", lease_s=self.lease_s)
        if self.rescue_every_s is not None and self.rescue_every_s <= 0:
            raise ConfigError("rescue_every_s must be positive or None")
        if self.prune_every_s is not None and not self.prune_every_s > 0:
            raise ConfigError("prune_every_s must be positive or None")
        retention.check(self.prune_retention_s, self.prune_audit_retention_s, self.prune_batch)


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
    renewals: int = 0
    endings: Counter[str] = field(default_factory=Counter)
    rescued: Counter[str] = field(default_factory=Counter)
    recent: deque[Finished] = field(default_factory=lambda: deque(maxlen=1000))
    # The latest effects this process left pending or unknown (each also logged).
    unresolved: deque[tuple[EffectRef, EffectState]] = field(
        default_factory=lambda: deque(maxlen=1000)
    )


class Worker:
    """One worker process's loops over the jobs module (see the module docstring)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        store: Store,
        journal: RunnerJournal,
        objects: ObjectStore,
        pool: Any = None,
    ) -> None:
        self.config = config
        self.stats = WorkerStats()
        #: The journal's unrecorded effects found when ``run`` started (needs ``pool``).
        self.unrecorded: list[UnrecordedEffect] = []
        self._store = store
        self._journal = journal
        self._objects = objects
        self._pool = pool
        self._handlers: dict[str, Registered] = {}
        self._running = 0
        self._stopping = False
        self._stop = anyio.Event()
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._jobs_scope: anyio.CancelScope | None = None

    # -- registration and control ---------------------------------------------------------

    def register(
        self,
        workflow: str,
        handler: Handler,
        *,
        timeout_s: float,
        effects: Sequence[str] | None = None,
    ) -> None:
        """Serve ``workflow`` with ``handler``, each run bounded by ``timeout_s``; with
        ``effects``, the handler may begin only those keys (or prefixes ending in a dot)."""
        if not timeout_s > 0:
            raise ConfigError("a handler timeout must be positive", workflow=workflow)
        if workflow in self._handlers:
            raise ConfigError("a handler is already registered", workflow=workflow)
        declared = None if effects is None else tuple(effects)
        self._handlers[workflow] = Registered(workflow, handler, timeout_s, declared)

    def register_all(self, handlers: Mapping[str, Registered] | Sequence[Registered]) -> None:
        values = handlers.values() if isinstance(handlers, Mapping) else handlers
        for entry in values:
            self.register(entry.workflow, entry.handler, timeout_s=entry.timeout_s)

    @property
    def workflows(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def journal(self) -> RunnerJournal:
        """This runner's journal (the caller opened it and closes it)."""
        return self._journal

    @property
    def running(self) -> int:
        """Jobs this worker holds right now."""
        return self._running

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming; in-flight handlers get ``grace_s`` (``now``: none) to finish."""
        self._stopping = True
        self._stop.set()
        self._wake.set()
        if now and self._jobs_scope is not None:
            self._jobs_scope.cancel()

    # -- the loops ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until :meth:`stop`. Refuses to start (RegistrationError) unless ``owner`` is the
        registered queue owner of every class served; reports the journal's unrecorded
        effects first. A crashed loop cancels the rest (recorded honestly) and propagates."""
        if not self._handlers:
            raise ConfigError("the worker has no handler registered")
        for workflow in self._handlers:
            await self._store.require_registration(workflow, self.config.owner)
        if self._pool is not None:
            self.unrecorded = await recovery.report_unrecorded(self._pool, self._journal)
            # This run begins on a new segment carrying exactly those (0.2's file migrates).
            await recovery.seal_at_start(self._journal, self.unrecorded)
        async with anyio.create_task_group() as jobs:
            self._jobs_scope = jobs.cancel_scope
            async with anyio.create_task_group() as loops:
                for registered in self._handlers.values():
                    loops.start_soon(self._claim_loop, registered, jobs)
                if self.config.rescue_every_s is not None:
                    loops.start_soon(self._rescue_loop, self.config.rescue_every_s)
                if self.config.prune_every_s is not None and self._pool is not None:
                    loops.start_soon(self._prune_loop, self.config.prune_every_s)
                if self._pool is not None:
                    loops.start_soon(self._journal_loop)
                task_status.started()
            # Stopping: no more claims. Give the jobs in flight their grace, then cancel.
            self._idle = anyio.Event()
            if self._running:
                with anyio.move_on_after(self.config.grace_s):
                    await self._idle.wait()
            jobs.cancel_scope.cancel()

    async def _claim_loop(self, registered: Registered, jobs: anyio.abc.TaskGroup) -> None:
        reconnect = Reconnect(f"worker claim {registered.workflow}", log)
        wait = self.config.poll_s
        loop = f"worker.claim.{registered.workflow}"
        while not self._stopping:
            observe.beat(loop, within_s=max(wait, self.config.poll_s))
            free = self.config.concurrency - self._running
            if free <= 0:
                await self._nap(self.config.poll_s)
                continue
            wanted = min(free, self.config.claim_batch)
            # Reserve the slots before the claim: another class's loop must not claim them too.
            self._running += wanted
            started = anyio.current_time()  # before the claim: the local lease clock is early
            leases: list[Lease] = []
            try:
                leases = await self._store.claim(
                    registered.workflow,
                    self.config.owner,
                    lease_s=self.config.lease_s,
                    limit=wanted,
                )
            except DB_CONNECTION_LOST as exc:
                wait = max(self.config.poll_s, reconnect.lost(exc))
            else:
                reconnect.up()
                wait = self.config.poll_s
            finally:
                self._release(wanted - len(leases))
            seen = await self._attempts_seen(leases)
            for lease in leases:
                self.stats.claimed += 1
                jobs.start_soon(self._run_job, registered, lease, started, seen.get(lease.job_id))
            if len(leases) < wanted:
                await self._nap(wait)

    async def _rescue_loop(self, every_s: float) -> None:
        while not self._stopping:
            observe.beat("worker.rescue", within_s=every_s)
            try:
                report = await self._store.rescue(self.config.rescue_limit)
            except DB_CONNECTION_LOST as exc:
                log.warning("rescue failed (%s)", type(exc).__name__)
            else:
                for rescued in report.rescued:
                    self.stats.rescued[str(rescued.state)] += 1
                    observe.rescued(str(rescued.state))
                    log.info(
                        "rescued job=%s tenant=%s to %s (generation %s)",
                        rescued.job_id,
                        rescued.tenant,
                        rescued.state,
                        rescued.generation,
                    )
            await self._nap(every_s, stop_only=True)

    async def _prune_loop(self, every_s: float) -> None:
        """Retention: one short transaction per bounded batch (jobs.retention.prune); while
        they come back full (a backlog) the next follows after a pause as long as the batch
        took, so retention takes at most half of this loop's time, else a nap of ``every_s``.
        A batch another schema's foreign key refuses (PruneBlocked) is logged and tried again
        after a growing wait, capped at an hour: retention stops there, the jobs never do."""
        cfg = self.config
        blocked = Backoff(BackoffPolicy(base_s=every_s, cap_s=max(every_s, 3600.0)))
        while not self._stopping:
            wait = every_s
            started = anyio.current_time()
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    pruned = await retention.prune(
                        conn,
                        retention_s=cfg.prune_retention_s,
                        audit_retention_s=cfg.prune_audit_retention_s,
                        limit=cfg.prune_batch,
                    )
            except PruneBlocked as exc:
                wait = blocked.next()
                log.error("retention blocked, retrying in %.0f s: %s", wait, exc)
            except DB_CONNECTION_LOST as exc:
                log.warning("prune failed (%s)", type(exc).__name__)
            else:
                blocked.reset()
                if pruned.rows:
                    log.info(
                        "pruned jobs=%d effects=%d results=%d audit=%d",
                        pruned.jobs,
                        pruned.effects,
                        pruned.results,
                        pruned.audit,
                    )
                if pruned.full(cfg.prune_batch):
                    wait = min(every_s, anyio.current_time() - started)
            observe.beat("worker.prune", within_s=wait)
            await self._nap(wait, stop_only=True)

    async def _nap(self, seconds: float, *, stop_only: bool = False) -> None:
        """Sleep up to ``seconds``; a stop (or, unless ``stop_only``, a freed slot) wakes us."""
        event = self._stop if stop_only else self._wake
        with anyio.move_on_after(seconds):
            await event.wait()

    def _release(self, slots: int) -> None:
        if slots <= 0:
            return
        self._running -= slots
        self._wake.set()
        self._wake = anyio.Event()
        if self._stopping:
            self._wake.set()
            if not self._running:
                self._idle.set()

    # -- one job -------------------------------------------------------------------------------

    async def _append(self, record: Any) -> None:
        # Group commit: shares one write and fsync with the jobs appending meanwhile, and
        # returns once the record is durable (the step after it relies on that).
        await self._journal.write(record)

    async def _journal_loop(self) -> None:
        """Seal the journal's live segment whenever it passes its bound (polling), carrying
        forward the effects the database has not recorded; a failed try waits and retries."""
        while not self._stopping:
            wait = self.config.poll_s
            if self._journal.rotation_due:
                try:
                    await recovery.rotate_journal(self._pool, self._journal)
                except DB_CONNECTION_LOST as exc:  # OSError too: a write before the switch
                    # The live segment is whole and still written; only its sealing waits.
                    wait = max(wait, 5.0)
                    log.warning("journal rotation failed (%s), retrying", type(exc).__name__)
            observe.beat("worker.journal", within_s=wait)
            await self._nap(wait, stop_only=True)

    async def _attempts_seen(self, leases: list[Lease]) -> dict[int, Any]:
        """For the attempt spans and the submit-to-finish histogram only (none unless tracing
        or serving metrics): each claimed job's stored trace context, its attempts, how the
        previous attempt ended and when it was submitted, in one read."""
        wanted = telemetry.tracing_on() or observe.measuring()
        if not leases or self._pool is None or not wanted:
            return {}
        try:
            rows = await self._pool.fetch(
                runner_sql.ATTEMPT_CONTEXT, [lease.job_id for lease in leases]
            )
        except DB_CONNECTION_LOST as exc:
            log.warning("attempt context not read (%s)", type(exc).__name__)
            return {}
        return {row["job_id"]: row for row in rows}

    async def _note_trace(self, lease: Lease, span: trace.Span) -> None:
        """Keep the attempt span's context with the job, so the next attempt can link to it
        (tracing only; a lost connection only costs the link)."""
        carrier = telemetry.span_headers(span)
        if not carrier:
            return
        try:
            await self._store.note_trace(lease, carrier)
        except DB_CONNECTION_LOST as exc:
            log.warning("attempt trace not kept (%s)", type(exc).__name__)

    def _attempt_span(self, lease: Lease, seen: Any) -> trace.Span:
        """The ``attempt`` span of this claim: a child of the ``process`` span that submitted
        the job (every attempt in the operation's one trace), linked to it, with the attempt
        number and how the attempt before it ended."""
        stored = telemetry.carrier_from_json(seen["trace"]) if seen is not None else {}
        attributes: dict[str, Any] = {
            telemetry.ATTR_JOB_ID: lease.job_id,
            telemetry.ATTR_WORKFLOW: lease.workflow,
            telemetry.ATTR_TENANT: lease.tenant,
            telemetry.ATTR_OPERATION_ID: lease.operation_id,
            telemetry.ATTR_ATTEMPT_ID: str(lease.attempt_id),
            telemetry.ATTR_GENERATION: lease.generation,
        }
        previous = None
        if seen is not None:
            attributes[telemetry.ATTR_JOB_ATTEMPT] = seen["attempts"]
            previous = seen["last_error"] if seen["attempts"] > 1 else None
            if previous is not None:
                attributes[telemetry.ATTR_JOB_PREVIOUS_REASON] = previous
        # Linked to the span that submitted the job and, from the second attempt on, to the
        # attempt before it (its context kept by jobs.note_trace while tracing).
        before = telemetry.carrier_from_json(seen["attempt_trace"]) if seen is not None else {}
        span = _TRACER.start_span(
            f"attempt {lease.workflow}",
            context=telemetry.parent_from(stored),
            kind=trace.SpanKind.CONSUMER,
            links=[
                *telemetry.links_from(stored, "job"),
                *telemetry.links_from(before, "previous_attempt"),
            ],
            attributes=attributes,
        )
        if previous in RESCUE_REASONS:
            span.add_event(telemetry.EVENT_RESCUED, {telemetry.ATTR_JOB_REASON: previous})
        return span

    async def _run_job(
        self, registered: Registered, lease: Lease, claimed_at: float, seen: Any = None
    ) -> None:
        span = self._attempt_span(lease, seen)
        await self._note_trace(lease, span)
        try:
            with trace.use_span(
                span, end_on_exit=True, record_exception=False, set_status_on_exception=False
            ):
                await self._attempt(registered, lease, claimed_at, span, seen)
        finally:
            self._release(1)

    async def _attempt(
        self,
        registered: Registered,
        lease: Lease,
        claimed_at: float,
        span: trace.Span,
        seen: Any = None,
    ) -> None:
        await self._append(
            Claim(
                tenant=lease.tenant,
                job_id=lease.job_id,
                attempt_id=lease.attempt_id,
                generation=lease.generation,
            )
        )
        # The attempt's fenced calls (begin/finish effect, publish, fail) share one held
        # connection: no pool acquire and release (with its reset round trip) per call. A
        # call that fails gives it back and the next takes a fresh one (Store.hold), so a
        # lost connection ends the attempt exactly as it did through the pool. The heartbeat
        # does not use it (see _heartbeat).
        async with self._store.hold() as store:
            ctx = JobContext(
                lease,
                store=store,
                objects=self._objects,
                journal=self._append,
                record_timeout_s=self.config.record_timeout_s,
                effects=registered.effects,
            )
            finished = await self._execute(registered, ctx, store, claimed_at)
            # Noted before the connection goes back: a shutdown cancelling that await
            # cannot lose how the attempt ended.
            self._note(finished)
            _end_attempt(span, finished)
            observe.job_finished(
                lease.workflow, str(finished.ending), seen["created_at"] if seen else None
            )
            if finished.ending is Ending.FENCE_LOST:
                observe.fence_refused(finished.reason or "unknown")

    async def _execute(
        self, registered: Registered, ctx: JobContext, store: Store, claimed_at: float
    ) -> Finished:
        hard_deadline = claimed_at + registered.timeout_s
        scope = anyio.CancelScope(deadline=min(hard_deadline, claimed_at + self.config.lease_s))
        error: Exception | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeat, ctx, scope, hard_deadline, claimed_at)
                try:
                    with scope:
                        await registered.handler(ctx)
                except Exception as exc:  # noqa: BLE001 - recorded below: the failure policy
                    error = exc
                tg.cancel_scope.cancel()  # stop the heartbeat
        except anyio.get_cancelled_exc_class():
            # Shutdown cancelled the handler: record that honestly before going.
            with anyio.move_on_after(self.config.record_timeout_s, shield=True):
                self._note(await self._give_up(ctx, store, Ending.STOPPED, "worker_stopped"))
            raise
        return await self._settle(ctx, store, scope, error)

    async def _heartbeat(
        self, ctx: JobContext, scope: anyio.CancelScope, hard_deadline: float, claimed_at: float
    ) -> None:
        """Renew at most every third of the lease; on FenceLost stop and cancel the handler.

        Renewals go through the pool store, on a connection of their own for one statement,
        never on the attempt's held one: an asyncpg connection runs one query at a time, so
        sharing it would make a renewal wait behind whatever handler call is in flight (a
        publish callback's statements, a call stuck until its command timeout) while the
        lease runs out. The pool always has one to give: held connections are at most one
        per slot and the pool is sized above that (accord.commands.worker.pool_size). The
        two connections meet only on the job's row lock, each for one short statement or
        transaction, as they did when every call took its own pool connection."""
        lease_s = self.config.lease_s
        next_at = claimed_at + lease_s / 3
        while True:
            await anyio.sleep_until(next_at)
            started = anyio.current_time()
            next_at = started + lease_s / 3
            try:
                lease = await self._store.renew(ctx.lease, lease_s)
            except FenceLost as exc:
                ctx.fence_lost = exc
                log.warning(
                    "lease lost: job=%s generation=%s fence=%s; stopping the handler",
                    ctx.lease.job_id,
                    ctx.lease.generation,
                    exc.fields.get("failed_check"),
                )
                scope.cancel()
                return
            except DB_CONNECTION_LOST as exc:
                # Not renewed: the handler's deadline stays at the old local lease expiry.
                log.warning("renew failed: job=%s (%s)", ctx.lease.job_id, type(exc).__name__)
                continue
            ctx.renewed(lease)
            self.stats.renewals += 1
            scope.deadline = min(hard_deadline, started + lease_s)

    async def _settle(
        self, ctx: JobContext, store: Store, scope: anyio.CancelScope, error: Exception | None
    ) -> Finished:
        if ctx.published:
            if error is not None:
                log.warning("handler raised after its publish: job=%s", ctx.lease.job_id)
            return self._finished(ctx, Ending.PUBLISHED, JobState.SUCCEEDED, None)
        if ctx.fence_lost is not None or isinstance(error, FenceLost):
            lost = ctx.fence_lost or error
            reason = lost.fields.get("failed_check") if isinstance(lost, FenceLost) else None
            return self._finished(ctx, Ending.FENCE_LOST, None, str(reason))
        if error is None and not scope.cancelled_caught:
            return await self._complete(ctx, store)
        if error is None:
            return await self._give_up(ctx, store, Ending.DEADLINE, "deadline")
        # A key the class never declared is the handler's own defect: retrying cannot help.
        retry = not isinstance(error, EffectUndeclared)
        return await self._give_up(ctx, store, Ending.FAILED, _reason(error), retry=retry)

    async def _complete(self, ctx: JobContext, store: Store) -> Finished:
        """The handler returned without publishing: that means done, without a result."""
        try:
            with anyio.move_on_after(self.config.record_timeout_s, shield=True):
                await ctx.publish(None)
        except FenceLost as exc:
            return self._finished(ctx, Ending.FENCE_LOST, None, str(exc.fields.get("failed_check")))
        except EffectsUnresolved as exc:
            return await self._give_up(ctx, store, Ending.FAILED, _reason(exc))
        except DB_CONNECTION_LOST as exc:
            log.warning("could not complete job=%s (%s)", ctx.lease.job_id, type(exc).__name__)
        if ctx.published:
            return self._finished(ctx, Ending.PUBLISHED, JobState.SUCCEEDED, None)
        return self._finished(ctx, Ending.UNRECORDED, None, "publish_unanswered")

    async def _give_up(
        self, ctx: JobContext, store: Store, ending: Ending, reason: str, *, retry: bool = True
    ) -> Finished:
        """Fenced ``fail(retry=...)``: the jobs module requeues it (retry), poisons it after
        its attempts, fails it (no retry), or makes it unknown when an effect forbids running
        it again."""
        try:
            with anyio.move_on_after(self.config.record_timeout_s, shield=True):
                state = await store.fail(ctx.lease, reason, retry=retry)
                return self._finished(ctx, ending, state, reason)
        except FenceLost as exc:
            return self._finished(ctx, Ending.FENCE_LOST, None, str(exc.fields.get("failed_check")))
        except DB_CONNECTION_LOST as exc:
            log.warning("could not give up job=%s (%s)", ctx.lease.job_id, type(exc).__name__)
        return self._finished(ctx, Ending.UNRECORDED, None, reason)

    def _finished(
        self, ctx: JobContext, ending: Ending, state: JobState | None, reason: str | None
    ) -> Finished:
        lease = ctx.lease
        return Finished(
            lease.job_id,
            lease.generation,
            ending,
            state,
            reason,
            tuple(ctx.trail.unresolved.items()),
        )

    def _note(self, finished: Finished) -> None:
        self.stats.endings[str(finished.ending)] += 1
        self.stats.recent.append(finished)
        level = logging.INFO if finished.ending is Ending.PUBLISHED else logging.WARNING
        log.log(
            level,
            "job=%s generation=%s %s state=%s reason=%s",
            finished.job_id,
            finished.generation,
            finished.ending,
            finished.state,
            finished.reason,
        )
        for ref, state in finished.unresolved:
            self.stats.unresolved.append((ref, state))
            log.warning(
                "effect needs reconciliation: job=%s key=%s seq=%s state=%s",
                ref.job_id,
                ref.effect_key,
                ref.seq,
                state,
            )


def _reason(error: BaseException) -> str:
    """The typed reason stored as the job's last error (never a payload or message text)."""
    reason = getattr(type(error), "reason", None)
    if isinstance(reason, str):
        return reason
    return f"handler:{type(error).__name__}"


def _end_attempt(span: trace.Span, finished: Finished) -> None:
    """How the attempt ended, on its span; an error only when the job's state is terminal."""
    if not span.is_recording():
        return
    span.set_attribute(telemetry.ATTR_JOB_ENDING, str(finished.ending))
    if finished.state is not None:
        span.set_attribute(telemetry.ATTR_JOB_STATE, str(finished.state))
    if finished.reason is not None:
        span.set_attribute(telemetry.ATTR_JOB_REASON, finished.reason)
    if finished.ending is Ending.FENCE_LOST:
        span.add_event(
            telemetry.EVENT_FENCE_REFUSED, {telemetry.ATTR_JOB_REASON: str(finished.reason)}
        )
    if finished.state is not None and str(finished.state) in telemetry.TERMINAL_JOB_STATES:
        span.set_status(Status(StatusCode.ERROR, finished.reason or str(finished.state)))
