"""The relay: outbox rows → RabbitMQ, never losing a committed event.

Each cycle: claim a batch by state in one statement, its own transaction (a fresh lease
token per batch), publish the batch concurrently *outside* any transaction with confirms,
then settle it in a second statement guarded by the token. Only a confirmed publish
marks a row published; nack, return, timeout and a lost connection leave it pending with
attempts and a typed reason, so duplicates are possible and loss is not. At most
``in_flight`` rows are claimed and unsettled at once, which bounds the duplicates a crash
can cause. LISTEN/NOTIFY only wakes a loop (one per NOTIFY); polling is the truth.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from accord import observe
from accord.relay import outbox, sql
from accord.relay.errors import (
    ExchangeMissing,
    MessageTooLarge,
    PublishFailed,
    PublishRefused,
    Unroutable,
)
from accord.relay.outbox import OutboxRow, OutboxState, Settlement
from accord.relay.publisher import Publisher, amqp_publisher
from accord.schemas import telemetry
from accord.schemas.backoff import BackoffPolicy, Reconnect
from accord.schemas.db import DB_CONNECTION_LOST, DB_RETRY_LATER, MAX_PRUNE_BATCH, connect
from accord.schemas.errors import ConfigError
from accord.schemas.settings import duration_ok
from accord.schemas.wire import DEFAULT_SOURCE, to_amqp

log = logging.getLogger("accord.relay")

PublisherFactory = Callable[[], AbstractAsyncContextManager[Publisher]]


# The longest awake promise a relay may make: while one runs, producers do not NOTIFY.
MAX_AWAKE_S = 60.0
# A claim of at least this many rows: events come several times faster than one per
# linger, where polling every linger costs fewer claims than the wake-ups would and every
# NOTIFY saved is a producer's commit no longer serialized. (At two, one event per linger,
# promised relays left the machine less busy in the pipeline: docs/bench-log.md.)
AWAKE_MIN_ROWS = 8
# How often a loop polls while awake when linger_s is 0.
AWAKE_POLL_S = 0.005


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """What one relay needs; built by the composition root from Settings."""

    pg_dsn: str
    amqp_url: str
    exchange: str
    batch: int = 200
    in_flight: int = 256
    publish_timeout_s: float = 10.0
    lease_s: float = 30.0
    poll_s: float = 1.0
    # After a wake-up from idle, wait this long before claiming, so that the events committed
    # meanwhile share the claim, the pipelined publish and the settle (Kafka's linger.ms).
    # Each event waits at most this long more; a busy relay never lingers. 0: claim at once.
    linger_s: float = 0.01
    # While this relay finds events at a sustained rate (a claim of eight or more), it promises
    # (relay.awake) to poll every linger for this long, renewed at half of it, and enqueues
    # meanwhile skip their NOTIFY, which caps producers' commit rate. 0: never promise.
    awake_s: float = 2.0
    retention_s: float = 7 * 24 * 3600.0
    # Release audit rows (accord relay release-held) leave after this, once their row is
    # published or gone (the composition root keeps it >= the jobs retention).
    audit_retention_s: float = 90 * 24 * 3600.0
    prune_batch: int = 1000
    prune_every_s: float = 60.0
    retry_base_s: float = 0.1
    retry_max_s: float = 30.0
    unroutable_attempts: int = 3
    max_message_bytes: int = 0  # 0: the broker's limit only
    reconnect_max_s: float = 5.0
    # Concurrent claim/publish/settle loops sharing one channel: while one waits on
    # PostgreSQL the other publishes (the client CPU is the limit, DESIGN §11).
    loops: int = 2
    source: str = DEFAULT_SOURCE
    # The PostgreSQL role every relay connection takes at start (``role`` in its server
    # settings; the login must be a member): `accord relay` passes ``accord_relay``, the
    # least-privileged relay principal (grants: relay/schema.sql). None: the DSN's own user.
    pg_role: str | None = None

    def __post_init__(self) -> None:
        for name in ("retention_s", "audit_retention_s"):
            if not duration_ok(getattr(self, name)):
                # -1 day removed a row published a moment ago; NaN or 1e12 failed in the
                # database at the first prune.
                raise ConfigError(
                    f"the relay's {name} must be seconds >= 0, at most 100 years",
                    **{name: getattr(self, name)},
                )
        if self.publish_timeout_s >= self.lease_s:
            # A publish that outlives its lease can race a second relay's claim.
            raise ConfigError(
                "publish timeout must be shorter than the relay lease",
                publish_timeout_s=self.publish_timeout_s,
                lease_s=self.lease_s,
            )
        sizes = (self.batch, self.in_flight, self.unroutable_attempts, self.prune_batch, self.loops)
        if min(sizes) < 1:
            raise ConfigError("relay sizes must be positive")
        if self.prune_batch > MAX_PRUNE_BATCH:
            raise ConfigError(
                f"a prune batch holds at most {MAX_PRUNE_BATCH} rows", prune_batch=self.prune_batch
            )
        if self.in_flight < self.loops:
            raise ConfigError("in_flight must be at least loops", in_flight=self.in_flight)
        if not 0 <= self.linger_s < self.lease_s:
            raise ConfigError(
                "linger_s must be at least 0 and shorter than the relay lease",
                linger_s=self.linger_s,
            )
        if not 0 <= self.awake_s <= MAX_AWAKE_S:
            raise ConfigError(
                f"awake_s must be between 0 and {MAX_AWAKE_S}: while a relay that died promised,"
                " events wait for another relay's poll",
                awake_s=self.awake_s,
            )

    @property
    def claim_size(self) -> int:
        """Rows per claim: all loops together never hold more than ``in_flight``."""
        return max(1, min(self.batch, self.in_flight // self.loops))


@dataclass(slots=True)
class RelayStats:
    """Counters for tests, logs and metrics (process-local, not durable)."""

    cycles: int = 0  # claims that found rows, each with its publish and settle
    claims: int = 0  # every claim, empty or not
    published: int = 0
    held: int = 0
    pruned: int = 0
    pruned_audit: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    promises: int = 0  # awake promises written (relay.awake)
    # Rows published (or failed) whose settle found them no longer this relay's: their lease
    # ran out first and another relay claimed them (they are published again).
    settle_lost: int = 0


class Relay:
    """One relay process's loop. Several may run against one outbox."""

    def __init__(self, config: RelayConfig, *, publisher: PublisherFactory | None = None) -> None:
        """Like the consumer runtime and the worker: its config first, dependencies by
        keyword; ``run()`` until ``stop()``."""
        self.config = config
        self.stats = RelayStats()
        self._publisher = publisher or (lambda: amqp_publisher(config.amqp_url, config.exchange))
        # One event per sleeping loop: ``wake()`` sets one of them, ``stop()`` every one.
        self._waiters: set[anyio.Event] = set()
        self._stop_waiters: set[anyio.Event] = set()  # backoffs: a stop ends them, no NOTIFY
        self._missed = False  # a wake-up came while no loop slept: the next one claims at once
        self._lingering = 0  # loops woken and lingering: their claims are still to come
        self._polling = 0  # loops waiting a linger to poll again, while awake
        self._stopping = False
        #: The broker blocks this relay's connection (a memory or disk alarm) at the moment.
        self.blocked = False
        # This relay's promise to poll (relay.awake): as the database holds it, and until when
        # by this process's clock (a little later than the database's: the safe side).
        self._promised: Any = None
        self._awake_until = float("-inf")
        self._promise_refused = False  # then it promises no more (logged once)
        self._run_scope: anyio.CancelScope | None = None
        # Set once a loop holds both a broker session and a database link: the relay then
        # publishes (what its process's ready line and /readyz wait for).
        self.publishing = anyio.Event()
        # The broker refused this user publishing: the relay stops, and run() raises it.
        self._refused: PublishRefused | None = None
        self._max_bytes = config.max_message_bytes
        self._tracer = telemetry.tracer()
        self._pg_args: dict[str, Any] = (
            {"server_settings": {"role": config.pg_role}} if config.pg_role else {}
        )

    def stop(self, *, now: bool = False) -> None:
        """Ask the relay to finish its current batch and return; ``now``: cancel at once (rows
        in flight stay leased until their lease expires, then are published again)."""
        self._stopping = True
        for waiter in (*self._waiters, *self._stop_waiters):
            waiter.set()
        if now and self._run_scope is not None:
            self._run_scope.cancel()

    def wake(self, *_: Any) -> None:
        """A NOTIFY: wakes one sleeping loop. Its claim takes every eligible row (up to the
        batch), so waking every loop for one row would cost the others an empty claim each.
        While a woken loop lingers, nothing: its claim, still to come, sees every row whose
        commit this NOTIFY announced (a full claim is followed by another at once). With none
        asleep, the next loop about to sleep claims again at once instead."""
        if self._lingering:
            return
        for waiter in self._waiters:
            if not waiter.is_set():
                waiter.set()
                return
        self._missed = True

    async def run(self) -> None:
        """Run until ``stop()``; reconnects to PostgreSQL and RabbitMQ by itself. A broker
        that refuses this user publishing (PublishRefused: refused at every retry) stops it
        as ``stop()`` does, every batch settled, and is raised once it stopped."""
        async with anyio.create_task_group() as tg:
            self._run_scope = tg.cancel_scope
            tg.start_soon(self._listen_loop)
            await self._publish_loop()
            tg.cancel_scope.cancel()
        if self._refused is not None:
            raise self._refused

    def _reconnect(self, what: str) -> Reconnect:
        return Reconnect(what, log, BackoffPolicy(cap_s=self.config.reconnect_max_s))

    async def _publish_loop(self) -> None:
        """One broker session at a time; inside it, ``loops`` workers each with a PG link.
        A lost service is retried with the shared backoff; a refusal (ServiceRefused: a bad
        login, a missing vhost) is not a lost service and ends the relay."""
        reconnect = self._reconnect("relay (broker)")
        while not self._stopping:
            try:
                async with self._publisher() as publisher:
                    reconnect.up()
                    async with anyio.create_task_group() as tg:
                        for index in range(self.config.loops):
                            tg.start_soon(self._worker, publisher, index)
            except DB_RETRY_LATER as exc:
                await self._backoff(self._lost(exc, reconnect))
            except ExchangeMissing as exc:
                # Deleted under the running relay (a start without it is refused): its rows
                # wait, /readyz names the exchange, and a later session finds it declared.
                await self._backoff(self._lost(str(exc), reconnect))
            else:
                if not self._stopping:  # the channel broke: reconnect the broker side
                    await self._backoff(self._lost("broker channel closed", reconnect))

    def _lost(self, cause: BaseException | str, reconnect: Reconnect) -> float:
        """Count and log a lost service; returns the backoff. The publish loop then waits
        for the service, which is not being stuck: /healthz stays 200 (a restart would not
        bring the service back) until its next beat starts the clock again."""
        self.stats.reconnects += 1
        observe.idle("relay.publish")
        return reconnect.lost(cause)

    async def _worker(self, publisher: Publisher, index: int) -> None:
        """Own PostgreSQL link; returns when stopping or when the broker channel broke."""
        reconnect = self._reconnect(f"relay loop {index} (database)")
        while not self._stopping and not publisher.broken():
            try:
                conn = await connect(self.config.pg_dsn, **self._pg_args)
            except DB_RETRY_LATER as exc:
                await self._backoff(self._lost(exc, reconnect))
                continue
            try:
                reconnect.up()
                self.publishing.set()
                await self._drain(conn, publisher, prunes=index == 0)
            except DB_RETRY_LATER as exc:
                await self._backoff(self._lost(exc, reconnect))
            finally:
                await _close(conn)

    async def _drain(self, conn: asyncpg.Connection, publisher: Publisher, *, prunes: bool) -> None:
        """Cycle while there is work; wait for a wake-up or the poll interval otherwise, or,
        while this relay's awake promise runs, poll every linger (one loop at a time)."""
        next_prune = 0.0 if prunes else float("inf")
        within_s = self.config.poll_s + self.config.publish_timeout_s
        while not self._stopping and not publisher.broken():
            observe.beat("relay.publish", within_s=within_s)
            if not await self._writable(publisher):
                continue
            if anyio.current_time() >= next_prune:
                pruned = await self.prune_once(conn)
                full = pruned >= self.config.prune_batch
                next_prune = anyio.current_time() + (0 if full else self.config.prune_every_s)
            claimed = await self.cycle(conn, publisher)
            if claimed >= AWAKE_MIN_ROWS:
                await self._promise(conn)
            awake = anyio.current_time() < self._awake_until
            if claimed >= self.config.claim_size and awake:
                self.wake()  # a backlog no NOTIFY announces: another loop's claim shares it
            if claimed < self.config.claim_size and not self._stopping:
                if self._missed:  # woken while busy: what the wake-up announced may be due
                    self._missed = False
                    continue
                if awake and not self._polling:  # promised: one loop polls, the others woken
                    self._polling += 1
                    try:
                        await self._sleep(self._awake_poll_s)
                    finally:
                        self._polling -= 1
                    continue
                if await self._sleep(self.config.poll_s) and self.config.linger_s:
                    self._lingering += 1
                    try:
                        await anyio.sleep(self.config.linger_s)
                    finally:
                        self._lingering -= 1
        if self._stopping:
            await self._withdraw(conn)

    async def _writable(self, publisher: Publisher) -> bool:
        """Whether the broker takes publishes now. A session it blocked (a memory or disk
        alarm) is waited on for up to a poll at a time, claiming nothing: a publish written
        to a blocked connection cannot be taken back, times out, and went out once more per
        timeout when the alarm cleared (a 35 s alarm: 8 copies of each row). Logged once per
        block; /readyz says so meanwhile (``blocked``), /healthz does not (a restart would
        not clear the alarm)."""
        with anyio.move_on_after(self.config.poll_s):
            await publisher.writable()
            if self.blocked:
                self.blocked = False
                log.warning("relay: the broker takes publishes again; claiming")
            return True
        if not self.blocked:
            self.blocked = True
            log.warning(
                "relay: the broker blocked publishing (a memory or disk alarm);"
                " claiming nothing until it clears"
            )
        observe.idle("relay.publish")
        return False

    @property
    def _awake_poll_s(self) -> float:
        """How often a loop polls while awake: every linger, never less often than idle."""
        return min(self.config.linger_s or AWAKE_POLL_S, self.config.poll_s)

    async def _promise(self, conn: asyncpg.Connection) -> None:
        """Promise (again) to poll for ``awake_s``, once less than half of it is left. A
        refusal (a role without its grant) ends the promises, not the relay: enqueues go on
        notifying. Any other error of the statement skips this promise only (the next
        poll's tries again): a promise is an optimisation, never worth the relay."""
        awake_s = self.config.awake_s
        left_s = self._awake_until - anyio.current_time()
        if not awake_s or self._promise_refused or left_s > awake_s / 2:
            return
        try:
            row = await conn.fetchrow(sql.PROMISE_AWAKE, awake_s)
        except DB_CONNECTION_LOST:
            raise
        except asyncpg.InsufficientPrivilegeError as exc:
            self._promise_refused = True
            log.error(
                "relay: cannot promise to poll (%s: %s); enqueues keep notifying and this"
                " relay tries no more until it restarts. Grant UPDATE (until) ON relay.awake"
                " to the relay's role, or set ACCORD_RELAY_AWAKE_S=0",
                type(exc).__name__,
                exc,
            )
            return
        except asyncpg.PostgresError as exc:
            log.warning(
                "relay: this promise to poll failed (%s: %s); enqueues notify meanwhile",
                type(exc).__name__,
                exc,
            )
            return
        self._promised = row["until"] if row["own"] else None  # never withdraw another's
        self._awake_until = anyio.current_time() + row["remaining_s"]
        self.stats.promises += 1

    async def _withdraw(self, conn: asyncpg.Connection) -> None:
        """At a clean stop: take back this relay's promise, so that producers notify again
        at once (another relay's longer promise stays)."""
        promised, self._promised = self._promised, None
        self._awake_until = float("-inf")
        if promised is not None:
            await conn.execute(sql.WITHDRAW_AWAKE, promised)

    async def _backoff(self, seconds: float) -> None:
        """A lost service's backoff: only a stop ends it early. A NOTIFY is no reason to try
        the service again: woken like a poll, the relay reconnected once per producer commit
        (830 connections in 10 s of a broker outage at 100 commits/s, against 4)."""
        await self._wait(seconds, self._stop_waiters)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a wake-up (not the timer, not a stop) ended it."""
        return await self._wait(seconds, self._waiters)

    async def _wait(self, seconds: float, waiters: set[anyio.Event]) -> bool:
        """Up to ``seconds``, or until ``stop()`` or what else sets an event of ``waiters``."""
        waiter = anyio.Event()
        waiters.add(waiter)
        try:
            if not self._stopping:
                with anyio.move_on_after(seconds):
                    await waiter.wait()
        finally:
            waiters.discard(waiter)
        return waiter.is_set() and not self._stopping

    async def prune_once(self, conn: asyncpg.Connection) -> int:
        """One bounded batch of published rows past the retention, and one of release audit
        rows past theirs, each in its own short transaction; returns the larger count (a
        full batch means: prune again at once)."""
        cfg = self.config
        async with conn.transaction():
            pruned = await outbox.prune(conn, cfg.retention_s, cfg.prune_batch)
        async with conn.transaction():
            audits = await outbox.prune_release_audit(conn, cfg.audit_retention_s, cfg.prune_batch)
        self.stats.pruned += pruned
        self.stats.pruned_audit += audits
        return max(pruned, audits)

    async def cycle(self, conn: asyncpg.Connection, publisher: Publisher) -> int:
        """Claim, publish and settle one batch; returns the number of rows claimed."""
        token = uuid.uuid4()
        # Claim and settle are one statement each: their own transactions (no BEGIN/COMMIT).
        rows = await outbox.claim(conn, token, self.config.claim_size, self.config.lease_s)
        self.stats.claims += 1
        if not rows:
            return 0
        previous = await self._previous_reasons(conn, rows)
        outcomes = await self._publish_batch(publisher, rows, previous)
        settled = await outbox.settle(conn, token, outcomes)
        if settled < len(outcomes):
            self._settle_lost(len(outcomes) - settled, len(outcomes))
        self.stats.cycles += 1
        return len(rows)

    def _settle_lost(self, lost: int, of: int) -> None:
        """The settle changed fewer rows than it was given: the token guard refused the rest,
        whose lease ran out before it (a stalled relay): another relay has claimed them, and
        publishes them again (at least once; the consumers' inbox absorbs the duplicate)."""
        self.stats.settle_lost += lost
        observe.settle_lost(lost)
        log.warning(
            "relay lease ran out before the settle of %d of %d rows: another relay claimed"
            " them and publishes them again; if publishing a batch takes this long, raise"
            " ACCORD_RELAY_LEASE_S (now %gs)",
            lost,
            of,
            self.config.lease_s,
        )

    async def _previous_reasons(
        self, conn: asyncpg.Connection, rows: Sequence[OutboxRow]
    ) -> dict[int, str]:
        """Why each retried row's previous attempt failed (its ``last_reason``), for the
        publish spans only: one read per batch that holds a retry, and none unless spans leave
        the process."""
        retried = [row.id for row in rows if row.attempts > 1]
        if not retried or not telemetry.exporting():
            return {}
        records = await conn.fetch(sql.PREVIOUS_REASONS, retried)
        return {r["id"]: r["last_reason"] for r in records}

    async def _publish_batch(
        self,
        publisher: Publisher,
        rows: Sequence[OutboxRow],
        previous: Mapping[int, str] | None = None,
    ) -> list[Settlement]:
        # Pipelined confirms: the whole batch in flight at once (DESIGN §11), a task per row
        # (aio-pika awaits each confirm inside its publish). The stdlib's TaskGroup rather
        # than anyio's, for this one hot spot: its tasks are cheaper, and the relay is
        # CPU-bound in Python (figures: docs/bench-log.md). It is as structured: a task that
        # fails cancels its siblings and the error propagates. aio-pika ties the relay to
        # asyncio anyway.
        outcomes: list[Settlement] = []
        async with asyncio.TaskGroup() as tg:
            for row in rows:
                reason = previous.get(row.id) if previous else None
                tg.create_task(self._publish_one(publisher, row, outcomes, reason))
        return outcomes

    async def _publish_one(
        self,
        publisher: Publisher,
        row: OutboxRow,
        outcomes: list[Settlement],
        previous_reason: str | None = None,
    ) -> None:
        publish_id = uuid.uuid4()
        event = row.event
        # start_span + use_span, as in enqueue: start_as_current_span without its two extra
        # generator-based context managers (cheaper per message). Exceptions are neither
        # recorded nor turned into an error status by it; a PublishFailed is noted below, and
        # is an error only when it is the row's last word (held), not when a retry follows.
        span = self._tracer.start_span(
            f"publish {self.config.exchange}",
            kind=SpanKind.PRODUCER,
            links=telemetry.links_from(row.trace),
            attributes={
                telemetry.ATTR_SYSTEM: telemetry.SYSTEM,
                telemetry.ATTR_OPERATION_TYPE: "send",
                telemetry.ATTR_OPERATION_NAME: "publish",
                telemetry.ATTR_DESTINATION: self.config.exchange,
                telemetry.ATTR_MESSAGE_ID: str(event.event_id),
                telemetry.ATTR_ROUTING_KEY: event.ce_type,
                telemetry.ATTR_TENANT: event.tenant,
                telemetry.ATTR_OPERATION_ID: event.operation_id,
                telemetry.ATTR_PUBLISH_ID: str(publish_id),
                telemetry.ATTR_PUBLISH_ATTEMPT: row.attempts,
            },
        )
        if previous_reason is not None:
            span.set_attribute(telemetry.ATTR_PREVIOUS_REASON, previous_reason)
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                if self._max_bytes and len(row.body) > self._max_bytes:
                    raise MessageTooLarge(size=len(row.body), limit=self._max_bytes)
                message = to_amqp(
                    event,
                    row.body,
                    digest=row.digest,
                    publish_id=str(publish_id),
                    source=self.config.source,
                    trace=row.trace,
                    enqueued_at=row.enqueued_at,
                )
                await publisher.publish(message, confirm_timeout_s=self.config.publish_timeout_s)
            except PublishFailed as exc:
                if isinstance(exc, PublishRefused) and self._refused is None:
                    # As a SIGTERM: every loop settles its batch (the rows keep why, and
                    # wait out no lease) and leaves; then run() raises it.
                    self._refused = exc
                    self.stop()
                settlement = self._failed(row, exc)
                span.set_attribute(telemetry.ATTR_RELAY_REASON, exc.reason)
                span.set_attribute(telemetry.ATTR_ERROR_TYPE, exc.reason)
                if settlement.state is OutboxState.HELD:
                    span.set_attribute(telemetry.ATTR_RELAY_OUTCOME, "held")
                    span.set_status(Status(StatusCode.ERROR, exc.reason))
                else:
                    span.set_attribute(telemetry.ATTR_RELAY_OUTCOME, "retry")
                outcomes.append(settlement)
                return
            span.set_attribute(telemetry.ATTR_RELAY_OUTCOME, "published")
        self.stats.published += 1
        observe.published(row.enqueued_at)
        outcomes.append(Settlement(row.id, OutboxState.PUBLISHED, publish_id=publish_id))

    def _failed(self, row: OutboxRow, exc: PublishFailed) -> Settlement:
        reason = exc.reason
        self.stats.failures[reason] = self.stats.failures.get(reason, 0) + 1
        limit = getattr(exc, "limit", None)
        if isinstance(limit, int) and reason == "oversize":
            self._max_bytes = limit  # the broker told us its limit: hold such rows up front
        # Returns in a row, this one included: a claim that timed out or was nacked before
        # says nothing of a binding (0048; before, every claim counted).
        permanent = exc.permanent or (
            isinstance(exc, Unroutable) and row.returns + 1 >= self.config.unroutable_attempts
        )
        observe.publish_failed(reason, permanent=permanent)
        log.warning(
            "publish failed: event_id=%s tenant=%s reason=%s attempt=%d permanent=%s",
            row.event.event_id,
            row.event.tenant,
            reason,
            row.attempts,
            permanent,
        )
        if permanent:
            self.stats.held += 1
            return Settlement(row.id, OutboxState.HELD, reason=reason)
        # The exponent is capped first: 2 ** 1025 overflows a float long before the cap.
        doubling = 2.0 ** min(row.attempts - 1, 30)
        delay = min(self.config.retry_max_s, self.config.retry_base_s * doubling)
        return Settlement(row.id, OutboxState.PENDING, reason=reason, delay_s=delay)

    async def _listen_loop(self) -> None:
        """Keep a LISTEN connection; any notification wakes the publish loop."""
        reconnect = self._reconnect("relay LISTEN")
        while True:
            # Every state of this loop waits on the outside (the database answering a connect,
            # a notification, a backoff): never stuck, whatever the wait's length.
            observe.idle("relay.listen")
            try:
                conn = await connect(self.config.pg_dsn, **self._pg_args)
            except DB_RETRY_LATER as exc:
                await anyio.sleep(reconnect.lost(exc))
                continue
            reconnect.up()
            try:
                await self._listen(conn)
            except DB_CONNECTION_LOST:
                pass  # the poll keeps the relay correct until LISTEN is back
            finally:
                await _close(conn)
            await anyio.sleep(self.config.poll_s)

    async def _listen(self, conn: asyncpg.Connection) -> None:
        lost = anyio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(sql.NOTIFY_CHANNEL, self.wake)
        await lost.wait()


async def _close(conn: asyncpg.Connection) -> None:
    # Shielded and bounded: it runs during shutdown, and the server may already be gone.
    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
        try:
            await conn.close()
        except DB_CONNECTION_LOST:
            conn.terminate()
