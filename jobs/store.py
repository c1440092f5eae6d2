"""The jobs store: submit in the caller's transaction, and the single claimant's short
transactions (claim, renew, publish, effects, fail, rescue, cancel, authority, registration).

Invariant: a job has at most one holder at a time, and only the holder of the current lease
can write back; each write-back passes the fence (``jobs.fence``) on the locked row and
checks the affected row count. Claim, rescue and cancel advance the generation, so a worker
that lost its job, however plausible its result, can no longer publish. Rescue (this module,
nobody else) is the only loop that returns abandoned running work to the queue.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import asyncpg
from opentelemetry.trace import Status, StatusCode

from accord.jobs import fence, publish, registry, sql
from accord.jobs.connections import Held, Mapped, Session, Spares
from accord.jobs.errors import (
    EffectAlreadyBegun,
    EffectConflict,
    EffectNotPending,
    EffectsDisabled,
    InvalidLeaseLength,
    JobConflict,
    JobNotFound,
)
from accord.jobs.models import (
    Cancellation,
    Effect,
    EffectStart,
    EffectState,
    Health,
    JobState,
    JobView,
    Lease,
    Registration,
    Rescued,
    RescueReport,
    Submitted,
)
from accord.jobs.publish import BatchPublished, Result
from accord.schemas import telemetry
from accord.schemas.db import DB_CONNECTION_LOST, Tx, require_transaction
from accord.schemas.errors import ConfigError
from accord.schemas.settings import MAX_LEASE_S

#: A publish callback: database-only work in the publish transaction (no external I/O).
Callback = Callable[[Tx], Awaitable[None]]

#: How long a keeping store keeps an unused connection before the pool gets it back.
KEPT_IDLE_S = 60.0

log = logging.getLogger("jobs")


def valid_lease(lease_s: object) -> bool:
    """A lease length the claim and renew take: a finite number of seconds in (0, MAX_LEASE_S]
    (also what an App's job class may declare)."""
    return (
        isinstance(lease_s, int | float) and math.isfinite(lease_s) and 0 < lease_s <= MAX_LEASE_S
    )


def _lease_seconds(lease_s: float) -> float:
    if not valid_lease(lease_s):
        raise InvalidLeaseLength(lease_s=lease_s)
    return float(lease_s)


async def submit(
    tx: Tx,
    *,
    tenant: str,
    workflow: str,
    operation_id: str,
    digest: str,
    payload: dict[str, Any] | None = None,
    max_attempts: int = 5,
) -> Submitted:
    """Runs in the caller's transaction; never commits. Creates the job for (tenant,
    workflow, operation id) or returns the existing one untouched, whatever its state.
    Raises JobConflict (with both digests) if the operation exists with another digest.
    """
    require_transaction(tx)
    row = await tx.fetchrow(
        sql.SUBMIT, tenant, workflow, operation_id, digest, json.dumps(payload or {}), max_attempts
    )
    if row["digest"] != digest:
        raise JobConflict(
            job_id=row["job_id"],
            operation_id=operation_id,
            existing_digest=row["digest"],
            submitted_digest=digest,
        )
    return Submitted(job_id=row["job_id"], created=row["created"], state=JobState(row["state"]))


class Store:
    """The single claimant; each method is one short transaction.

    Give it an asyncpg pool (each call acquires a connection) or one connection that a
    worker keeps for its loop (no acquire/release round trip per call; one call at a time).
    ``hold()`` gives a store over a pool one held connection for a sequence of calls.
    """

    #: The fence helper, for publish callbacks: ``await Store.locked(tx, lease)``.
    locked = staticmethod(fence.locked)
    #: The fenced manifest row, for publish callbacks:
    #: ``await Store.record_result(tx, lease, object_key, content_digest)``.
    record_result = staticmethod(fence.record_result)

    def __init__(
        self,
        db: asyncpg.Pool | Any,
        *,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 300.0,
    ) -> None:
        self._db = db
        self._source: Held | Session | None = None if isinstance(db, asyncpg.Pool) else Held(db)
        self._backoff = (backoff_base_s, backoff_max_s)
        # The connections held ones end with, kept unreset for the next hold (``keeping``).
        self._spares: Spares | None = None

    def _connection(self) -> Any:
        """An async context manager for one call's connection: the pool's acquire, or the
        held connection; a lost connection comes out as ConnectionLost."""
        return Mapped(self._db.acquire() if self._source is None else self._source.lend())

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[Store]:
        """A store like this one whose calls share one pool connection, taken at its first
        call and given back on exit (on a ``keeping`` store: kept for the next hold, when it
        ends clean): no acquire and release (asyncpg's reset is a round trip) per call. A
        call that fails gives it back and the next call takes another (see
        ``connections.Session``), so each call fails or succeeds exactly as it would through
        the pool.
        A store over one connection yields itself.

        Each holder keeps a connection while it lives: the pool needs more connections than
        holders, or a call through the pool store (a renewal) could wait for one forever.
        """
        if not isinstance(self._db, asyncpg.Pool):
            yield self
            return
        session = Session(self._db, self._spares)
        store = copy.copy(self)
        store._source = session
        try:
            yield store
        finally:
            await session.close(keep=True)

    @contextlib.asynccontextmanager
    async def keeping(self, *, idle_s: float = KEPT_IDLE_S) -> AsyncIterator[Store]:
        """A store like this one whose holds (``hold``) keep their connection for the next
        hold when they end clean (open, outside any transaction) instead of giving it back
        to the pool, and so skip the pool's reset round trip per hold: every publish
        callback on such a connection (the only application code that runs on it) ends in
        a statement that resets the session as the pool would (``jobs.clean_session``), and
        any call that fails gives its connection back to the pool as before. A connection
        kept longer than ``idle_s`` unused goes back to the pool, and every one on exit. A
        worker's attempts use it: one reset less per job. A store over one connection
        yields itself."""
        if not (math.isfinite(idle_s) and idle_s >= 0):
            raise ConfigError(
                "a kept connection's idle limit must be finite and >= 0 s", idle_s=idle_s
            )
        if not isinstance(self._db, asyncpg.Pool):
            yield self
            return
        store = copy.copy(self)
        store._spares = spares = Spares(self._db, idle_s)
        try:
            yield store
        finally:
            await spares.give_all()

    # -- claiming ------------------------------------------------------------------------

    async def connected(self) -> None:
        """A held store (``hold``): its connection, taken now if it has none or the one it
        held was closed (replaced as its next call would replace it); no statement is sent.
        Otherwise nothing. A caller that must see a new connection before its call (the
        worker's authority gate, through the pool's ``init`` hook) calls this first. Raises
        ConnectionLost when none can be taken."""
        if self._source is not None:
            async with self._connection():
                pass

    async def claim(
        self,
        workflow: str,
        owner: str,
        *,
        lease_s: float,
        limit: int = 1,
        explain_empty: bool = True,
    ) -> list[Lease]:
        """One short transaction: claims up to ``limit`` due jobs (SKIP LOCKED). Returns []
        when no work is due; raises WorkflowNotRegistered / WorkflowOwnedElsewhere when
        ``owner`` does not serve ``workflow`` (checked in the claim itself, which takes no job
        then, and re-read on empty unless ``explain_empty`` is False: a polling caller asks
        for the reason now and then, not at every empty poll).
        """
        seconds = _lease_seconds(lease_s)
        async with self._connection() as conn:
            rows = await conn.fetch(sql.CLAIM, workflow, owner, seconds, limit)
            if not rows and explain_empty:
                await registry.require(conn, workflow, owner)
        return [Lease.from_record(row) for row in rows]

    async def renew(self, lease: Lease, lease_s: float) -> Lease:
        """Extends the caller's own unexpired lease from the database clock; raises FenceLost
        otherwise (an expired lease is never revived)."""
        seconds = _lease_seconds(lease_s)
        async with self._connection() as conn:
            row = await conn.fetchrow(sql.RENEW, *lease.fence_args(), seconds)
        if row["status"] is not None:
            raise fence.fence_lost(lease, row["status"])
        return Lease(
            job_id=lease.job_id,
            tenant=lease.tenant,
            workflow=lease.workflow,
            operation_id=lease.operation_id,
            owner=lease.owner,
            attempt_id=lease.attempt_id,
            generation=lease.generation,
            epoch=lease.epoch,
            lease_expires_at=row["lease_expires_at"],
            payload=lease.payload,
        )

    async def publish(
        self, lease: Lease, callback: Callback | None = None, *, result: Result | None = None
    ) -> None:
        """One transaction: fence → database-only ``callback(tx)`` → fence again →
        succeeded. Raises FenceLost (nothing the callback wrote survives) or
        EffectsUnresolved (an effect is pending or unknown). Without a callback the fence
        and the transition are one statement, which is its own transaction. ``result``
        (object key, content digest) names the job's result object: the fenced transition's
        own statement writes its ``jobs.results`` manifest row (no ``record_result`` call,
        no fence of its own), so it is authoritative exactly when the job succeeded.
        """
        async with self._connection() as conn:
            if callback is None:
                await publish.one(conn, lease, result)
                return
            async with conn.transaction():
                await fence.locked(conn, lease)
                await callback(conn)
                # A refusal rolls the callback's writes back. On a connection kept between
                # holds (``keeping``), the same statement resets what the callback left.
                await publish.one(conn, lease, result, clean=self._spares is not None)

    async def publish_many(self, leases: list[Lease]) -> BatchPublished:
        """One statement (its own transaction) publishes a batch of leases without callbacks:
        each lease passes the whole fence on its own row or is refused alone. The refused come
        back with their error (FenceLost naming the field, or EffectsUnresolved)."""
        async with self._connection() as conn:
            return await publish.batch(conn, leases)

    async def fail(self, lease: Lease, reason: str, *, retry: bool) -> JobState:
        """Fenced: gives the job up. Returns its new state: queued (retry, with backoff),
        poison (attempts used up), failed (no retry) or unknown (an effect forbids a rerun).
        Call it only once every call of this attempt has ended: it ends the attempt's
        granted lease (0058), from which `accord reconcile` counts that nothing of the
        attempt is still being sent."""
        async with self._connection() as conn:
            row = await conn.fetchrow(sql.FAIL, *lease.fence_args(), reason, retry, *self._backoff)
        if row["status"] is not None:
            raise fence.fence_lost(lease, row["status"])
        return JobState(row["state"])

    # -- effects ---------------------------------------------------------------------------

    async def begin_effect(self, lease: Lease, key: str, intent_digest: str) -> int:
        """Fenced: records effect ``key`` as pending before dispatch; returns its record's
        seq. Only a recorded failed_before_dispatch lets the same key begin again; a key that
        succeeded (in this attempt or an earlier one) raises EffectAlreadyBegun — use
        ``start_effect`` to get an earlier attempt's recorded outcome instead."""
        start = await self.start_effect(lease, key, intent_digest)
        if start.reused:
            raise EffectAlreadyBegun(
                state=str(EffectState.SUCCEEDED),
                job_id=lease.job_id,
                effect_key=key,
                seq=start.seq,
                receipt=start.receipt,
            )
        return start.seq

    async def start_effect(self, lease: Lease, key: str, intent_digest: str) -> EffectStart:
        """Fenced: begins effect ``key`` (a new pending record, before dispatch), or, when the
        key succeeded in an earlier attempt of this job (a run the repair role resumed),
        returns that record's seq and receipt with ``reused=True``: never dispatch it again.
        Raises like ``begin_effect`` otherwise (EffectAlreadyBegun for pending, unknown, or
        succeeded in this very attempt; EffectConflict for another intent; FenceLost; ...)."""
        async with self._connection() as conn:
            row = await conn.fetchrow(sql.BEGIN_EFFECT, *lease.fence_args(), key, intent_digest)
        status = row["status"]
        ids: dict[str, Any] = {"job_id": lease.job_id, "effect_key": key}
        if status is None:
            return EffectStart(row["seq"])
        if status == "recorded":
            return EffectStart(row["seq"], reused=True, receipt=row["receipt"])
        if status == "effects_disabled":
            raise EffectsDisabled(workflow=lease.workflow, **ids)
        if status.startswith("already_"):
            raise EffectAlreadyBegun(state=status.removeprefix("already_"), **ids)
        if status == "intent_conflict":
            raise EffectConflict(
                recorded_digest=row["recorded_digest"], intent_digest=intent_digest, **ids
            )
        raise fence.fence_lost(lease, status)

    async def finish_effect(
        self, lease: Lease, key: str, outcome: EffectState, *, receipt: str | None = None
    ) -> None:
        """Fenced: records the outcome of this attempt's pending record of ``key``
        (succeeded, failed_before_dispatch or unknown). A finished outcome never changes."""
        outcome = EffectState(outcome)
        if outcome is EffectState.PENDING:
            raise ValueError("finish_effect needs a finished outcome, not pending")
        async with self._connection() as conn:
            status = await conn.fetchval(
                sql.FINISH_EFFECT, *lease.fence_args(), key, str(outcome), receipt
            )
        if status == "not_pending":
            raise EffectNotPending(job_id=lease.job_id, effect_key=key)
        if status is not None:
            raise fence.fence_lost(lease, status)

    # -- rescue and cancel -------------------------------------------------------------------

    async def rescue(self, limit: int = 100) -> RescueReport:
        """One short transaction: returns up to ``limit`` running jobs whose lease expired (or
        whose epoch was rotated) to queued, poison or unknown, each with generation + 1."""
        async with self._connection() as conn:
            rows = await conn.fetch(sql.RESCUE, limit, *self._backoff)
            # A job rescued to the queue shows it at its next attempt (EVENT_RESCUED); one
            # rescued to unknown or poison has no next attempt: its trace says so here.
            stopped = [r for r in rows if r["state"] in _RESCUED_TO_A_STOP]
            if stopped and telemetry.exporting():
                with _after_commit("rescue"):
                    await _trace_rescue(conn, stopped)
        return RescueReport(tuple(Rescued.from_record(row) for row in rows))

    async def cancel(self, job_id: int, *, reason: str) -> Cancellation:
        """One short transaction: cancels queued or running work (generation + 1, no lease),
        keeping every effect record. Raises JobNotFound."""
        async with self._connection() as conn:
            row = await conn.fetchrow(sql.CANCEL, job_id, reason)
            if row is not None and telemetry.exporting():
                with _after_commit("cancel"):
                    await _trace_cancel(conn, job_id, reason, bool(row["changed"]))
        if row is None:
            raise JobNotFound(job_id=job_id)
        return Cancellation(
            job_id=job_id,
            changed=row["changed"],
            state=JobState(row["state"]),
            generation=row["generation"],
            unresolved_effects=row["unresolved"],
        )

    # -- authority ----------------------------------------------------------------------------

    async def rotate_epoch(self, tenant: str) -> int:
        """One short transaction: advances the tenant's authority epoch and waits for fenced
        write-backs in flight; afterwards every lease under the old epoch fails its fence."""
        async with self._connection() as conn:
            epoch: int = await conn.fetchval(sql.ROTATE_EPOCH, tenant)
        return epoch

    async def freeze(self, tenant: str) -> None:
        """Freezes the tenant's authority: no claim, no write-back passes the fence."""
        async with self._connection() as conn:
            await conn.fetchval(sql.SET_FROZEN, tenant, True)

    async def unfreeze(self, tenant: str) -> None:
        """Thaws the tenant's authority."""
        async with self._connection() as conn:
            await conn.fetchval(sql.SET_FROZEN, tenant, False)

    # -- registration -----------------------------------------------------------------------

    async def register_workflow(
        self,
        workflow: str,
        owner: str,
        *,
        effects_enabled: bool | None = None,
        who: str = "jobs.Store",
    ) -> Registration:
        """Registers ``owner`` as the one queue owner of ``workflow``, audited (jobs.registry);
        ``effects_enabled`` None keeps a registered class's flag (a new class: disabled)."""
        async with self._connection() as conn, conn.transaction():
            return await registry.register(
                conn, workflow, owner, effects_enabled=effects_enabled, who=who
            )

    async def require_registration(self, workflow: str, owner: str) -> Registration:
        """Raises WorkflowNotRegistered / WorkflowOwnedElsewhere unless ``owner`` serves it."""
        async with self._connection() as conn:
            return await registry.require(conn, workflow, owner)

    async def transfer_workflow(
        self, workflow: str, from_owner: str, to_owner: str, *, effects_enabled: bool | None = None
    ) -> Registration:
        """Moves the class and all its work to ``to_owner`` (see jobs.registry.transfer)."""
        async with self._connection() as conn, conn.transaction():
            return await registry.transfer(
                conn, workflow, from_owner, to_owner, effects_enabled=effects_enabled
            )

    # -- tracing ------------------------------------------------------------------------------

    async def note_trace(
        self,
        lease: Lease,
        carrier: dict[str, str],
        effect_key: str | None = None,
        seq: int | None = None,
    ) -> bool:
        """Keep a span's context with the attempt (no key) or with its effect ``effect_key``
        ``seq``, for the spans that come later to link to it. Only this attempt writes; False
        when it no longer holds the job. Called only while tracing."""
        async with self._connection() as conn:
            kept: bool = await conn.fetchval(
                sql.NOTE_TRACE, lease.job_id, lease.attempt_id, effect_key, seq, json.dumps(carrier)
            )
        return kept

    # -- reading ------------------------------------------------------------------------------

    async def job(self, job_id: int) -> JobView:
        """Read-only: one job with every effect record it ever had. Raises JobNotFound."""
        async with self._connection() as conn:
            row = await conn.fetchrow(sql.JOB, job_id)
            if row is None:
                raise JobNotFound(job_id=job_id)
            effects = tuple(Effect.from_record(e) for e in await conn.fetch(sql.EFFECTS, job_id))
        return JobView.from_record(row, effects)

    async def probe(self) -> Health:
        """Health: a read-only transaction that never claims work."""
        async with self._connection() as conn, conn.transaction(readonly=True):
            row = await conn.fetchrow(sql.PROBE)
        return Health(database_now=row["database_now"], workflows=row["workflows"])


@contextlib.contextmanager
def _after_commit(what: str) -> Iterator[None]:
    """A span written after ``what`` committed: a database error reading its context is
    logged, never raised (the caller would take the committed change for a failed one)."""
    try:
        yield
    except (*DB_CONNECTION_LOST, asyncpg.PostgresError) as exc:
        log.warning("%s committed; its span was not written (%s)", what, type(exc).__name__)


# The states rescue leaves a job in that no attempt follows on its own.
_RESCUED_TO_A_STOP = (JobState.UNKNOWN.value, JobState.POISON.value)


async def _trace_rescue(conn: Any, rows: list[Any]) -> None:
    """A ``rescue job`` span in each job's trace (a child of the span that submitted it,
    linked to the attempt whose lease ran out), with an error status: the job waits for a
    person (unknown: reconciliation) or is poison."""
    traces = {r["job_id"]: r for r in await conn.fetch(sql.JOB_TRACES, [r["job_id"] for r in rows])}
    for row in rows:
        stored = traces.get(row["job_id"])
        carrier = telemetry.carrier_from_json(stored["trace"] if stored is not None else None)
        attempt = telemetry.carrier_from_json(
            stored["attempt_trace"] if stored is not None else None
        )
        span = telemetry.tracer().start_span(
            "rescue job",
            context=telemetry.parent_from(carrier),
            links=telemetry.links_from(attempt, "attempt"),
            attributes={
                telemetry.ATTR_JOB_ID: row["job_id"],
                telemetry.ATTR_GENERATION: row["generation"],
                telemetry.ATTR_JOB_STATE: row["state"],
                # lease_expired or epoch_rotated (jobs.rescue)
                telemetry.ATTR_JOB_REASON: stored["last_error"] if stored is not None else "",
            },
        )
        span.set_status(Status(StatusCode.ERROR, row["state"]))
        span.end()


async def _trace_cancel(conn: Any, job_id: int, reason: str, changed: bool) -> None:
    """A ``cancel`` span in the job's trace (a child of the span that submitted it), with
    the cancel as an event naming its reason: the operator's act beside the job's attempts."""
    row = await conn.fetchrow(sql.JOB_TRACES, [job_id])
    carrier = telemetry.carrier_from_json(row["trace"] if row is not None else None)
    span = telemetry.tracer().start_span(
        "cancel job",
        context=telemetry.parent_from(carrier),
        links=telemetry.links_from(carrier, "job"),
        attributes={telemetry.ATTR_JOB_ID: job_id, telemetry.ATTR_JOB_REASON: reason},
    )
    span.add_event(
        telemetry.EVENT_CANCELED, {telemetry.ATTR_JOB_REASON: reason, "changed": changed}
    )
    span.end()
