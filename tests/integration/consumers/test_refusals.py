"""One batch, one transaction: a statement PostgreSQL refuses poisons only its own message,
at once, and the valid messages of the same batch are applied and acknowledged (issue #16).

The batch is handed to ``BatchProcessor.process`` directly (deliveries recorded by a stand-in
for aio_pika's message), so it is certain that the good and the bad messages share one
transaction: the fast path fails, the savepoint path applies the rest.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from opentelemetry.trace import NoOpTracer

from accord.consumers import Consumer, Handlers, PoisonReason, TransientFailure
from accord.consumers.batch import BatchProcessor
from accord.consumers.errors import PrivilegeMissing
from accord.schemas import wire
from accord.schemas.events import Event
from tests.integration.consumers.support import CATALOG, report

DOCS = """
CREATE TABLE public.docs (
    operation_id text PRIMARY KEY,
    doc          jsonb NOT NULL CHECK (jsonb_typeof(doc) = 'object')
)
"""


@dataclass
class Delivered:
    """Stands in for aio_pika's incoming message: what the batch reads, and its settling."""

    body: bytes
    headers: dict[str, Any]
    message_id: str
    delivery_tag: int
    content_type: str = "application/json"
    routing_key: str = "report.accepted.v1"
    redelivered: bool = False
    settled: list[str] = field(default_factory=list)

    async def ack(self, multiple: bool = False) -> None:
        self.settled.append("ack-multiple" if multiple else "ack")

    async def nack(self, requeue: bool = True) -> None:
        # A retry must be a reject: from RabbitMQ 4.3 a nack is not counted as a failed
        # delivery, so a message always failing would never reach its delivery limit.
        self.settled.append("nack-requeue" if requeue else "nack")

    async def reject(self, requeue: bool = False) -> None:
        self.settled.append("requeue" if requeue else "reject")


def delivered(event: Event, tag: int) -> Delivered:
    body = json.dumps(event.payload).encode()
    msg = wire.to_amqp(event, body, digest=CATALOG.digest(event), publish_id=str(uuid.uuid4()))
    return Delivered(body, dict(msg.headers), msg.message_id, tag)


def with_doc(doc: str) -> Event:
    event = report()
    return event.model_copy(update={"payload": {**event.payload, "doc": doc}})


def processor(handlers: Handlers) -> BatchProcessor:
    return BatchProcessor(
        consumer=Consumer("report", CATALOG, 7 * 24 * 3600.0),
        handlers=handlers,
        tenants=frozenset({"acme"}),
        queue="t.report",
        delivery_limit=3,
        tracer=NoOpTracer(),
    )


def doc_handlers(failures: list[BaseException] | None = None) -> Handlers:
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def store(tx: Any, event: Event) -> None:
        if failures:
            raise failures.pop(0)
        await tx.execute(
            "INSERT INTO public.docs (operation_id, doc) VALUES ($1, $2::jsonb)",
            event.operation_id,
            event.payload["doc"],
        )

    return handlers


async def test_a_refused_statement_poisons_only_its_message_in_a_batch(
    pg: asyncpg.Connection,
) -> None:
    await pg.execute(DOCS)
    events = [
        with_doc('{"n": 1}'),
        with_doc('{"bad": "\\u0000"}'),  # 22P05: jsonb refuses the escape
        with_doc('{"n": 2}'),
        with_doc("[1]"),  # 23514: the CHECK refuses an array
        with_doc('{"n": 3}'),
        with_doc("{not json"),  # 22P02: not JSON at all
        with_doc('{"n": 4}'),
    ]
    messages = [delivered(e, tag) for tag, e in enumerate(events, start=1)]
    batch = processor(doc_handlers())
    await batch.process(pg, messages)  # type: ignore[arg-type]

    settled = [m.settled for m in messages]
    assert settled == [[], ["reject"], [], ["reject"], [], ["reject"], ["ack-multiple"]]
    assert (batch.stats.new, batch.stats.poisoned, batch.stats.retried) == (4, 3, 0)
    assert batch.stats.commits == 1  # the good four in one commit (the savepoint path)
    stored = await pg.fetch("SELECT operation_id FROM public.docs")
    assert {r["operation_id"] for r in stored} == {events[i].operation_id for i in (0, 2, 4, 6)}
    rows = await pg.fetch("SELECT reason, detail, message_id FROM consumers.poison ORDER BY id")
    assert [(r["message_id"], r["reason"], json.loads(r["detail"])["sqlstate"]) for r in rows] == [
        (messages[1].message_id, PoisonReason.DATA_EXCEPTION, "22P05"),
        (messages[3].message_id, PoisonReason.INTEGRITY_VIOLATION, "23514"),
        (messages[5].message_id, PoisonReason.DATA_EXCEPTION, "22P02"),
    ]
    inbox = await pg.fetch("SELECT operation_id FROM consumers.inbox")
    assert {r["operation_id"] for r in inbox} == {r["operation_id"] for r in stored}


async def test_an_event_dated_far_ahead_is_poisoned_in_future_and_the_batch_goes_on(
    pg: asyncpg.Connection,
) -> None:
    await pg.execute(DOCS)
    ahead = datetime.now(UTC) + timedelta(hours=2)  # a producer's clock two hours fast
    events = [
        with_doc('{"n": 1}'),
        with_doc('{"n": 2}').model_copy(update={"occurred_at": ahead}),
        with_doc('{"n": 3}'),
    ]
    messages = [delivered(e, tag) for tag, e in enumerate(events, start=1)]
    batch = processor(doc_handlers())
    await batch.process(pg, messages)  # type: ignore[arg-type]
    assert [m.settled for m in messages] == [[], ["reject"], ["ack-multiple"]]
    assert (batch.stats.new, batch.stats.poisoned) == (2, 1)
    rows = await pg.fetch("SELECT reason, message_id FROM consumers.poison")
    assert [(r["message_id"], r["reason"]) for r in rows] == [
        (messages[1].message_id, PoisonReason.IN_FUTURE)
    ]
    stored = {r["operation_id"] for r in await pg.fetch("SELECT operation_id FROM public.docs")}
    assert stored == {events[0].operation_id, events[2].operation_id}


async def test_a_read_only_server_holds_the_batch_and_charges_no_message(
    pg: asyncpg.Connection,
) -> None:
    """A server that takes no writes for a while (25006: a standby, a primary stepping down)
    is no message's fault: the batch waits and is applied again, nothing requeued or
    poisoned. Before, every message was requeued at once, again and again, until the
    broker's delivery limit dead-lettered sound ones with no record. Control below: a
    deadlock or a handler's own transient failure is still requeued."""
    await pg.execute(DOCS)
    refusals = [3]
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def store(tx: Any, event: Event) -> None:
        if refusals[0]:
            refusals[0] -= 1
            await tx.execute("SET LOCAL transaction_read_only = on")
        await tx.execute(
            "INSERT INTO public.docs (operation_id, doc) VALUES ($1, $2::jsonb)",
            event.operation_id,
            event.payload["doc"],
        )

    events = [with_doc('{"n": 1}'), with_doc('{"n": 2}')]
    messages = [delivered(e, tag) for tag, e in enumerate(events, start=1)]
    waits: list[float] = []
    batch = processor(handlers)

    async def wait(seconds: float) -> None:
        waits.append(seconds)

    batch.guard_wait = wait
    await batch.process(pg, messages)  # type: ignore[arg-type]
    assert [m.settled for m in messages] == [[], ["ack-multiple"]]
    assert (batch.stats.new, batch.stats.retried, batch.stats.poisoned) == (2, 0, 0)
    assert len(waits) == 3 and refusals == [0]
    assert await pg.fetchval("SELECT count(*) FROM public.docs") == 2


async def test_transient_database_failures_are_still_retried(pg: asyncpg.Connection) -> None:
    """Control: a serialization failure, a deadlock and a non-database error are requeued,
    not poisoned, while a valid message in the same batch is applied."""
    await pg.execute(DOCS)
    failures: list[BaseException] = [
        asyncpg.exceptions.SerializationError("could not serialize access"),
        asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
        TransientFailure("downstream unavailable"),
    ]
    events = [with_doc('{"n": 1}') for _ in range(4)]
    messages = [delivered(e, tag) for tag, e in enumerate(events, start=1)]
    # The fast path raises the first failure; the savepoint path the other two, then applies.
    batch = processor(doc_handlers(failures))
    await batch.process(pg, messages)  # type: ignore[arg-type]
    assert [m.settled for m in messages] == [["requeue"], ["requeue"], [], ["ack-multiple"]]
    assert (batch.stats.new, batch.stats.poisoned, batch.stats.retried) == (2, 0, 2)
    assert await pg.fetchval("SELECT count(*) FROM consumers.poison") == 0


LINKED = """
CREATE TABLE public.parents (id int PRIMARY KEY);
INSERT INTO public.parents VALUES (1);
CREATE TABLE public.children (
    operation_id text PRIMARY KEY,
    parent int NOT NULL REFERENCES public.parents DEFERRABLE INITIALLY DEFERRED
);
"""


def child_handlers() -> Handlers:
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def store(tx: Any, event: Event) -> None:
        await tx.execute(
            "INSERT INTO public.children (operation_id, parent) VALUES ($1, $2)",
            event.operation_id,
            int(event.payload["doc"]),
        )

    return handlers


async def test_a_refusal_at_commit_poisons_only_its_message_in_a_batch(
    pg: asyncpg.Connection,
) -> None:
    """A deferred constraint is checked at COMMIT, where no savepoint says whose write broke
    it: each message is then applied in a transaction of its own, so only the offender is
    poisoned (integrity_violation, at once) and the others are applied and acknowledged.
    Before, every message of the batch was requeued as a retry, and at the delivery limit
    the sound ones were poisoned beside it as retries_exhausted. Control: the same batch
    without the offender commits once."""
    await pg.execute(LINKED)
    first = [with_doc("1"), with_doc("1")]
    sound = [delivered(e, tag) for tag, e in enumerate(first, start=1)]
    batch = processor(child_handlers())
    await batch.process(pg, sound)  # type: ignore[arg-type]
    assert [m.settled for m in sound] == [[], ["ack-multiple"]]
    assert batch.stats.commits == 1

    events = [with_doc("1"), with_doc("2"), with_doc("1")]  # parent 2 does not exist
    messages = [delivered(e, tag) for tag, e in enumerate(events, start=3)]
    for message in messages:
        message.headers["x-delivery-count"] = 3  # at the limit: a retry would poison them all
    batch = processor(child_handlers())
    await batch.process(pg, messages)  # type: ignore[arg-type]
    assert [m.settled for m in messages] == [[], ["reject"], ["ack-multiple"]]
    assert (batch.stats.new, batch.stats.poisoned, batch.stats.retried) == (2, 1, 0)
    assert batch.stats.commits == 2  # each sound message in its own transaction
    rows = await pg.fetch("SELECT reason, detail, message_id FROM consumers.poison")
    assert [(r["message_id"], r["reason"], json.loads(r["detail"])["sqlstate"]) for r in rows] == [
        (messages[1].message_id, PoisonReason.INTEGRITY_VIOLATION, "23503")
    ]
    stored = {r["operation_id"] for r in await pg.fetch("SELECT operation_id FROM public.children")}
    assert stored == {e.operation_id for e in (*first, events[0], events[2])}
    inbox = {r["operation_id"] for r in await pg.fetch("SELECT operation_id FROM consumers.inbox")}
    assert inbox == stored


async def test_a_missing_grant_stops_the_consumer_in_a_batch_too(
    pg: asyncpg.Connection, pg_dsn: str
) -> None:
    """A handler's write the consumer's role may not make (42501) is the process's grants,
    not the messages: the batch stops with PrivilegeMissing, acknowledges nothing, requeues
    nothing as a retry and poisons nothing, whether the message came alone (the control)
    or with others. Before, a batch of two caught it in its savepoint pass and requeued
    every message as a retry, and at the delivery limit poisoned them as retries_exhausted."""
    await pg.execute("CREATE TABLE public.ungranted (operation_id text)")
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def store(tx: Any, event: Event) -> None:
        await tx.execute("INSERT INTO public.ungranted VALUES ($1)", event.operation_id)

    consumer = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        for n in (1, 2, 3):
            messages = [delivered(report(), tag) for tag in range(1, n + 1)]
            for message in messages:
                message.headers["x-delivery-count"] = 3
            with pytest.raises(PrivilegeMissing) as info:
                await processor(handlers).process(consumer, messages)  # type: ignore[arg-type]
            assert "ungranted" in info.value.fields["detail"]
            assert [m.settled for m in messages] == [[]] * n
    finally:
        await consumer.close()
    assert await pg.fetchval("SELECT count(*) FROM consumers.poison") == 0
    assert await pg.fetchval("SELECT count(*) FROM consumers.inbox") == 0


WATCHED = """
CREATE TABLE public.watched (operation_id text PRIMARY KEY);
CREATE TABLE public.watch_log (operation_id text);
GRANT INSERT ON public.watched TO accord_consumer;
CREATE FUNCTION public.log_watched() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.watch_log VALUES (NEW.operation_id); RETURN NULL; END $$;
"""
DEFERRED_LOG = """
CREATE CONSTRAINT TRIGGER watched_logged AFTER INSERT ON public.watched
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.log_watched()
"""


async def test_a_missing_grant_met_at_commit_stops_the_consumer_too(
    pg: asyncpg.Connection, pg_dsn: str
) -> None:
    """A deferred trigger writes, at COMMIT, to a table the consumer's role may not write:
    the batch stops with PrivilegeMissing there too, nothing settled. Control: without the
    trigger the same batch commits."""
    await pg.execute(WATCHED)
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def store(tx: Any, event: Event) -> None:
        await tx.execute("INSERT INTO public.watched VALUES ($1)", event.operation_id)

    consumer = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        control = [delivered(report(), tag) for tag in (1, 2)]
        await processor(handlers).process(consumer, control)  # type: ignore[arg-type]
        assert [m.settled for m in control] == [[], ["ack-multiple"]]
        await pg.execute(DEFERRED_LOG)
        messages = [delivered(report(), tag) for tag in (3, 4)]
        with pytest.raises(PrivilegeMissing):
            await processor(handlers).process(consumer, messages)  # type: ignore[arg-type]
        assert [m.settled for m in messages] == [[], []]
    finally:
        await consumer.close()
    assert await pg.fetchval("SELECT count(*) FROM consumers.poison") == 0
