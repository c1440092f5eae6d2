"""The broker seam: one small ``Publisher`` protocol and its aio-pika implementation.

A publish counts only when the broker confirmed it. Everything else raises exactly one
:class:`relay.errors.PublishFailed` subclass; aio-pika/aiormq errors are mapped here,
once, and nowhere else. The channel is opened with ``publisher_confirms=True`` and
``on_return_raises=True`` and every message is ``mandatory`` and persistent, so an
unroutable message can never look delivered (STYLE.md anti-patterns).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Protocol

import aio_pika
import aiormq
import anyio

from accord.relay.errors import (
    ConnectionLost,
    ExchangeMissing,
    MessageTooLarge,
    Nacked,
    PublishRefused,
    PublishTimeout,
    Unroutable,
)
from accord.schemas import broker
from accord.schemas.wire import WireMessage

# RabbitMQ closes the channel with 406 and this text for a message over max_message_size.
_TOO_LARGE = re.compile(r"larger than configured max size (\d+)")


class Publisher(Protocol):
    """Publish one message and return only once the broker confirmed it."""

    async def publish(self, message: WireMessage, *, confirm_timeout_s: float) -> None:
        """Raises a PublishFailed subclass when the publish did not count.

        The deadline is a parameter (not the caller's ``fail_after``) because aiormq
        applies it inside ``basic_publish``, where it can still roll back an unsent frame.
        """
        ...

    def broken(self) -> bool:
        """True once the channel or connection is unusable (the relay reconnects)."""
        ...

    async def writable(self) -> None:
        """Return once the broker takes publishes on this session: at once, unless it
        blocked the connection (connection.blocked: a memory or disk alarm)."""
        ...


class AmqpPublisher:
    """The aio-pika publisher on one confirm-mode channel."""

    def __init__(
        self,
        channel: aio_pika.abc.AbstractChannel,
        exchange: aio_pika.abc.AbstractExchange,
        connection: aio_pika.abc.AbstractConnection,
    ) -> None:
        self._channel = channel
        self._exchange = exchange
        self._connection = connection
        # The publishes in flight by message id (see publish), and how many wait for each.
        self._same_id: dict[str, _SameId] = {}
        # A publish timed out: the broker may have stopped reading without blocking the
        # connection (a frozen node, flow control). Broken from then on, so the relay ends
        # this session and reconnects with its backoff, its connect the liveness probe; on
        # the same session, each row's retry wrote one more copy the broker routed later.
        self._stalled = False

    def broken(self) -> bool:
        return self._stalled or self._channel.is_closed

    async def writable(self) -> None:
        # aiormq keeps the broker's connection.blocked / unblocked: ready() waits for the
        # unblock (and for the connection; a closed one is broken() first).
        transport = self._connection.transport
        if transport is not None:
            await transport.connection.ready()

    async def publish(self, message: WireMessage, *, confirm_timeout_s: float) -> None:
        """Never two publishes of one message id unconfirmed on this channel at once: aiormq
        matches a ``basic.return`` to its publish by message id, so two rows with the same
        event id (two tenants may share one) had their outcomes crossed, and an unroutable
        one was marked published. A second waits for the first within its own deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + confirm_timeout_s
        same = self._same_id.get(message.message_id)
        if same is None:  # (setdefault would build a lock for every publish)
            same = self._same_id[message.message_id] = _SameId()
        same.users += 1
        try:
            if same.users == 1:  # alone: the lock is free (no task for wait_for per publish)
                await same.lock.acquire()
            else:
                try:
                    await asyncio.wait_for(same.lock.acquire(), confirm_timeout_s)
                except TimeoutError as exc:
                    raise PublishTimeout(timeout_s=confirm_timeout_s) from exc
            try:
                left = deadline - loop.time()
                if left <= 0:  # the whole deadline went waiting: nothing was sent
                    raise PublishTimeout(timeout_s=confirm_timeout_s)
                await self._publish(message, left, confirm_timeout_s)
            finally:
                same.lock.release()
        finally:
            same.users -= 1
            if not same.users:
                del self._same_id[message.message_id]

    async def _publish(
        self, message: WireMessage, timeout_s: float, confirm_timeout_s: float
    ) -> None:
        amqp_message = aio_pika.Message(
            message.body,
            headers=dict(message.headers),
            content_type=message.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=message.message_id,
        )
        try:
            await self._exchange.publish(
                amqp_message, message.routing_key, mandatory=True, timeout=timeout_s
            )
        except aiormq.exceptions.PublishError as exc:
            frame = exc.frame
            raise Unroutable(reply_code=getattr(frame, "reply_code", None)) from exc
        except aiormq.exceptions.DeliveryError as exc:
            raise Nacked() from exc
        except TimeoutError as exc:
            self._stalled = True
            raise PublishTimeout(timeout_s=confirm_timeout_s) from exc
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            raise _precondition(exc, len(message.body)) from exc
        except aiormq.exceptions.ChannelAccessRefused as exc:
            # Not a lost channel, nor this row's fault: refused at every retry (the relay
            # stops, every batch settled); the row stays pending, published once allowed.
            raise PublishRefused(
                "RabbitMQ refused this user publishing to the exchange: grant it write"
                " permission on it (rabbitmqctl set_permissions)",
                exchange=self._exchange.name,
                detail=str(exc)[:200],
            ) from None
        except (
            aiormq.exceptions.AMQPError,
            aiormq.exceptions.ChannelInvalidStateError,
            ConnectionError,
            OSError,
        ) as exc:
            raise ConnectionLost(detail=type(exc).__name__) from exc
        except asyncio.CancelledError as exc:
            # aiormq cancels pending confirms when the channel closes under them. That is a
            # lost publish, not our cancellation: only re-raise when we are being cancelled.
            task = asyncio.current_task()
            if self._channel.is_closed and task is not None and not task.cancelling():
                raise ConnectionLost(detail="channel closed") from exc
            raise


@dataclass(slots=True)
class _SameId:
    """The publishes of one message id: one unconfirmed at a time on a channel."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


def _precondition(exc: aiormq.exceptions.ChannelPreconditionFailed, size: int) -> Exception:
    """The broker closed the channel (406). Every publish in flight on it fails with the same
    error, so only a message over the limit it names is too large; the others were lost with
    the channel and stay eligible."""
    match = _TOO_LARGE.search(str(exc))
    if match and size > int(match[1]):
        return MessageTooLarge(size=size, limit=int(match[1]))
    if match:
        return ConnectionLost(detail="channel closed over another message's size")
    return ConnectionLost(detail=f"precondition failed: {exc}")


#: What a publisher session runs on its channel before it checks the exchange (the
#: application's topology declaration, when the relay declares it).
Declare = Callable[[aio_pika.abc.AbstractChannel], Awaitable[object]]


@asynccontextmanager
async def amqp_publisher(
    url: str, exchange: str, *, connect_timeout: float = 10.0, declare: Declare | None = None
) -> AsyncIterator[AmqpPublisher]:
    """Connect, open a confirm channel, run ``declare`` on it (if given) and check that
    ``exchange`` exists; close on exit.

    ServiceUnavailable when the broker does not answer; ExchangeMissing when the exchange is
    missing (declare the topology first); a ServiceRefused when the broker refuses the login
    or the vhost (accord.schemas.broker); what ``declare`` raises.
    """
    connection = await broker.connect_or_unavailable(url, timeout=connect_timeout)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        if declare is not None:
            await declare(channel)
        try:
            events = await channel.get_exchange(exchange, ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise ExchangeMissing(exchange=exchange) from exc
        yield AmqpPublisher(channel, events, connection)
    finally:
        await _close_quietly(connection)


async def _close_quietly(connection: aio_pika.abc.AbstractConnection) -> None:
    # Closing a connection the broker already dropped raises; it is gone either way. The
    # close is shielded (it runs during shutdown too) and bounded.
    with (
        anyio.CancelScope(shield=True),
        anyio.move_on_after(5),
        suppress(aiormq.exceptions.AMQPError, OSError, RuntimeError),
    ):
        await connection.close()
