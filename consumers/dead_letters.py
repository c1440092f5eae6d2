"""A workflow class's poison queue, read and moved back (`accord dead-letters`).

The consumer rejects a message it decided can never be applied to its class's poison queue
after writing its poison record (``x-death`` reason ``rejected``). The broker dead-letters
there too, with no record, once a message's deliveries pass the queue's ``x-delivery-limit``
(reason ``delivery_limit``); on RabbitMQ 3.10 every return counts, a lost connection's
included, so a consumer restarted in a loop can send sound messages there
(docs/consumption.md). These functions let a person see what the poison queue holds and,
once the cause is fixed, move messages back to the class's queue.

Moving a message: published to the class's queue itself (the default exchange, by the
queue's name: no other class's queue gets a copy), persistent, mandatory, with publisher
confirms, its body, message id and headers as they were but for the broker's dead-letter and
delivery-count headers, with a fresh ``accord-move-id`` (a poison record tells this life of
the message from the one before by it); then acknowledged in the poison queue. A crash
between the two leaves a copy in both, which the inbox absorbs (at least once, never lost).
A message a pass does not move (a look, another reason, a publish the broker refused) is put
back the same way: a copy published to the poison queue's tail, its dead-letter headers
kept, confirmed before its original is acknowledged. Nothing is held unacknowledged through
a pass, and a return counts against no delivery limit (RabbitMQ 4 gives quorum queues one by
default, and the poison queue has no dead-letter exchange): only a copy the poison queue
refuses returns its original (a nack, which 4.3 does not count, as it does a reject), and
the pass stops there rather than read it again; an error returns the message in hand the
same way. A pass reads at most what the queue held when it began, oldest first: copies put
back, and messages dead-lettered meanwhile, land behind those and are not read twice.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aio_pika.abc
import aiormq

from accord.schemas import broker, wire
from accord.schemas.errors import ConfigError
from accord.schemas.topology import MISMATCH, Topology, mismatch

#: Headers the broker writes when it dead-letters a message; a moved message starts afresh
#: without them (its deliveries counted again from zero in the class's queue).
DEATH_HEADERS = frozenset(
    {"x-death", "x-first-death-reason", "x-first-death-queue", "x-first-death-exchange",
     "x-last-death-reason", "x-last-death-queue", "x-last-death-exchange"}
)  # fmt: skip
#: Written by a quorum queue at each delivery: never copied.
COUNT_HEADER = "x-delivery-count"

#: The death reasons a move may select: the broker's delivery limit (no poison record), the
#: consumer's own rejection (a poison record says why), or any.
REASONS = ("delivery_limit", "rejected", "any")

PUBLISH_TIMEOUT_S = 10.0
#: How long a read of the poison queue waits for the broker's next message.
GET_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message of a poison queue, by its identifiers (never its body)."""

    message_id: str | None
    event_type: str | None
    tenant: str | None
    operation_id: str | None
    #: Why it was dead-lettered last (``delivery_limit``: the broker, no record;
    #: ``rejected``: the consumer, after its poison record), and how many times in all.
    reason: str | None
    deaths: int
    #: Its outbox row's enqueue time (``ce-time``): past the consumers' replay window, a
    #: moved message is refused ``too_old`` (with a record) rather than applied.
    enqueued_at: str | None
    body_size: int

    @classmethod
    def of(cls, message: aio_pika.abc.AbstractIncomingMessage) -> DeadLetter:
        headers = message.headers or {}
        deaths = headers.get("x-death")
        return cls(
            message_id=message.message_id,
            event_type=_attribute(headers, "type"),
            tenant=_attribute(headers, "tenantid"),
            operation_id=_attribute(headers, "operationid"),
            reason=_last_reason(deaths) or _text(headers.get("x-first-death-reason")),
            deaths=_deaths(deaths),
            enqueued_at=_attribute(headers, "time"),
            body_size=len(message.body),
        )

    def selected(self, reason: str) -> bool:
        return reason == "any" or self.reason == reason


@dataclass(slots=True)
class Moved:
    """What a pass over a poison queue found and did."""

    queue: str
    poison_queue: str
    #: Messages the poison queue held when the pass began (the broker's count).
    held: int
    moved: list[DeadLetter] = field(default_factory=list)
    skipped: list[DeadLetter] = field(default_factory=list)
    #: Selected messages whose publish failed (returned, nacked, timed out): left in place.
    failed: list[tuple[DeadLetter, str]] = field(default_factory=list)
    #: Why the pass stopped early: the poison queue refused a copy put back (the original
    #: was returned instead, and reading on could hand it out and return it again).
    stopped: str | None = None


async def look(amqp_url: str, topology: Topology, workflow: str, *, limit: int) -> Moved:
    """Read up to ``limit`` messages of ``workflow``'s poison queue and put them all back (a
    look moves nothing; each copy goes to the queue's tail)."""
    return await _pass(amqp_url, topology, workflow, limit=limit, reason=None)


async def move_back(
    amqp_url: str, topology: Topology, workflow: str, *, reason: str, limit: int
) -> Moved:
    """Read up to ``limit`` of the messages ``workflow``'s poison queue held when the pass
    began, and move those last dead-lettered for ``reason`` (one of REASONS) back to the
    class's queue (see the module docstring); every other message read is put back."""
    if reason not in REASONS:
        raise ConfigError("a dead-letter move selects one of its reasons", reason=reason,
                          reasons=list(REASONS))  # fmt: skip
    return await _pass(amqp_url, topology, workflow, limit=limit, reason=reason)


async def _pass(
    amqp_url: str, topology: Topology, workflow: str, *, limit: int, reason: str | None
) -> Moved:
    queue, poison = topology.queue(workflow), topology.poison_queue(workflow)
    async with _channel(amqp_url) as channel:
        for name in (queue, poison):  # each named when it is missing
            try:
                declared = await channel.declare_queue(name, passive=True)
            except MISMATCH as exc:
                raise mismatch(exc, queue=name) from None
        held = int(declared.declaration_result.message_count or 0)
        done = Moved(queue, poison, held)
        for _ in range(min(held, limit)):
            message = await declared.get(no_ack=False, fail=False, timeout=GET_TIMEOUT_S)
            if message is None:
                break
            try:
                done.stopped = await _settle(channel, queue, poison, message, reason, done)
            except BaseException:
                # Not settled (an error, a cancel): returned now rather than at the close.
                with contextlib.suppress(Exception):
                    await message.nack(requeue=True)
                raise
            if done.stopped is not None:
                break
    return done


async def _settle(
    channel: aio_pika.abc.AbstractChannel,
    queue: str,
    poison: str,
    message: aio_pika.abc.AbstractIncomingMessage,
    reason: str | None,
    done: Moved,
) -> str | None:
    """Move ``message`` to ``queue`` when it is selected, else put a copy back in ``poison``;
    its original is acknowledged only once a copy is confirmed. None, or why the pass must
    stop: the poison queue refused the copy put back (the original is returned with a nack,
    which RabbitMQ 4.3 does not count against a delivery limit, as it does a reject)."""
    letter = DeadLetter.of(message)
    if reason is not None and letter.selected(reason):
        problem = await _publish(channel, queue, message, fresh=True)
        if problem is None:
            await message.ack()
            done.moved.append(letter)
            return None
        done.failed.append((letter, problem))
    else:
        done.skipped.append(letter)
    refused = await _publish(channel, poison, message, fresh=False)
    if refused is None:
        await message.ack()
        return None
    await message.nack(requeue=True)
    return f"put_back_refused:{refused}"


async def _publish(
    channel: aio_pika.abc.AbstractChannel,
    queue: str,
    message: aio_pika.abc.AbstractIncomingMessage,
    *,
    fresh: bool,
) -> str | None:
    """Publish a copy of ``message`` to ``queue`` (``fresh``: without its dead-letter
    headers) and wait for the broker's confirm; None when confirmed, else what went wrong
    (its type)."""
    dropped = DEATH_HEADERS | {COUNT_HEADER} if fresh else {COUNT_HEADER}
    headers = {k: v for k, v in (message.headers or {}).items() if k not in dropped}
    if fresh:  # a new life: its poison record, if it comes to one, is a record of its own
        headers[wire.MOVE_ID] = str(uuid.uuid4())
    copy = aio_pika.Message(
        message.body,
        headers=headers,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        timestamp=message.timestamp,
        type=message.type,
        app_id=message.app_id,
    )
    try:
        await channel.default_exchange.publish(
            copy, queue, mandatory=True, timeout=PUBLISH_TIMEOUT_S
        )
    except (aiormq.exceptions.PublishError, aiormq.exceptions.DeliveryError, TimeoutError) as exc:
        return type(exc).__name__
    return None


@contextlib.asynccontextmanager
async def _channel(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await broker.connect_or_unavailable(amqp_url)
    try:
        yield await connection.channel(publisher_confirms=True, on_return_raises=True)
    finally:
        await connection.close()


def _last_reason(x_death: Any) -> str | None:
    """The reason of the newest x-death entry (the broker puts the newest first)."""
    if isinstance(x_death, list) and x_death and isinstance(x_death[0], Mapping):
        return _text(x_death[0].get("reason"))
    return None


def _deaths(x_death: Any) -> int:
    """How many times the broker dead-lettered a message (the counts of its x-death)."""
    entries = x_death if isinstance(x_death, list) else []
    counts = [d.get("count") for d in entries if isinstance(d, Mapping)]
    return sum(c if isinstance(c, int) else 1 for c in counts)


def _attribute(headers: Mapping[str, Any], name: str) -> str | None:
    """A CloudEvents attribute under any prefix the consumer reads (wire.PREFIXES)."""
    for prefix in wire.PREFIXES:
        if (value := headers.get(prefix + name)) is not None:
            return _text(value)
    return None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)
