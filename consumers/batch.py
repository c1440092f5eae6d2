"""One batch of deliveries: admit, apply in one transaction, commit, then settle each message.

Invariant: a message is acknowledged only after the transaction holding its inbox row
(and its handler's effect) committed; a crash between commit and ack only causes a
redelivery, which the inbox turns into an acknowledged duplicate. Every message of a
batch is its own inbox decision: the fast path applies the whole batch in one
transaction; if anything in it fails, the batch is rolled back and applied again with a
savepoint per message, so a failing message rolls back only itself. If that commit is
refused for the content (a deferred constraint is checked only at COMMIT, where no savepoint
can say whose write broke it), each message is applied in a transaction of its own, so
only the offender's commit fails. A missing grant stops the consumer from any pass.

Settling: the failed messages one by one (requeue, or poison record then reject), then
one cumulative ack (``multiple``) for the applied ones; with requeues, which wait out a
backoff first, the applied ones delivered before the first requeued one are acked before
the wait and the rest after (two acks). The runtime guarantees that a
batch holds the oldest unsettled deliveries of its channel (one channel per worker, taken
in order), so that ack covers exactly this batch. One settle command per batch rather
than one per message matters on RabbitMQ: a channel's quorum-queue client buffers settles
beyond ``quorum_commands_soft_limit`` (32) unsent, and drops that buffer when the channel
closes (rabbitmq-server#10327). Individual acks of a drained prefetch window, sent just
before a clean close, were ignored, and their committed messages came back.

Judging: a body over ``max_body_bytes`` is poisoned unread (``too_large``); the parser and
the catalog raise only typed errors, all permanent. A failure while applying is classified
once (``_classify``): accord's permanent errors, and PostgreSQL's refusals of the content
by SQLSTATE class (``verdicts.database_refusal``: 22, 23, 42), poison only that message at once;
everything else is transient (requeued, bounded by the delivery limit). A refusal is judged
on the savepoint pass's fresh snapshot, a one-message batch's too: a unique key another
transaction took between a handler's check and its insert refuses only the first run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aio_pika
import anyio
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from accord import observe
from accord.consumers import inbox, poison, sql, verdicts
from accord.consumers.errors import (
    ConnectionLost,
    DigestMismatch,
    InboxConflict,
    MessageTooLarge,
    PrivilegeMissing,
    TenantMismatch,
    TransientFailure,
)
from accord.consumers.handlers import Handler, Handlers
from accord.consumers.inbox import Consumer, Delivery, InboxOutcome
from accord.schemas import telemetry, wire
from accord.schemas.errors import AccordError
from accord.schemas.events import Event

log = logging.getLogger("consumers")

ANY_TENANT = "*"
AfterCommit = Callable[[], None]
_ACKED = (InboxOutcome.NEW, InboxOutcome.DUPLICATE)
DEFAULT_MAX_BODY_BYTES = 256 * 1024
_MAX_COUNT = 2**31 - 1
#: The longest a batch waits before a requeue (BatchProcessor.retry_backoff_s).
RETRY_BACKOFF_MAX_S = 5.0
# While a rebuild holds a projection's guard, its consumer tries again after this, doubling.
GUARD_WAIT_S, GUARD_WAIT_MAX_S = 0.05, 1.0
BUSY_WAIT_MAX_S = 5.0  # a server read-only or out of resources: a failover takes seconds


@dataclass(slots=True)
class Stats:
    """Counters of settled deliveries (for tests, benchmarks and logs)."""

    new: int = 0
    duplicate: int = 0
    poisoned: int = 0
    retried: int = 0
    commits: int = 0


@dataclass(slots=True)
class Item:
    """One delivery on its way through a batch."""

    message: aio_pika.abc.AbstractIncomingMessage
    delivery: Delivery
    span: Span
    event: Event | None = None
    digest: str | None = None
    handler: Handler | None = None
    outcome: InboxOutcome | None = None
    permanent: BaseException | None = None
    transient: BaseException | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Acked, requeued or rejected: the broker was told (its span says how).
    settled: bool = False


@dataclass(slots=True)
class BatchProcessor:
    """Applies batches for one workflow class's consumer."""

    consumer: Consumer
    handlers: Handlers
    tenants: frozenset[str]
    queue: str
    delivery_limit: int
    tracer: trace.Tracer
    after_commit: AfterCommit | None = None
    stats: Stats = field(default_factory=Stats)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: A projection's workflow: each transaction first takes its rebuild guard, shared
    #: (``sql.PROJECTION_GUARD``), so a rebuild never empties it across one. None: not one.
    guard: str | None = None
    #: How a batch waits ``seconds`` while a rebuild holds its guard (the consumer runtime
    #: marks its lane idle meanwhile: waiting for a rebuild is not being stuck).
    guard_wait: Callable[[float], Awaitable[None]] = anyio.sleep
    #: How long a batch waits before it requeues a message that failed transiently at its
    #: first delivery, doubling with each delivery counted (at most RETRY_BACKOFF_MAX_S): a
    #: lock or a row another transaction holds, a deadlock, a downstream that is busy, are
    #: seldom gone a millisecond later, and a requeue at once spent a message's whole
    #: delivery limit within that millisecond. 0: at once.
    retry_backoff_s: float = 0.0

    async def process(
        self, conn: Any, messages: Sequence[aio_pika.abc.AbstractIncomingMessage]
    ) -> None:
        """Apply and settle a batch: commit, then ack; poison records, then reject."""
        items = [self.admit(m) for m in messages]
        try:
            ready = [i for i in items if i.permanent is None]
            commits = await self._apply_guarded(conn, ready) if ready else 0
            if commits:
                self.stats.commits += commits
                if self.after_commit is not None:
                    self.after_commit()
            await self._settle(conn, items)
        except BaseException as exc:
            # The batch ended before its messages were settled (a lost connection, a missing
            # grant, a stop): the broker returns them. Each unsettled span says so, so neither
            # a trace nor the messaging metrics count it a successful consume.
            ended = exc.reason if isinstance(exc, AccordError) else type(exc).__name__
            for item in items:
                if not item.settled:
                    item.span.set_attribute(telemetry.ATTR_ERROR_TYPE, str(ended))
            raise
        finally:
            for item in items:
                item.span.end()

    def admit(self, message: aio_pika.abc.AbstractIncomingMessage) -> Item:
        """Parse and judge one message before any transaction; permanent errors are noted."""
        headers = dict(message.headers or {})
        raw_count = headers.get("x-delivery-count", 0)
        # The broker's count (a publisher may send anything): within the int4 columns that
        # keep it (inbox deliveries, poison records), so recording it never fails.
        count = (
            min(raw_count, _MAX_COUNT)
            if isinstance(raw_count, int) and not isinstance(raw_count, bool) and raw_count > 0
            else 0
        )
        # The publish id is taken from the parsed message (canonical UUID text) below.
        delivery = Delivery(redelivered=bool(message.redelivered), delivery_count=count)
        trace_carrier = {k: v for k, v in headers.items() if isinstance(v, str)}
        span = self.tracer.start_span(
            f"process {self.queue}",
            kind=SpanKind.CONSUMER,
            links=telemetry.links_from(
                {k: v for k, v in trace_carrier.items() if k in ("traceparent", "tracestate")}
            ),
            attributes={
                telemetry.ATTR_SYSTEM: telemetry.SYSTEM,
                telemetry.ATTR_OPERATION_TYPE: "process",
                telemetry.ATTR_OPERATION_NAME: "process",
                telemetry.ATTR_DESTINATION: self.queue,
                telemetry.ATTR_CONSUMER_GROUP: self.consumer.name,
                telemetry.ATTR_ROUTING_KEY: message.routing_key or "",
                telemetry.ATTR_MESSAGE_ID: message.message_id or "",
                telemetry.ATTR_REDELIVERED: delivery.redelivered,
                telemetry.ATTR_DELIVERY_COUNT: delivery.delivery_count,
            },
        )
        item = Item(message=message, delivery=delivery, span=span)
        size = len(message.body)
        if size > self.max_body_bytes:  # refused unread: never parsed, never stored
            item.permanent = MessageTooLarge(bytes=size, limit=self.max_body_bytes)
            return item
        try:
            self._judge(item, wire.from_amqp(message.body, headers, message.content_type))
        except poison.PERMANENT_ERRORS as exc:
            item.permanent = exc
        return item

    def _judge(self, item: Item, inbound: wire.Inbound) -> None:
        event = inbound.event
        item.event = event
        item.delivery = replace(
            item.delivery, publish_id=inbound.publish_id, enqueued_at=inbound.enqueued_at
        )
        item.span.set_attribute(telemetry.ATTR_TENANT, event.tenant)
        item.span.set_attribute(telemetry.ATTR_OPERATION_ID, event.operation_id)
        if ANY_TENANT not in self.tenants and event.tenant not in self.tenants:
            raise TenantMismatch(tenant=event.tenant, consumer=self.consumer.name)
        self.consumer.catalog.validate(event, producing=False)
        item.handler = self.handlers.get(event)
        item.digest = self.consumer.catalog.digest(event)
        if inbound.digest is not None and inbound.digest != item.digest:
            raise DigestMismatch(
                tenant=event.tenant,
                operation_id=event.operation_id,
                wire_digest=inbound.digest,
                computed_digest=item.digest,
            )

    async def _apply_guarded(self, conn: Any, ready: list[Item]) -> int:
        """``_apply``, again and again while a rebuild holds the projection's guard: nothing
        was applied (the guard comes first in each transaction; a message a transaction of
        its own committed before is a duplicate the next time), nothing is counted against a
        message, and the messages stay unsettled meanwhile."""
        wait = GUARD_WAIT_S
        while True:
            try:
                return await self._apply(conn, [i for i in ready if i.permanent is None])
            except (verdicts.GuardHeld, verdicts.ServerBusy) as held:
                for item in ready:
                    item.outcome, item.transient = None, None
                cap = GUARD_WAIT_MAX_S
                if isinstance(held, verdicts.ServerBusy):
                    # The same for a server that takes no work now (read-only, out of
                    # resources): no message's fault, none charged a delivery.
                    cap = BUSY_WAIT_MAX_S
                    log.warning("database busy (%s): batch of %d waits %.2fs", held,
                                len(ready), wait)  # fmt: skip
                await self.guard_wait(wait)
                wait = min(2 * wait, cap)

    async def _apply(self, conn: Any, ready: list[Item]) -> int:
        """Fast path: the batch in one transaction. On any failure, again per savepoint;
        if that commit is refused for the content, each message in its own transaction.

        Returns how many transactions committed (the ``after_commit`` hook and the commit
        count follow only a real commit)."""
        try:
            async with conn.transaction():
                await self._begin(conn)
                await self._apply_all(conn, ready)
            return 1
        except Exception as exc:  # noqa: BLE001 - never swallowed: classified or redone below
            verdicts.raise_if_lost(conn, exc)
            for item in ready:
                item.outcome = None
            if len(ready) == 1 and verdicts.database_refusal(exc) is None:
                _classify(conn, ready[0], exc)  # that message's own failure: no need to redo
                return 0
            # A refusal of content is judged again on a fresh snapshot, one message as a
            # batch's: a unique key another transaction took meanwhile refuses only once.
        try:
            async with conn.transaction():
                await self._begin(conn)
                traced = False
                for item in ready:
                    traced = await self._apply_one(conn, item, traced=traced)
        except (PrivilegeMissing, ConnectionLost):
            raise  # from _classify: the process's grants, or the connection; not a message's
        except Exception as exc:  # noqa: BLE001 - the commit failed: classified below
            verdicts.raise_if_lost(conn, exc)
            verdicts.raise_if_privilege(exc)  # a deferred trigger's write, say
            if verdicts.database_refusal(exc) is not None:
                return await self._apply_each(conn, ready)
            for item in ready:  # every message not judged permanent is retried
                if item.permanent is None:
                    item.outcome, item.transient = None, exc
            return 0
        # A commit that applied nothing (every message refused) is not counted as one.
        return int(any(item.outcome in _ACKED for item in ready))

    async def _apply_each(self, conn: Any, ready: list[Item]) -> int:
        """Each message not yet judged permanent in a transaction of its own (a commit
        refused the batch's content, and no savepoint can say whose write it was): only the
        offender's own commit fails. Returns how many committed."""
        commits = 0
        for item in ready:
            if item.permanent is None:
                item.outcome, item.transient = None, None
                await self._apply_one(conn, item, own=True)  # outside any transaction
                commits += item.outcome in _ACKED
        return commits

    async def _apply_one(
        self, conn: Any, item: Item, *, own: bool = False, traced: bool = False
    ) -> bool:
        """One message in a transaction of its own (``own``: it begins one), a savepoint
        inside the caller's: only its own failure is rolled back. ``traced``: an earlier
        message of this transaction set ``accord.trace``; returns whether it is set now."""
        try:
            async with conn.transaction():
                if own:
                    await self._begin(conn)
                item.outcome, traced = await self._reserve_and_handle(conn, item, traced)
        except Exception as exc:  # noqa: BLE001 - classified: permanent, transient or lost
            item.outcome = None  # whatever it decided was rolled back (its trace setting too)
            _classify(conn, item, exc)
        return traced

    async def _begin(self, conn: Any) -> None:
        """First in a transaction that may write a projection: its rebuild guard (_GuardHeld
        while a rebuild holds it or waits for it: the transaction rolls back, nothing done)."""
        if self.guard is not None and not await conn.fetchval(sql.PROJECTION_GUARD, self.guard):
            raise verdicts.GuardHeld(self.guard)

    async def _apply_all(self, conn: Any, ready: list[Item]) -> None:
        """Every message's inbox decision (one round trip when all are new), then handlers."""
        batch = []
        for item in ready:
            assert item.event is not None and item.digest is not None
            batch.append((item.event, item.delivery, item.digest))
        decided = await inbox.reserve_many(conn, self.consumer, batch)
        traced = False
        for item, fresh in zip(ready, decided, strict=True):
            if fresh:
                traced = await self._handle(conn, item, traced)
            item.outcome = InboxOutcome.NEW if fresh else InboxOutcome.DUPLICATE

    async def _reserve_and_handle(
        self, conn: Any, item: Item, traced: bool
    ) -> tuple[InboxOutcome, bool]:
        assert item.event is not None and item.handler is not None
        fresh = await inbox.reserve(
            conn, self.consumer, item.event, item.delivery, digest=item.digest
        )
        if not fresh:
            return InboxOutcome.DUPLICATE, traced
        return InboxOutcome.NEW, await self._handle(conn, item, traced)

    async def _handle(self, conn: Any, item: Item, traced: bool) -> bool:
        """The handler, in the transaction, under the delivery's ``process`` span: spans it
        starts are children, and a job it submits keeps the span's context (jobs.submit reads
        ``accord.trace``, set transaction-locally, only while the span records). ``traced``:
        an earlier message of this transaction set it; an unrecorded span clears it then (its
        job must not take another message's context). Returns whether it is set now."""
        assert item.handler is not None and item.event is not None
        carrier = telemetry.span_headers(item.span)
        if carrier or traced:
            await conn.execute(sql.SET_TRACE, json.dumps(carrier) if carrier else "")
        # A handler's exception is classified (retried, poisoned) in _settle, which sets the
        # span's error.type and, for a terminal outcome only, its status: recorded here, a
        # retried delivery would read as failed, with the exception's text (which may quote
        # data) in the trace and in the messaging metrics' error.type.
        with trace.use_span(
            item.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            await item.handler(conn, item.event)
        return bool(carrier)

    async def _settle(self, conn: Any, items: list[Item]) -> None:
        """After the commit: poison the doomed messages, ack the applied ones delivered before
        every retried one (a cumulative ack), wait out the retries' backoff and requeue them,
        then ack the applied ones delivered after (a second cumulative ack). A cumulative ack
        never covers a delivery still unsettled (see the module docstring), and what the
        commit applied is acked before the wait where it can be: a lane stopped during the
        wait returns only the retried messages and the applied ones delivered after them
        (duplicates when they come back)."""
        doomed: list[Item] = []
        retried: list[Item] = []
        applied: list[Item] = []
        for item in items:
            if item.outcome is not None:
                item.span.set_attribute(telemetry.ATTR_INBOX_OUTCOME, str(item.outcome))
            if item.permanent is None and item.transient is None and item.outcome not in _ACKED:
                # Never swept up by the cumulative ack without a committed decision.
                item.transient = TransientFailure("no inbox decision")
            if item.permanent is not None:
                doomed.append(item)
            elif item.transient is not None:
                if item.delivery.delivery_count >= self.delivery_limit:
                    doomed.append(item)  # the broker would dead-letter it on this return
                else:
                    retried.append(item)
            else:
                applied.append(item)
        if doomed:
            await self._poison(conn, doomed)  # records committed, then rejected
        first_retried = min((_tag(item) for item in retried), default=None)
        if first_retried is None:
            await self._ack(applied)
            return
        await self._ack([item for item in applied if _tag(item) < first_retried])
        await self._retry(retried)
        await self._ack([item for item in applied if _tag(item) > first_retried])

    async def _ack(self, applied: list[Item]) -> None:
        """One cumulative ack up to the last of ``applied``: every earlier delivery of this
        channel is settled by then (the caller's order)."""
        if not applied:
            return
        await max(applied, key=_tag).message.ack(multiple=True)
        for item in applied:
            item.settled = True
            if item.outcome is InboxOutcome.NEW:
                self.stats.new += 1
                observe.delivered(self.consumer.name, "new", item.delivery.enqueued_at)
            else:
                self.stats.duplicate += 1
                observe.delivered(self.consumer.name, str(item.outcome))

    async def _retry(self, retried: list[Item]) -> None:
        """Requeue each after the batch's backoff (by the most deliveries one of them had)."""
        if self.retry_backoff_s > 0:
            # The exponent is capped first: 2.0 ** a publisher's count may overflow a float.
            counted = min(30, max(item.delivery.delivery_count for item in retried))
            await anyio.sleep(min(RETRY_BACKOFF_MAX_S, self.retry_backoff_s * 2.0**counted))
        for item in retried:
            # reject, not nack: from RabbitMQ 4.3 only a reject counts a failed delivery
            # (x-delivery-count), and so reaches the delivery limit; a nack returns it
            # uncounted (https://www.rabbitmq.com/docs/4.3/nack). Before 4.3 both count.
            await item.message.reject(requeue=True)
            item.settled = True
            item.span.set_attribute(telemetry.ATTR_ERROR_TYPE, type(item.transient).__name__)
            self.stats.retried += 1
            observe.delivered(self.consumer.name, "retried")
            with trace.use_span(item.span, end_on_exit=False):  # its trace ids
                log.info("retry %s", _ids(item, item.transient))

    async def _poison(self, conn: Any, doomed: list[Item]) -> None:
        """Poison records in one short transaction, committed before any reject."""
        records = [self._record(item) for item in doomed]
        before: list[int | None] = []  # each one's earlier record, None when written now
        async with conn.transaction():
            for item, record in zip(doomed, records, strict=True):
                poison_id, wrote = await poison.record_poison(conn, record)
                # A redelivery decided before (its reject lost after the record's commit):
                # the record and the conflict's delivery row are there already.
                before.append(None if wrote else poison_id)
                if wrote and item.outcome is InboxOutcome.CONFLICT and item.event is not None:
                    await inbox.record_delivery(
                        conn, self.consumer, item.event, item.delivery, InboxOutcome.CONFLICT
                    )
        for item, record, earlier in zip(doomed, records, before, strict=True):
            await item.message.reject(requeue=False)
            item.settled = True
            self.stats.poisoned += 1
            conflict = item.outcome is InboxOutcome.CONFLICT
            observe.delivered(self.consumer.name, "conflict" if conflict else "poisoned")
            item.span.set_attribute(telemetry.ATTR_POISON_REASON, str(record.reason))
            item.span.set_attribute(telemetry.ATTR_ERROR_TYPE, str(record.reason))
            item.span.set_status(trace.Status(trace.StatusCode.ERROR, str(record.reason)))
            with trace.use_span(item.span, end_on_exit=False):  # its trace ids
                if earlier is None:
                    log.warning("poison reason=%s %s", record.reason, _ids(item, None))
                else:
                    log.warning(
                        "poison reason=%s %s (recorded before: poison record %d)",
                        record.reason, _ids(item, None), earlier,
                    )  # fmt: skip

    def _record(self, item: Item) -> poison.PoisonRecord:
        if item.permanent is not None:
            reason, detail = poison.reason_for(item.permanent), poison.error_detail(item.permanent)
        else:
            assert item.transient is not None
            reason = poison.PoisonReason.RETRIES_EXHAUSTED
            detail = {"error": type(item.transient).__name__, "limit": self.delivery_limit}
            sqlstate = getattr(item.transient, "sqlstate", None)
            if isinstance(sqlstate, str):
                detail["sqlstate"] = poison.storable(sqlstate, 5)
        size, sha = poison.body_fingerprint(item.message.body)
        event = item.event
        headers = item.message.headers or {}
        return poison.PoisonRecord(
            consumer=self.consumer.name,
            queue=self.queue,
            reason=reason,
            detail=detail,
            headers=poison.summarize_headers(headers),
            body_size=size,
            body_sha256=sha,
            redelivered=item.delivery.redelivered,
            delivery_count=item.delivery.delivery_count,
            tenant=event.tenant if event else None,
            operation_id=event.operation_id if event else None,
            event_id=str(event.event_id) if event else None,
            event_type=event.ce_type if event else None,
            message_id=_raw_id(item.message.message_id),
            # Parsed (canonical UUID text) when the message parsed; else as it came.
            publish_id=item.delivery.publish_id or _raw_id(headers.get("publish-id")),
            move_id=_raw_id(headers.get(wire.MOVE_ID)),
        )


def _classify(conn: Any, item: Item, exc: Exception) -> None:
    """Permanent errors poison the message, PostgreSQL's refusals of its content included
    (``database_refusal``); anything else from the (foreign) handler code is transient and
    retried, bounded by the queue's delivery limit; it is never dropped."""
    verdicts.raise_if_lost(conn, exc)
    verdicts.raise_if_privilege(exc)
    refused = verdicts.database_refusal(exc)
    if refused is not None:
        item.permanent = refused
    elif isinstance(exc, poison.PERMANENT_ERRORS):
        item.permanent = exc
        if isinstance(exc, InboxConflict):
            item.outcome = InboxOutcome.CONFLICT
    else:
        item.transient = exc


def _raw_id(value: Any) -> str | None:
    """An identifier as the message carried it, for the poison record: text only, storable."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return poison.storable(value, 200) if isinstance(value, str) else None


def _ids(item: Item, exc: BaseException | None) -> str:
    event = item.event
    parts = [
        f"message_id={item.message.message_id}",
        f"delivery_count={item.delivery.delivery_count}",
    ]
    if event is not None:
        parts += [f"tenant={event.tenant}", f"operation_id={event.operation_id}"]
    if exc is not None:
        parts.append(f"error={type(exc).__name__}")
    return " ".join(parts)


def _tag(item: Item) -> int:
    return item.message.delivery_tag or 0
