"""The consumer runtime: one process consuming one workflow class's quorum queue.

Per message: parse → one transaction {reserve, handler} → commit → then ack (see
consumers.batch). Manual acks with a bounded prefetch; several messages per transaction,
each its own inbox decision. One task group per session: ``concurrency`` workers, each
with its own channel, consumer and bounded stream (a *lane*) and its own PostgreSQL
connection, apply batches; a watcher turns a closed broker connection or channel into
ConnectionLost; a pruner keeps the inbox within its retention. A lane's worker takes its
deliveries in order, so a batch always holds the oldest unsettled deliveries of its
channel and one cumulative ack settles it (consumers.batch). A lost connection ends the
session; the runtime reconnects, and the broker redelivers whatever was not acknowledged.
``stop()`` (SIGTERM) drains: stop consuming, finish the buffered messages, commit, ack,
close.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import aio_pika
import aiormq
import anyio
from anyio import CancelScope
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from opentelemetry import trace

from accord import observe
from accord.consumers import inbox
from accord.consumers.batch import (
    DEFAULT_MAX_BODY_BYTES,
    RETRY_BACKOFF_MAX_S,
    AfterCommit,
    BatchProcessor,
    Stats,
)
from accord.consumers.errors import ConnectionLost
from accord.consumers.handlers import Handlers
from accord.consumers.inbox import Consumer
from accord.schemas import broker, telemetry, topology
from accord.schemas.backoff import BackoffPolicy, Reconnect
from accord.schemas.db import DB_CONNECTION_LOST, DB_RETRY_LATER, MAX_PRUNE_BATCH, create_pool
from accord.schemas.errors import BrokerAccessRefused, ConfigError, RetentionTooShort
from accord.schemas.events import Catalog
from accord.schemas.settings import duration_ok

log = logging.getLogger("consumers")

Message = aio_pika.abc.AbstractIncomingMessage
# Failures that end a session and are retried by reconnecting, never by skipping messages.
RECONNECTABLE: tuple[type[BaseException], ...] = (
    *DB_RETRY_LATER,
    ConnectionLost,
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.AMQPChannelError,
    aiormq.exceptions.ChannelInvalidStateError,
)


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """How one consumer runs. ``tenants`` must be explicit: the tenants this consumer serves
    (``{"*"}`` to serve every tenant, written out on purpose); any other tenant is poison.
    ``prefetch`` bounds each worker's channel (``concurrency * prefetch`` in flight).
    ``max_body_bytes`` bounds a message body: a larger one is poisoned unread (``too_large``);
    at least the producers' payload limit (``App.max_payload_bytes``: ``accord consume``
    refuses to start below it)."""

    workflow: str
    tenants: frozenset[str]
    replay_window_s: float = 7 * 24 * 3600.0
    prefetch: int = 64
    batch_max: int = 64
    # A lane that was idle waits up to this long after a batch's first delivery for more (until
    # the batch is full or holds the whole prefetch window), so that they share one transaction
    # and one ack (Kafka's linger.ms); a busy lane never lingers. 0: take what is there.
    batch_linger_s: float = 0.01
    concurrency: int = 2
    drain_timeout_s: float = 30.0
    reconnect_delay_s: float = 5.0  # the cap of the reconnect backoff
    connect_timeout_s: float = 10.0
    prune_interval_s: float = 60.0
    prune_batch: int = 1000
    # How often the class's poison queue is counted for /metrics (the broker dead-letters there
    # with no poison record past the delivery limit: `accord dead-letters list` reads it).
    poison_depth_every_s: float = 30.0
    declare: bool = True  # declare the topology at start; False: check it passively
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Poison records older than this are pruned with the inbox (None: kept); never shorter
    # than the replay horizon (the window plus the inbox's prune margin).
    poison_retention_s: float | None = None
    # The class is a projection (App.projection): each of its transactions takes the rebuild
    # guard, so `accord replay --rebuild` can run beside this consumer without losing an event.
    projection: bool = False
    # A message that failed transiently is requeued after this long at its first delivery,
    # doubling with each delivery counted, at most 5 s (BatchProcessor.retry_backoff_s): with
    # the default delivery limit of 5, its retries span about 6 s rather than a millisecond.
    retry_backoff_s: float = 0.2

    def __post_init__(self) -> None:
        if not self.tenants:
            raise ConfigError(
                "a consumer must be told which tenants it serves", workflow=self.workflow
            )
        if min(self.prefetch, self.batch_max, self.concurrency) < 1:
            raise ConfigError("prefetch, batch_max and concurrency must be positive")
        if not 1 <= self.prune_batch <= MAX_PRUNE_BATCH:
            raise ConfigError(
                f"a prune batch holds 1 to {MAX_PRUNE_BATCH} rows", prune_batch=self.prune_batch
            )
        if not 0 <= self.batch_linger_s < self.drain_timeout_s:
            raise ConfigError(
                "batch_linger_s must be at least 0 and shorter than the drain timeout",
                batch_linger_s=self.batch_linger_s,
            )
        if not 0 <= self.retry_backoff_s <= RETRY_BACKOFF_MAX_S:
            raise ConfigError(
                f"retry_backoff_s must be 0 to {RETRY_BACKOFF_MAX_S:g} seconds (the longest"
                " wait before a requeue)",
                retry_backoff_s=self.retry_backoff_s,
            )
        if not (duration_ok(self.poison_depth_every_s) and self.poison_depth_every_s > 0):
            raise ConfigError(
                "poison_depth_every_s must be a positive number of seconds",
                poison_depth_every_s=self.poison_depth_every_s,
            )
        horizon_s = inbox.replay_horizon_s(self.replay_window_s)
        if self.poison_retention_s is not None and not duration_ok(self.poison_retention_s):
            raise ConfigError(
                "poison_retention_s must be seconds, at most 100 years",
                poison_retention_s=self.poison_retention_s,
            )
        if self.poison_retention_s is not None and not self.poison_retention_s >= horizon_s:
            raise ConfigError(
                "poison_retention_s is shorter than the replay horizon (the replay window"
                f" plus {inbox.PRUNE_MARGIN_S:.0f} s): a redelivery could outlive its record",
                poison_retention_s=self.poison_retention_s,
                horizon_s=horizon_s,
            )
        if (
            isinstance(self.max_body_bytes, bool)
            or not isinstance(self.max_body_bytes, int)
            or self.max_body_bytes < 1
        ):
            raise ConfigError(
                "max_body_bytes must be a positive number of bytes",
                max_body_bytes=self.max_body_bytes,
            )


@dataclass
class ConsumerRuntime:
    """Consumes one workflow class; ``await run()`` until ``stop()``. Like the relay and the
    worker: its config first, every dependency by keyword."""

    config: RuntimeConfig
    _: KW_ONLY
    amqp_url: str
    pg_dsn: str
    topology: topology.Topology
    catalog: Catalog
    handlers: Handlers
    after_commit: AfterCommit | None = None
    tracer: trace.Tracer | None = None
    # The PostgreSQL role the pool's connections take at start (``role`` in their server
    # settings; the login must be a member): `accord consume` passes ``accord_consumer``,
    # the least-privileged consumer principal (grants: consumers/schema.sql). None: the
    # DSN's own user.
    pg_role: str | None = None
    stats: Stats = field(default_factory=Stats)
    sessions: int = 0

    def __post_init__(self) -> None:
        workflow = self.topology.workflow(self.config.workflow)
        self._queue_name = self.topology.queue(workflow.workflow)
        self._consumer = Consumer(self.config.workflow, self.catalog, self.config.replay_window_s)
        self._processor = BatchProcessor(
            consumer=self._consumer,
            handlers=self.handlers,
            tenants=self.config.tenants,
            queue=self._queue_name,
            delivery_limit=workflow.delivery_limit,
            tracer=self.tracer or telemetry.tracer(),
            after_commit=self.after_commit,
            stats=self.stats,
            max_body_bytes=self.config.max_body_bytes,
            guard=self.config.workflow if self.config.projection else None,
            guard_wait=self._guard_wait,
            retry_backoff_s=self.config.retry_backoff_s,
        )
        self._stopping = anyio.Event()
        self._run_scope: CancelScope | None = None
        self.consuming = anyio.Event()

    @property
    def _lane_name(self) -> str:
        """The liveness name of this consumer's lanes (one beat per lane task)."""
        return f"consumer.lane.{self.config.workflow}"

    async def _guard_wait(self, seconds: float) -> None:
        """A lane's batch waiting while a rebuild holds the projection's guard: not stuck."""
        observe.idle(self._lane_name)
        await anyio.sleep(seconds)
        observe.beat(self._lane_name, within_s=self.config.drain_timeout_s)

    def stop(self, *, now: bool = False) -> None:
        """Ask the runtime to drain and return: stop consuming, finish, ack, close. ``now``:
        cancel at once (whatever is unacknowledged is redelivered; nothing is lost)."""
        self._stopping.set()
        if now and self._run_scope is not None:
            self._run_scope.cancel()

    async def run(self) -> None:
        """Consume until stopped; reconnect after a lost connection. The composition root
        turns signals into :meth:`stop` (accord.runtime.stop_on_signals).

        Any other failure ends the run and is raised (unwrapped when it is a single error).
        """
        failure: BaseException | None = None
        with CancelScope() as self._run_scope:
            try:
                await self._reconnecting()
            except Exception as exc:  # noqa: BLE001 - re-raised below, unwrapped
                failure = exc
        self._run_scope = None
        if failure is not None:
            leaves = _leaves(failure)
            raise leaves[0] if len(leaves) == 1 else failure

    async def _reconnecting(self) -> None:
        """Sessions until stopped: a lost service is retried with the shared backoff (capped
        at ``reconnect_delay_s``); anything else, a ServiceRefused included, ends the run."""
        policy = BackoffPolicy(cap_s=self.config.reconnect_delay_s)
        reconnect = Reconnect(f"consumer {self.config.workflow}", log, policy)
        while not self._stopping.is_set():
            sessions = self.sessions
            try:
                await self._session()
            except BaseException as exc:  # only reconnectable failures are handled
                if not _reconnectable(exc):
                    raise
                if self.sessions > sessions:
                    reconnect.up()  # that session was up: start the backoff afresh
                delay = reconnect.lost(_describe(exc))
                with anyio.move_on_after(delay):
                    await self._stopping.wait()

    async def _session(self) -> None:
        cfg = self.config
        connection = await broker.connect(self.amqp_url, timeout=cfg.connect_timeout_s)
        try:
            pool = await create_pool(
                self.pg_dsn,
                min_size=cfg.concurrency + 1,
                max_size=cfg.concurrency + 1,
                **({"server_settings": {"role": self.pg_role}} if self.pg_role else {}),
            )
            try:
                await self._consume(connection, pool)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await pool.close()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await connection.close()

    async def _consume(self, connection: aio_pika.abc.AbstractConnection, pool: Any) -> None:
        cfg = self.config
        channel = await connection.channel()  # the declaration's own, closed after it
        try:
            await topology.declare(channel, self.topology, passive=not cfg.declare)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            if not self.sessions:  # at the start: the topology was never declared
                raise topology.mismatch(exc, queue=self._queue_name) from exc
            # Deleted under the running consumer, and not ours to declare: wait for it.
            raise ConnectionLost(
                service="rabbitmq", detail=f"the topology is missing: {str(exc)[:160]}"
            ) from exc
        except topology.MISMATCH as exc:
            # Not a lost connection: reconnecting would fail the same way for ever.
            raise topology.mismatch(exc, queue=self._queue_name) from exc
        finally:  # one channel per session was left open (the broker closes a refused one)
            with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError, OSError):
                if not channel.is_closed:
                    await channel.close()
        async with pool.acquire() as conn:  # before the first delivery of this session
            await inbox.declare_window(conn, self._consumer)
        self.sessions += 1
        with contextlib.ExitStack() as streams:
            lanes = [await self._lane(connection, streams) for _ in range(cfg.concurrency)]
            try:
                await self._lanes(pool, connection, lanes)
            finally:
                await _cancel_all(lanes)

    async def _lanes(
        self, pool: Any, connection: aio_pika.abc.AbstractConnection, lanes: list[_Lane]
    ) -> None:
        """The lanes' workers, the connection's watch and the pruner, until a stop drains
        them (or a failure ends the connection)."""
        cfg = self.config
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, connection, [lane.channel for lane in lanes])
            tg.start_soon(self._prune_loop, pool)
            tg.start_soon(self._poison_depth_loop, connection)
            async with anyio.create_task_group() as workers:
                for lane in lanes:
                    workers.start_soon(self._work, pool, lane)
                    await lane.start()
                self.consuming.set()
                await self._stopping.wait()
                log.info("draining %s", self._queue_name)
                workers.cancel_scope.deadline = anyio.current_time() + cfg.drain_timeout_s
                for lane in lanes:
                    await lane.stop()
            tg.cancel_scope.cancel()

    async def _lane(
        self, connection: aio_pika.abc.AbstractConnection, streams: contextlib.ExitStack
    ) -> _Lane:
        """One worker's channel (with its own prefetch) and the stream its consumer feeds."""
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=self.config.prefetch)
        queue = await channel.get_queue(self._queue_name, ensure=False)
        send, receive = anyio.create_memory_object_stream[Message](
            max_buffer_size=self.config.prefetch
        )
        streams.enter_context(send)
        streams.enter_context(receive)
        return _Lane(channel=channel, queue=queue, send=send, receive=receive)

    async def _work(self, pool: Any, lane: _Lane) -> None:
        name = self._lane_name
        async with lane.receive, pool.acquire() as conn:
            while True:
                observe.idle(name)  # waiting for deliveries is not being stuck
                idle = not lane.receive.statistics().current_buffer_used  # nothing waiting
                try:
                    batch = [await lane.receive.receive()]
                except anyio.EndOfStream:
                    return
                await self._fill(lane, batch, linger=idle)
                observe.beat(name, within_s=self.config.drain_timeout_s)
                await self._processor.process(conn, batch)

    async def _fill(self, lane: _Lane, batch: list[Message], *, linger: bool) -> None:
        """Adds to ``batch`` what already arrived, up to ``batch_max``; then, when ``linger``
        (the lane was idle: a busy one never lingers) and ``batch_linger_s``, what arrives
        within it, until the batch is full or holds the channel's whole prefetch window
        (nothing more can come before its ack). It waits on the feeder's signal, never in a
        receive that a timeout could cancel: a delivery lost between the stream and the batch
        would be acked unapplied by the next cumulative ack."""
        cfg = self.config
        full = min(cfg.batch_max, cfg.prefetch)
        if not (self._take(lane, batch) and linger and cfg.batch_linger_s):
            return
        with anyio.move_on_after(cfg.batch_linger_s) as lingered:
            while len(batch) < full:
                lane.arrived = anyio.Event()
                await lane.arrived.wait()
                if not self._take(lane, batch):
                    return
        if lingered.cancelled_caught:  # what arrived as the linger ended
            self._take(lane, batch)

    def _take(self, lane: _Lane, batch: list[Message]) -> bool:
        """Adds what the stream holds now, up to ``batch_max``; False once it has ended."""
        while len(batch) < self.config.batch_max:
            try:
                batch.append(lane.receive.receive_nowait())
            except anyio.WouldBlock:
                return True
            except anyio.EndOfStream:
                return False
        return True

    async def _watch(
        self,
        connection: aio_pika.abc.AbstractConnection,
        channels: Sequence[aio_pika.abc.AbstractChannel],
    ) -> None:
        """End the session when the broker connection, or a lane's channel, closes under us,
        or the broker cancels a lane's consumer (its queue deleted): a worker whose channel
        or consumer is gone would otherwise wait for deliveries for ever, and the process
        say it is healthy. The next session declares the queue again (or, passive, waits
        for it)."""
        ended, why = anyio.Event(), []

        def end(reason: str | None) -> None:
            why.append(reason)
            ended.set()

        connection.close_callbacks.add(lambda *_: end(None))
        for channel in channels:
            channel.close_callbacks.add(lambda *_: end(None))
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(
                lambda *_: end("the broker cancelled the consumer (its queue deleted?)")
            )
        await ended.wait()
        raise ConnectionLost(service="rabbitmq", **({"detail": why[0]} if why[0] else {}))

    async def _prune_loop(self, pool: Any) -> None:
        """Each interval, bounded batches of the inbox and delivery log (and of poison
        records, given a retention) until one comes back short. A poison retention the
        database refuses (another process of this consumer declared a longer window) is
        logged and its pruning skipped for that round; the inbox's goes on. A round the
        database cannot serve now (a lock it waited for too long, a read-only or busy server)
        is logged and tried again at the next interval: it ended the whole consumer
        connection, every message in flight charged a delivery (a CREATE INDEX on the poison
        table: 28 reconnects in 30 s). A lost connection still ends it."""
        cfg = self.config
        while True:
            observe.beat("consumer.prune", within_s=cfg.prune_interval_s)
            try:
                await self._prune_round(pool)
            except DB_CONNECTION_LOST:
                raise
            except DB_RETRY_LATER as exc:
                log.warning("inbox not pruned this round (%s); next in %gs",
                            type(exc).__name__, cfg.prune_interval_s)  # fmt: skip
            await anyio.sleep(cfg.prune_interval_s)

    async def _poison_depth_loop(self, connection: aio_pika.abc.AbstractConnection) -> None:
        """Each interval, the class's poison queue's message count into
        ``accord_consumer_poison_queue_messages`` (a passive declare on a channel of its own:
        a missing queue closes that channel, never a lane's). The broker dead-letters a
        message past the delivery limit with no poison record, so only the queue shows it.
        A count the broker does not give, for whatever reason, is logged and tried at the
        next interval: a lost connection is the watch's to end, with its own type."""
        every_s = self.config.poison_depth_every_s
        name = self.topology.poison_queue(self.config.workflow)
        while True:
            observe.beat("consumer.poison_depth", within_s=every_s)
            try:
                channel = await connection.channel()
                try:
                    queue = await channel.declare_queue(name, passive=True)
                    count = int(queue.declaration_result.message_count or 0)
                    observe.poison_queue_depth(self._consumer.name, count)
                finally:
                    if not channel.is_closed:
                        await channel.close()
            except Exception as exc:  # noqa: BLE001 - a count never ends the session
                log.warning("poison queue %s not counted (%s)", name, type(exc).__name__)
            await anyio.sleep(every_s)

    async def _prune_round(self, pool: Any) -> None:
        cfg = self.config
        async with pool.acquire() as conn:
            while True:
                async with conn.transaction():
                    counts = await inbox.prune(conn, self._consumer, limit=cfg.prune_batch)
                poison = 0
                if cfg.poison_retention_s is not None:
                    try:
                        async with conn.transaction():
                            poison = await inbox.prune_poison(
                                conn,
                                self._consumer.name,
                                retention_s=cfg.poison_retention_s,
                                limit=cfg.prune_batch,
                            )
                    except RetentionTooShort as exc:
                        log.error("poison records not pruned: %s", exc)
                if max(*counts, poison) < cfg.prune_batch:
                    return


@dataclass
class _Lane:
    """One worker's channel and consumer; its deliveries reach the worker in order."""

    channel: aio_pika.abc.AbstractChannel
    queue: aio_pika.abc.AbstractQueue
    send: MemoryObjectSendStream[Message]
    receive: MemoryObjectReceiveStream[Message]
    tag: str | None = None
    # Set by the feeder at each delivery it hands over (a lingering batch waits on it).
    arrived: anyio.Event = field(default_factory=anyio.Event)

    async def start(self) -> None:
        try:
            self.tag = await self.queue.consume(self._feed, no_ack=False)
        except aiormq.exceptions.ChannelAccessRefused as exc:
            # Not a lost channel: the broker refuses this user the queue at every retry.
            raise BrokerAccessRefused(
                "RabbitMQ refused this user the queue: grant it read permission on it"
                " (rabbitmqctl set_permissions)",
                queue=self.queue.name,
                detail=str(exc)[:200],
            ) from None

    async def _feed(self, message: Message) -> None:
        try:
            # Never blocks: the stream holds ``prefetch`` messages, the broker sends no more.
            self.send.send_nowait(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            # Draining, or the session is ending: leave it unacked, and the channel's close
            # gives it back once. A nack would requeue it to another lane of this session,
            # closing too, at once and again (each one counted against the delivery limit:
            # sound messages dead-lettered with no poison record).
            return
        except anyio.WouldBlock:  # never (see above); give it back rather than hold it
            await message.nack(requeue=True)
            return
        self.arrived.set()

    async def stop(self) -> None:
        """Stop consuming; the worker finishes what its stream holds, then ends."""
        await self.cancel()
        self.send.close()
        self.arrived.set()  # a lingering batch ends now

    async def cancel(self) -> None:
        """Cancel this lane's consumer (once): the broker delivers it nothing more."""
        tag, self.tag = self.tag, None
        if tag is not None and not self.channel.is_closed:
            await self.queue.cancel(tag)


async def _cancel_all(lanes: Sequence[_Lane]) -> None:
    """Every lane's consumer cancelled before the connection closes, whatever ended it:
    closed with consumers on, the messages one lane's closing channel returned went to a
    sibling lane's still open, which dropped them, each return counted against the delivery
    limit (a lost database connection cost a message up to as many deliveries as lanes)."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
        for lane in lanes:
            with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError, OSError):
                await lane.cancel()


def _leaves(exc: BaseException) -> Sequence[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _reconnectable(exc: BaseException) -> bool:
    leaves = _leaves(exc)
    return bool(leaves) and all(isinstance(leaf, RECONNECTABLE) for leaf in leaves)


def _describe(exc: BaseException) -> str:
    return ", ".join(sorted({type(leaf).__name__ for leaf in _leaves(exc)}))
