"""What a handler gets: one claimed job, and the only ways it may touch the world.

Invariant: every write-back a handler makes goes through the jobs module's fenced calls
(``Store.begin_effect`` / ``finish_effect`` / ``publish``), so a worker that lost its lease
can compute whatever it likes and still change nothing. An effect is recorded ``pending``
(fenced) and journaled (fsynced) *before* its call is dispatched; the call itself runs
outside any transaction, under the handler's deadline; its outcome is then recorded even
when the handler is being cancelled. If recording the outcome fails, the pending row is
the evidence and keeps blocking a redispatch. In a run the repair role resumed, a key that
succeeded in an earlier attempt is never dispatched again: its recorded receipt is returned
(and journaled as reused).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from accord import observe
from accord.jobs.errors import (
    EffectNotPending,
    EffectUndeclared,
    FenceLost,
    IdempotencyKeyMismatch,
    ObjectNotFound,
    ObjectStoreUnavailable,
    ReceiptInvalid,
    ResultMismatch,
)
from accord.jobs.models import EffectState, Lease
from accord.jobs.runner import effects, write_back
from accord.jobs.runner.effects import (
    EffectUnknown,
    FailedBeforeDispatch,
    Outcome,
    Success,
    check_receipt,
    classify_error,
    classify_result,
    intent_digest,
)
from accord.jobs.runner.journal_records import EffectBegin, EffectOutcome, EffectRef, Publish
from accord.jobs.runner.objects import ObjectStore, check_key
from accord.jobs.store import Callback, Store
from accord.schemas import telemetry
from accord.schemas.db import DB_RETRY_LATER, Tx, require_transaction

log = logging.getLogger("accord.worker")
_TRACER = telemetry.tracer()

#: An effect's dispatch: returns Success(receipt) or FailedBeforeDispatch (or raises it).
EffectCall = Callable[[], Awaitable[object]]


class JournalWriter(Protocol):
    """Appends one record durably (fsynced) before returning."""

    async def __call__(self, record: Any) -> None: ...


#: Queues one record no later step relies on, without waiting (RunnerJournal.note).
JournalNote = Callable[[Any], None]


@dataclass(slots=True)
class EffectTrail:
    """What this attempt did with its effects (process-local; the database is the truth)."""

    begun: list[EffectRef] = field(default_factory=list)
    # Effects an earlier attempt recorded succeeded, whose outcome this attempt reused.
    reused: list[EffectRef] = field(default_factory=list)
    # Effects this attempt left pending (outcome not recorded) or recorded unknown.
    unresolved: dict[EffectRef, EffectState] = field(default_factory=dict)


class JobContext:
    """One claimed job as its handler sees it: the lease, the payload, effects, publish."""

    def __init__(
        self,
        lease: Lease,
        *,
        store: Store,
        objects: ObjectStore,
        journal: JournalWriter,
        note: JournalNote | None = None,
        record_timeout_s: float = 10.0,
        effects: Sequence[str] | None = None,
    ) -> None:
        self._lease = lease
        #: The effect keys (or prefixes ending in a dot) this job class declared; None: any.
        self._declared = None if effects is None else tuple(effects)
        self._store = store
        self._objects = objects
        self._journal = journal
        self._note = note
        self._record_timeout_s = record_timeout_s
        self.trail = EffectTrail()
        self.published = False
        # The result object key of the publish in flight (record_result reads it).
        self._publishing: str | None = None
        #: Set by the heartbeat when the lease is lost; the handler's scope is then cancelled.
        self.fence_lost: FenceLost | None = None

    # -- what the handler reads ---------------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The current lease (renewals replace it; its fence fields never change)."""
        return self._lease

    @property
    def payload(self) -> dict[str, Any]:
        return self._lease.payload

    def idempotency_key(self, effect_key: str) -> str:
        """A provider idempotency key for ``effect_key``: same for every attempt of the job."""
        return effects.idempotency_key(self._lease, effect_key)

    def renewed(self, lease: Lease) -> None:
        """The heartbeat's hook: the renewed lease replaces the current one."""
        self._lease = lease

    # -- effects ----------------------------------------------------------------------------

    async def effect(
        self,
        key: str,
        intent: Mapping[str, Any],
        call: EffectCall,
        *,
        idempotency_key: str | None = None,
    ) -> Success:
        """Fenced begin → journal → ``call()`` outside any transaction → recorded outcome.

        Returns the Success. If an earlier attempt of this job recorded ``key`` succeeded (a
        run the repair role resumed), ``call`` is not called: the recorded receipt comes back
        as the Success, journaled as reused. Raises EffectUndeclared (a key the job class did
        not declare), IdempotencyKeyMismatch (an ``idempotency_key`` other than
        ``self.idempotency_key(key)``), EffectIntentInvalid (an intent that is not canonical
        JSON) or EffectConflict (the key begun before with another intent): the handler's
        own defect, permanent, the job fails without a retry; FenceLost /
        EffectAlreadyBegun / EffectsDisabled: all before dispatch (nothing was called);
        FailedBeforeDispatch (recorded: the same key and intent may begin again);
        EffectUnknown (recorded unknown, or left pending: never redo it); or the cancellation
        that interrupted the call (recorded unknown first).
        """
        if self._declared is not None and not declares(self._declared, key):
            raise EffectUndeclared(
                workflow=self._lease.workflow, effect_key=key, declared=list(self._declared)
            )
        derived = self.idempotency_key(key)
        if idempotency_key is not None and idempotency_key != derived:
            raise IdempotencyKeyMismatch(
                workflow=self._lease.workflow,
                effect_key=key,
                given=idempotency_key,
                expected=derived,
            )
        span = _TRACER.start_span(
            f"effect {key}",
            kind=SpanKind.CLIENT,
            attributes={
                telemetry.ATTR_JOB_ID: self._lease.job_id,
                telemetry.ATTR_EFFECT_KEY: key,
                telemetry.ATTR_IDEMPOTENCY_KEY: derived,
            },
        )
        # The span is current while the effect runs (a traced client call is its child);
        # its status is an error only for an unknown outcome: FailedBeforeDispatch is retried.
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                return await self._effect(key, intent, call, derived, span)
            except FenceLost as exc:
                span.add_event(
                    telemetry.EVENT_FENCE_REFUSED,
                    {telemetry.ATTR_JOB_REASON: str(exc.fields.get("failed_check"))},
                )
                raise

    async def _effect(
        self,
        key: str,
        intent: Mapping[str, Any],
        call: EffectCall,
        idempotency_key: str,
        span: trace.Span,
    ) -> Success:
        """``idempotency_key``: the provider's key for this effect, journaled with its begin
        (the evidence a lookup needs, whoever asks, whatever the database holds by then)."""
        lease = self._lease
        digest = intent_digest(lease, key, intent)
        start = await self._store.start_effect(lease, key, digest)
        ref = EffectRef(lease.job_id, key, start.seq)
        span.set_attribute(telemetry.ATTR_EFFECT_SEQ, start.seq)
        if start.reused:
            span.set_attribute(telemetry.ATTR_EFFECT_REUSED, True)
            span.set_attribute(telemetry.ATTR_EFFECT_OUTCOME, str(EffectState.SUCCEEDED))
            return await self._reuse(ref, start.receipt)
        span.add_event(telemetry.EVENT_EFFECT_BEGUN)
        seq = start.seq
        self.trail.begun.append(ref)
        self.trail.unresolved[ref] = EffectState.PENDING
        carrier = telemetry.span_headers(span) if telemetry.exporting() else {}
        detail = "trace note"  # what was in the way, should the call never start
        try:
            if carrier:  # exported: a later reconcile's resolution links to this effect's span
                with contextlib.suppress(*DB_RETRY_LATER):
                    await self._store.note_trace(lease, carrier, key, seq)
            detail = "journal"
            await self._journal(
                EffectBegin(
                    **_claim_fields(lease),
                    effect_key=key,
                    seq=seq,
                    idempotency_key=idempotency_key,
                    intent_digest=digest,
                )
            )
        except BaseException:
            # The call never started (the journal failed, or a stop, the deadline or a lost
            # lease cancelled the attempt first): nothing was dispatched, so say exactly that.
            await self._record(ref, Outcome(EffectState.FAILED_BEFORE_DISPATCH, detail=detail))
            raise
        return await self._dispatch(ref, call)

    async def _reuse(self, ref: EffectRef, receipt: str | None) -> Success:
        """An earlier attempt's recorded success: journal that it was reused, dispatch nothing."""
        self.trail.reused.append(ref)
        journaled, detail = receipt, "recorded outcome reused"
        try:
            check_receipt(receipt)
        except ReceiptInvalid:  # a repair's, or an older version's: the database keeps it
            journaled, detail = None, "recorded outcome reused (its receipt in the database)"
        await self._trace(
            EffectOutcome(
                **_claim_fields(self._lease),
                effect_key=ref.effect_key,
                seq=ref.seq,
                outcome=EffectState.SUCCEEDED,
                receipt=journaled,
                detail=detail,
                reused=True,
            )
        )
        log.info(
            "effect already succeeded in an earlier attempt, not dispatched again:"
            " job=%s key=%s seq=%s receipt=%s",
            ref.job_id,
            ref.effect_key,
            ref.seq,
            receipt,
        )
        return Success(receipt)

    async def _dispatch(self, ref: EffectRef, call: EffectCall) -> Success:
        try:
            result = await call()
            if isinstance(result, Success):  # a receipt it cannot keep: the proof is lost
                check_receipt(result.receipt)
        except anyio.get_cancelled_exc_class() as exc:
            await self._record(ref, classify_error(exc))
            raise
        except FailedBeforeDispatch as exc:
            await self._record(ref, classify_error(exc))
            raise
        except Exception as exc:
            # The request may have left: whatever failed, the outcome is unknown.
            await self._record(ref, classify_error(exc))
            raise EffectUnknown(
                job_id=ref.job_id, effect_key=ref.effect_key, seq=ref.seq, cause=type(exc).__name__
            ) from exc
        outcome = classify_result(result)
        await self._record(ref, outcome)
        if isinstance(result, Success):
            return result
        if isinstance(result, FailedBeforeDispatch):
            raise result
        raise EffectUnknown(
            job_id=ref.job_id, effect_key=ref.effect_key, seq=ref.seq, cause=outcome.detail
        )

    async def _record(self, ref: EffectRef, outcome: Outcome) -> None:
        """Record the outcome (fenced) and journal it, shielded: cancellation is usually why
        we are here. A refused or failed record leaves the pending row as the evidence; the
        journal keeps what the call returned (a receipt included) either way: written before
        this returns when the database did not record it, noted when it did."""
        _note_outcome(trace.get_current_span(), outcome)
        lease = self._lease
        recorded = False
        with anyio.move_on_after(self._record_timeout_s, shield=True) as scope:
            recorded = await self._finish_effect(lease, ref, outcome)
        # Counted once the database answered: an outcome it did not record (the fence
        # refused it, the write timed out) is counted as such, its pending row the evidence.
        observe.effect(lease.workflow, str(outcome.state) if recorded else "not_recorded")
        if scope.cancelled_caught:
            log.warning(
                "recording effect outcome timed out, pending row remains: job=%s key=%s seq=%s",
                ref.job_id,
                ref.effect_key,
                ref.seq,
            )
        record = EffectOutcome(
            **_claim_fields(lease),
            effect_key=ref.effect_key,
            seq=ref.seq,
            outcome=outcome.state,
            receipt=outcome.receipt,
            detail=outcome.detail,
        )
        with anyio.CancelScope(shield=True):
            if recorded:  # the database holds the outcome: the journal's record is its trace
                await self._trace(record)
            else:  # the journal's record is the only evidence of what the call returned
                await self._journal(record)

    async def _trace(self, record: Any) -> None:
        """Journal a record that the database already holds: noted (it rides the next group,
        nothing waits for it) when the worker gave a ``note``, else written."""
        if self._note is None:
            await self._journal(record)
        else:
            self._note(record)

    async def _finish_effect(self, lease: Lease, ref: EffectRef, outcome: Outcome) -> bool:
        """Whether the database recorded ``outcome`` (a refusal is logged: the pending row
        remains). A busy or lost database is tried again (write_back.again) until the
        caller's record timeout."""

        async def committed(error: Exception) -> bool:
            return isinstance(error, EffectNotPending) and await write_back.recorded_before(
                self._store, lease, ref.effect_key, ref.seq, str(outcome.state)
            )

        try:
            await write_back.again_unless_committed(
                lambda: self._store.finish_effect(
                    lease, ref.effect_key, outcome.state, receipt=outcome.receipt
                ),
                what="effect outcome",
                lease=lease,
                committed=committed,
            )
        except FenceLost as exc:
            log.warning(
                "effect outcome not recorded, pending row remains: job=%s key=%s seq=%s"
                " outcome=%s fence=%s",
                ref.job_id,
                ref.effect_key,
                ref.seq,
                outcome.state,
                exc.fields.get("failed_check"),
            )
        else:
            self._recorded(ref, outcome.state)
            return True
        return False

    def _recorded(self, ref: EffectRef, state: EffectState) -> None:
        if state is EffectState.UNKNOWN:
            self.trail.unresolved[ref] = state
        else:
            self.trail.unresolved.pop(ref, None)

    # -- results and publish -------------------------------------------------------------------

    async def put_object(self, data: bytes) -> str:
        """Store ``data`` as an immutable, content-addressed object; returns its key. It is
        authoritative only once a fenced publish writes its manifest row (record_result)."""
        key: str = await anyio.to_thread.run_sync(self._objects.put, data)
        return key

    async def _refresh(self, object_key: str) -> None:
        """Restart the object's age before a manifest row names it, however long ago it was
        put: the collector keeps it through the publish (its retention is at least a lease);
        a publish does it at each of its tries, since a later one may come a lease after.
        Raises ObjectNotFound if it was collected meanwhile: the job is retried, and its
        handler puts it again."""
        await anyio.to_thread.run_sync(self._objects.touch, object_key)

    async def record_result(self, tx: Tx, object_key: str) -> None:
        """Runs in the publish callback's transaction; never commits. Makes ``object_key``
        the job's result: in a ``publish(object_key=...)`` naming the same key, the fenced
        succeeded statement writes its manifest row (nothing to do here; another key raises
        ResultMismatch: a job has one result); otherwise it writes the jobs.results manifest
        row now, through the fence (``Store.record_result``): raises FenceLost, and writes
        nothing, unless this lease still holds the job."""
        require_transaction(tx)
        if self._publishing is not None:
            if object_key != self._publishing:
                raise ResultMismatch(
                    job_id=self._lease.job_id, published=self._publishing, recorded=object_key
                )
            return
        await self._refresh(object_key)
        await Store.record_result(tx, self._lease, object_key, _digest(object_key))

    async def publish(
        self, callback: Callback | None = None, *, object_key: str | None = None
    ) -> None:
        """The fenced, database-only publish (see ``Store.publish``), journaled after commit.

        ``object_key`` (from ``put_object``) is the job's result: its manifest row is
        written by the fenced succeeded statement itself, so it is authoritative exactly
        when the publish commits (a callback's ``record_result`` of the same key adds
        nothing; a callback writing the row itself through ``Store.record_result`` names
        no ``object_key``: a job has one result row). Raises ObjectKeyInvalid (not a
        content address: nothing written), ObjectNotFound (the object was collected since
        its put: nothing written), ResultMismatch, FenceLost (nothing the callback wrote
        survives) or EffectsUnresolved.
        """
        result = None if object_key is None else (check_key(object_key), _digest(object_key))
        span = _TRACER.start_span(
            f"publish {self._lease.workflow}",
            attributes={
                telemetry.ATTR_JOB_ID: self._lease.job_id,
                telemetry.ATTR_GENERATION: self._lease.generation,
            },
        )
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            self._publishing = object_key

            async def committed(error: Exception) -> bool:
                refused = isinstance(error, ObjectNotFound) or (
                    isinstance(error, FenceLost) and error.fields.get("failed_check") == "state"
                )
                return refused and await write_back.published_before(self._store, self._lease)

            own = None if callback is None else write_back.own_errors(callback)

            async def once() -> None:
                if object_key is not None:  # at each try: a retry may come a lease later
                    try:
                        await self._refresh(object_key)  # ObjectNotFound: collected meanwhile
                    except OSError as exc:  # the disk's, not the database's: not tried again
                        raise ObjectStoreUnavailable(key=object_key, detail=str(exc)) from exc
                await self._store.publish(self._lease, own, result=result)

            try:
                await write_back.again_unless_committed(
                    once,
                    what="publish",
                    lease=self._lease,
                    committed=committed,
                )
            except write_back.CallbackError as failed:  # its own: raised as it raised it
                raise failed.error from failed.error.__cause__
            except FenceLost as exc:
                span.add_event(
                    telemetry.EVENT_FENCE_REFUSED,
                    {telemetry.ATTR_JOB_REASON: str(exc.fields.get("failed_check"))},
                )
                raise
            finally:
                self._publishing = None
        self.published = True
        await self._trace(Publish(**_claim_fields(self._lease), object_key=object_key))


def declares(declared: Sequence[str], key: str) -> bool:
    """Whether ``key`` is one of ``declared``'s keys or falls under one of its prefixes (a
    declared entry ending in a dot), as a provider's ``owns`` is read."""
    return any(key == d or (d.endswith(".") and key.startswith(d)) for d in declared)


def _note_outcome(span: trace.Span, outcome: Outcome) -> None:
    """The effect's outcome on its span (the current one while it is recorded)."""
    if not span.is_recording():
        return
    span.set_attribute(telemetry.ATTR_EFFECT_OUTCOME, str(outcome.state))
    if outcome.state is EffectState.UNKNOWN:
        span.set_status(Status(StatusCode.ERROR, outcome.detail or "unknown"))


def _digest(object_key: str) -> str:
    """A content address's digest: the hex after ``sha256-``."""
    return object_key.removeprefix("sha256-")


def _claim_fields(lease: Lease) -> dict[str, Any]:
    return {
        "tenant": lease.tenant,
        "job_id": lease.job_id,
        "attempt_id": lease.attempt_id,
        "generation": lease.generation,
    }
