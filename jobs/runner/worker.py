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
registered workflow class, sharing ``concurrency`` slots, and the upkeep loops beside them
(jobs.runner.upkeep: rescue, retention, the journal's rotation). What the worker serves and
its settings are jobs.runner.config; how a job left it, jobs.runner.endings; an attempt's
span, jobs.runner.attempts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc
from opentelemetry import trace

from accord import observe
from accord.jobs.authority import AuthorityGate
from accord.jobs.errors import (
    EffectConflict,
    EffectIntentInvalid,
    EffectsDisabled,
    EffectsUnresolved,
    EffectUndeclared,
    FenceLost,
    IdempotencyKeyMismatch,
    JournalBroken,
    ObjectKeyInvalid,
    ResultMismatch,
)
from accord.jobs.models import JobState, Lease
from accord.jobs.runner import attempts, recovery, write_back
from accord.jobs.runner.config import Handler, Registered, WorkerConfig
from accord.jobs.runner.context import JobContext
from accord.jobs.runner.endings import Ending, Finished, WorkerStats, error_reason
from accord.jobs.runner.journal import RunnerJournal
from accord.jobs.runner.journal_records import Claim, UnrecordedEffect
from accord.jobs.runner.objects import ObjectStore
from accord.jobs.runner.upkeep import Upkeep
from accord.jobs.store import Store
from accord.schemas.backoff import Reconnect
from accord.schemas.db import DB_CONNECTION_LOST, DB_RETRY_LATER
from accord.schemas.errors import ConfigError

#: The handler's own defects, which a retry cannot mend: the job fails at once. A key its
#: class never declared, an idempotency key other than the one reconcile asks about, an
#: intent with no canonical form or changed since the key was begun, a result named two
#: ways or not as a content address.
HANDLER_DEFECTS = (
    EffectUndeclared,
    IdempotencyKeyMismatch,
    EffectIntentInvalid,
    EffectConflict,
    ResultMismatch,
    ObjectKeyInvalid,
)


def first_in(
    error: BaseException | None, types: type[Exception] | tuple[type[Exception], ...]
) -> Exception | None:
    """``error`` if it is one of ``types``, else the first of them inside an exception group
    (a handler's own task group raises its children's errors as one); None if neither."""
    if isinstance(error, types):
        return error
    if isinstance(error, BaseExceptionGroup):
        found: BaseException | None = error.subgroup(types)
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        return found if isinstance(found, types) else None
    return None


def handler_defect(error: BaseException | None) -> Exception | None:
    """The handler's own defect in ``error`` (itself, or inside an exception group). A retry
    runs the same code and meets it again, so its job fails without one."""
    return first_in(error, HANDLER_DEFECTS)


__all__ = ["Ending", "Finished", "Handler", "Registered", "Worker", "WorkerConfig", "WorkerStats"]

log = logging.getLogger("accord.worker")

#: How often an idle claim loop reads why its claim came back empty (the class's owner).
OWNER_READ_S = 1.0
#: A freed slot's claim linger is at most this share of how long an attempt takes here (a
#: moving average, each attempt weighing JOB_S_WEIGHT), so that short jobs lose at most
#: about a tenth of their slots' time to it, and a second-long job waits the whole linger.
LINGER_SHARE = 0.1
JOB_S_WEIGHT = 0.2


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
        authority: AuthorityGate | None = None,
    ) -> None:
        """``authority``: the gate the process's authority watch keeps (accord worker's);
        claims wait while it is shut, and a claim's lost connection shuts it."""
        self.config = config
        self.stats = WorkerStats()
        #: The journal's unrecorded effects found when ``run`` started (needs ``pool``).
        self.unrecorded: list[UnrecordedEffect] = []
        self._store = store
        # The attempts' store while ``run`` runs: their held connections kept between jobs.
        self._attempts = store
        self._journal = journal
        self._objects = objects
        self._pool = pool
        self._authority = authority
        self._handlers: dict[str, Registered] = {}
        self._running = 0
        self._job_s = 0.0  # how long an attempt takes here, recently (a moving average)
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
        """:meth:`register` each entry, its declared effect keys with it."""
        values = handlers.values() if isinstance(handlers, Mapping) else handlers
        for entry in values:
            self.register(
                entry.workflow, entry.handler, timeout_s=entry.timeout_s, effects=entry.effects
            )

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
        # The attempts keep their connections between jobs (Store.keeping): no pool release,
        # with its reset round trip, and no acquire per job; all go back when the jobs end.
        async with self._store.keeping() as self._attempts, anyio.create_task_group() as jobs:
            self._jobs_scope = jobs.cancel_scope
            # Beside the jobs (it ends with them): what they noted reaches the disk within
            # its linger when no write of theirs carried it first; the rest at close.
            jobs.start_soon(self._journal.flush_noted)
            async with anyio.create_task_group() as loops:
                for registered in self._handlers.values():
                    loops.start_soon(self._claim_loop, registered, jobs)
                upkeep = Upkeep(
                    self.config,
                    store=self._store,
                    pool=self._pool,
                    journal=self._journal,
                    stats=self.stats,
                    stop=self._stop,
                )
                if self.config.rescue_every_s is not None:
                    loops.start_soon(upkeep.rescue, self.config.rescue_every_s)
                if self.config.prune_every_s is not None and self._pool is not None:
                    loops.start_soon(upkeep.prune, self.config.prune_every_s)
                if self._pool is not None:
                    loops.start_soon(upkeep.rotate)
                loops.start_soon(self._watch_journal)
                task_status.started()
            # Stopping: no more claims. Give the jobs in flight their grace, then cancel.
            self._idle = anyio.Event()
            if self._running:
                with anyio.move_on_after(self.config.grace_s):
                    await self._idle.wait()
            jobs.cancel_scope.cancel()

    async def _watch_journal(self) -> None:
        """Until the worker stops: a journal whose write or fsync failed ends the worker (its
        run raises JournalBroken: a crashed loop), so that it claims nothing more whose
        effects could not begin, and a restart reopens and rescans the file."""
        async with anyio.create_task_group() as watch:

            async def until(event: Callable[[], Awaitable[Any]]) -> None:
                await event()
                watch.cancel_scope.cancel()

            watch.start_soon(until, self._stop.wait)
            watch.start_soon(until, self._journal.wait_broken)
        if self._journal.broken is not None:
            log.error("journal broken, the worker stops: %s", self._journal.broken)
            raise self._journal.broken

    async def _claim_loop(self, registered: Registered, jobs: anyio.abc.TaskGroup) -> None:
        # The loop's claims share one kept connection (Store.hold): no pool acquire and
        # release, with its reset round trip, per claim. A failed claim gives it back and the
        # next takes another, as through the pool.
        async with self._store.hold() as claims:
            await self._claims(registered, jobs, claims)

    async def _claims(
        self, registered: Registered, jobs: anyio.abc.TaskGroup, claims: Store
    ) -> None:
        reconnect = Reconnect(f"worker claim {registered.workflow}", log)
        wait = self.config.poll_s
        loop = f"worker.claim.{registered.workflow}"
        owner_read_at = -OWNER_READ_S
        while not self._stopping:
            observe.beat(loop, within_s=max(wait, self.config.poll_s))
            free = self.config.concurrency - self._running
            if free <= 0:
                await self._nap(self.config.poll_s)
                free = self.config.concurrency - self._running
                linger = min(self.config.claim_linger_s, LINGER_SHARE * self._job_s)
                if linger > 0 and 0 < free < self._claim_size:
                    # A slot freed and more could: the slots freeing in the linger share its
                    # claim. (One slot in all, or a claim already full, gains nothing by it.)
                    await self._nap(linger, stop_only=True)
                continue
            if self._authority is not None:
                shut_for = await self._authority_shut(self._authority, claims, reconnect)
                if shut_for:
                    await self._nap(shut_for, stop_only=True)
                    continue
            wanted = min(free, self.config.claim_batch)
            # Reserve the slots before the claim: another class's loop must not claim them too.
            self._running += wanted
            started = anyio.current_time()  # before the claim: the local lease clock is early
            # An empty claim is explained (a transfer of the class ends this worker) at most
            # every OWNER_READ_S, not at every idle poll: the claim itself never takes a job
            # of a class this owner does not serve.
            explain = started - owner_read_at >= OWNER_READ_S
            leases: list[Lease] = []
            try:
                leases = await claims.claim(
                    registered.workflow,
                    self.config.owner,
                    lease_s=self.config.lease_s,
                    limit=wanted,
                    explain_empty=explain,
                )
            except DB_RETRY_LATER as exc:
                wait = max(self.config.poll_s, reconnect.lost(exc))
                if self._authority is not None and isinstance(exc, DB_CONNECTION_LOST):
                    self._authority.lost()
            else:
                self.stats.claims += 1
                reconnect.up()
                wait = self.config.poll_s
                if explain and not leases:
                    owner_read_at = started
            finally:
                self._release(wanted - len(leases))
            seen = attempts.seen(leases)
            for lease in leases:
                self.stats.claimed += 1
                jobs.start_soon(self._run_job, registered, lease, started, seen.get(lease.job_id))
            if len(leases) < wanted:
                # Fewer were due than slots were free: a slot freeing meanwhile is no reason
                # to ask again before the poll (it would cost an empty claim per job).
                await self._nap(wait, stop_only=True)

    async def _authority_shut(
        self, gate: AuthorityGate, claims: Store, reconnect: Reconnect
    ) -> float:
        """How long to wait before claiming (0: claim now). The claims' connection first:
        one opened now (its predecessor closed: the server may have restarted, restored)
        shuts the gate through the pool's ``init`` hook before the claim could use it. Then
        the gate: shut from a lost or new connection until a check that began after it passed
        (the watch's); the jobs in flight go on, each fence deciding for itself."""
        try:
            await claims.connected()
        except DB_RETRY_LATER as exc:
            if isinstance(exc, DB_CONNECTION_LOST):
                gate.lost()
            return max(self.config.poll_s, reconnect.lost(exc))
        return 0.0 if gate.is_open() else self.config.poll_s

    @property
    def _claim_size(self) -> int:
        """The most one claim takes: every slot, up to the claim batch."""
        return min(self.config.concurrency, self.config.claim_batch)

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

    async def _run_job(
        self, registered: Registered, lease: Lease, claimed_at: float, seen: Any = None
    ) -> None:
        span = attempts.start_span(lease, seen)
        try:
            with trace.use_span(
                span, end_on_exit=True, record_exception=False, set_status_on_exception=False
            ):
                await self._attempt(registered, lease, claimed_at, span, seen)
        finally:
            took = anyio.current_time() - claimed_at
            self._job_s += (took - self._job_s) * (JOB_S_WEIGHT if self._job_s else 1.0)
            self._release(1)

    async def _attempt(
        self,
        registered: Registered,
        lease: Lease,
        claimed_at: float,
        span: trace.Span,
        seen: Any = None,
    ) -> None:
        # Noted, not waited for: the database holds the claim (RunnerJournal.note).
        self._journal.note(
            Claim(
                tenant=lease.tenant,
                job_id=lease.job_id,
                attempt_id=lease.attempt_id,
                generation=lease.generation,
            )
        )
        # The attempt's fenced calls (begin/finish effect, publish, fail) share one held
        # connection, kept for the next attempt when it ends clean (see run): no pool
        # acquire and release (with its reset round trip) per call or per job. A call that
        # fails gives it back and the next takes a fresh one (Store.hold), so a lost
        # connection ends the attempt exactly as it did through the pool. The heartbeat
        # does not use it (see _heartbeat).
        async with self._attempts.hold() as store:
            ctx = JobContext(
                lease,
                store=store,
                objects=self._objects,
                journal=self._append,
                note=self._journal.note,
                record_timeout_s=self.config.record_timeout_s,
                effects=registered.effects,
            )
            # Ended before the connection goes back: a shutdown cancelling that await
            # cannot lose how the attempt ended.
            finished = await self._execute(registered, ctx, store, claimed_at, span, seen)
            self._ended(lease, finished, span, seen)

    def _ended(self, lease: Lease, finished: Finished, span: trace.Span, seen: Any) -> None:
        """How an attempt ended: noted in the journal, on its span, counted."""
        self._note(finished)
        attempts.end_span(span, finished)
        observe.job_finished(
            lease.workflow, str(finished.ending), seen["created_at"] if seen else None
        )
        if finished.ending is Ending.FENCE_LOST:
            observe.fence_refused(finished.reason or "unknown")

    async def _execute(
        self,
        registered: Registered,
        ctx: JobContext,
        store: Store,
        claimed_at: float,
        span: trace.Span,
        seen: Any,
    ) -> Finished:
        hard_deadline = claimed_at + registered.timeout_s
        scope = anyio.CancelScope(deadline=min(hard_deadline, claimed_at + self.config.lease_s))
        error: Exception | None = None
        returned = False  # the handler returned, its own deadline not reached
        try:
            # Inside the try: a stop that cancels this round trip (the first await of the
            # attempt) gives the job back at once, as it does a running handler's, instead
            # of leaving it to wait out its lease.
            await attempts.keep_trace(self._store, ctx.lease, span)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeat, ctx, scope, hard_deadline, claimed_at)
                try:
                    with scope:
                        await registered.handler(ctx)
                    # Not a return the deadline or a stop forced (a handler that swallowed the
                    # cancellation returns as well; an effective deadline of -inf means a
                    # cancellation is pending here).
                    returned = (
                        not scope.cancelled_caught
                        and anyio.current_effective_deadline() != -math.inf
                    )
                except Exception as exc:  # noqa: BLE001 - recorded below: the failure policy
                    error = exc
                tg.cancel_scope.cancel()  # stop the heartbeat
        except anyio.get_cancelled_exc_class():
            # Shutdown cancelled the handler: record that honestly before going. A broken
            # journal ends the worker too, and may cancel a job before its own append fails:
            # the reason is then the journal's, as if that append had raised. What the
            # handler ended with before the stop landed (while its heartbeat wound down)
            # keeps its verdict: a defect fails the job, not given back to meet it again;
            # a return completes it, not given back to be run again (or left unknown after
            # a succeeded effect).
            broken, defect = self._journal.broken, handler_defect(error)
            settled = not ctx.published and ctx.fence_lost is None
            with anyio.move_on_after(self.config.record_timeout_s, shield=True):
                if ctx.published:  # it published before the stop: done, nothing to give up
                    finished = self._finished(ctx, Ending.PUBLISHED, JobState.SUCCEEDED, None)
                elif broken is not None:
                    finished = await self._give_up(ctx, store, Ending.STOPPED, error_reason(broken))
                elif defect is not None and settled:
                    finished = await self._give_up(
                        ctx, store, Ending.FAILED, error_reason(defect), retry=False
                    )
                elif returned and settled:
                    finished = await self._complete(ctx, store)
                else:
                    finished = await self._give_up(ctx, store, Ending.STOPPED, "worker_stopped")
                self._ended(ctx.lease, finished, span, seen)
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
            except DB_RETRY_LATER as exc:
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
            if reason == "state" and await self._published_meanwhile(ctx, store):
                return self._finished(ctx, Ending.PUBLISHED, JobState.SUCCEEDED, None)
            return self._finished(ctx, Ending.FENCE_LOST, None, str(reason))
        if error is None and not scope.cancelled_caught:
            return await self._complete(ctx, store)
        if error is None:
            return await self._give_up(ctx, store, Ending.DEADLINE, "deadline")
        broken = first_in(error, JournalBroken)
        if broken is not None:  # the worker's fault, not the job's: it stops
            return await self._give_up(ctx, store, Ending.STOPPED, error_reason(broken))
        defect = handler_defect(error)
        if defect is not None:  # a retry would meet it again: failed at once
            return await self._give_up(ctx, store, Ending.FAILED, error_reason(defect), retry=False)
        # Effects disabled, however deep in a group: the job is parked until they are enabled
        # (jobs.fail parks on that reason alone), not retried to poison.
        parked = first_in(error, EffectsDisabled)
        return await self._give_up(ctx, store, Ending.FAILED, error_reason(parked or error))

    async def _published_meanwhile(self, ctx: JobContext, store: Store) -> bool:
        """Whether this attempt's own publish committed though its answer never came back (a
        renewal that met the job's new state cancelled the handler while the commit's answer
        was on its way): then the attempt published, and is not counted a lost fence. False
        when the job's row cannot be read within the record timeout."""
        with anyio.move_on_after(self.config.record_timeout_s, shield=True):
            return await write_back.published_before(store, ctx.lease)
        return False

    async def _complete(self, ctx: JobContext, store: Store) -> Finished:
        """The handler returned without publishing: that means done, without a result."""
        try:
            with anyio.move_on_after(self.config.record_timeout_s, shield=True):
                await ctx.publish(None)
        except FenceLost as exc:
            return self._finished(ctx, Ending.FENCE_LOST, None, str(exc.fields.get("failed_check")))
        except EffectsUnresolved as exc:
            return await self._give_up(ctx, store, Ending.FAILED, error_reason(exc))
        if ctx.published:
            return self._finished(ctx, Ending.PUBLISHED, JobState.SUCCEEDED, None)
        return self._finished(ctx, Ending.UNRECORDED, None, "publish_unanswered")

    async def _give_up(
        self, ctx: JobContext, store: Store, ending: Ending, reason: str, *, retry: bool = True
    ) -> Finished:
        """Fenced ``fail(retry=...)``: the jobs module requeues it (retry), poisons it after
        its attempts, fails it (no retry), or makes it unknown when an effect forbids running
        it again."""
        tries = 0

        async def give_up() -> JobState:
            nonlocal tries
            tries += 1
            try:
                return await store.fail(ctx.lease, reason, retry=retry)
            except FenceLost as exc:
                # Refused as no longer running after a try whose answer was lost: that try
                # may have committed (counted fence_lost, its state unknown, before).
                if tries > 1 and exc.fields.get("failed_check") == "state":
                    state = await write_back.given_up_before(store, ctx.lease, reason)
                    if state is not None:
                        return state
                raise

        try:
            with anyio.move_on_after(self.config.record_timeout_s, shield=True):
                state = await write_back.again(give_up, what="give-up", lease=ctx.lease)
                return self._finished(ctx, ending, state, reason)
        except FenceLost as exc:
            return self._finished(ctx, Ending.FENCE_LOST, None, str(exc.fields.get("failed_check")))
        log.warning("could not give up job=%s: no answer in its record timeout", ctx.lease.job_id)
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
