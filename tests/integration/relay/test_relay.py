"""The relay on real PostgreSQL and RabbitMQ: nothing committed is lost, nothing else sent."""

from __future__ import annotations

import contextlib
import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import anyio
import asyncpg
import pytest
from cloudevents.core.bindings.rabbitmq import RabbitMQMessage, from_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, ConfigDict

from accord.demo.catalog import demo_catalog
from accord.relay import Relay, enqueue_joined, outbox, prepare, sql
from accord.relay.errors import PublishTimeout
from accord.relay.publisher import amqp_publisher
from accord.schemas.errors import ServiceUnavailable
from accord.schemas.events import Catalog, Event, EventType, encode_payload
from accord.schemas.topology import Topology
from accord.schemas.wire import WireMessage, to_amqp
from tests.integration.consumers.support import CuttableProxy
from tests.integration.relay import helpers
from tests.integration.relay.test_enqueue import memory_exporter
from tests.support import DEMO_CATALOG, enqueue, scaled, wait_for


class _Rollback(Exception):
    pass


async def _write(conn: asyncpg.Connection, form: str, n: int, event: Event) -> None:
    """The domain row and its event, in the caller's transaction, by either enqueue form
    (``prepared``: the joined form with the event prepared by ``relay.prepare``)."""
    if form == "plain":
        await conn.execute("INSERT INTO domain (n) VALUES ($1)", n)
        await enqueue(conn, event)
    else:
        statement = "INSERT INTO domain (n) VALUES ($1) RETURNING n"
        ready = prepare(event, catalog=DEMO_CATALOG) if form == "prepared" else event
        done = await enqueue_joined(conn, statement, n, event=ready, catalog=DEMO_CATALOG)
        assert done.outbox_id is not None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("form", ["plain", "joined", "prepared"])
async def test_committed_events_all_arrive_and_rolled_back_never_do(
    pg_dsn: str, pg: asyncpg.Connection, amqp_url: str, topo: Topology, form: str
) -> None:
    total = scaled(2000, 20000)
    rng = random.Random(7)
    plan = [(n, rng.random() < 0.3) for n in range(total)]
    committed: list[str] = []
    rolled_back: list[str] = []
    await pg.execute("CREATE TABLE domain (n int PRIMARY KEY)")

    async def producer(share: list[tuple[int, bool]]) -> None:
        conn = await asyncpg.connect(pg_dsn)
        try:
            for n, rollback in share:
                event = helpers.make_event(n)
                try:
                    async with conn.transaction():
                        await _write(conn, form, n, event)
                        if rollback:
                            raise _Rollback
                    committed.append(str(event.event_id))
                except _Rollback:
                    rolled_back.append(str(event.event_id))
        finally:
            await conn.close()

    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        async with anyio.create_task_group() as producers:
            for k in range(8):
                producers.start_soon(producer, plan[k::8])
        await helpers.wait_until_settled(pg_dsn, expect_published=len(committed), within_s=60)
        relay.stop()
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert 0.25 * total < len(rolled_back) < 0.35 * total
    assert set(counts) == set(committed)  # every commit arrived, no rollback ever did
    assert not set(counts) & set(rolled_back)
    assert relay.stats.promises >= 1  # busy, it promised to poll: most enqueues did not NOTIFY
    # No crash here: a duplicate needs a publish that did not count (e.g. a confirm timeout
    # on a loaded broker), and each such failure can cause at most one.
    assert sum(counts.values()) - len(counts) <= sum(relay.stats.failures.values())


@pytest.mark.parametrize("form", ["plain", "joined", "prepared"])
async def test_late_commit_with_lower_id_is_still_published(
    pg_dsn: str, amqp_url: str, topo: Topology, form: str
) -> None:
    late, early = helpers.make_event(1), helpers.make_event(2)
    slow = await asyncpg.connect(pg_dsn)
    await slow.execute("CREATE TABLE IF NOT EXISTS domain (n int PRIMARY KEY)")
    slow_tx = slow.transaction()
    await slow_tx.start()
    await _write(slow, form, 1, late)  # takes the lower id, commits last
    late_id = await slow.fetchval("SELECT id FROM relay.outbox WHERE event_id = $1", late.event_id)
    early_id = (await helpers.enqueue_outbox_ids(pg_dsn, [early]))[0]
    assert late_id < early_id
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=0.05))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.wait_until_settled(pg_dsn, expect_published=1, within_s=20)
        await slow_tx.commit()  # the relay has already published a higher id
        await helpers.wait_until_settled(pg_dsn, expect_published=2, within_s=20)
        relay.stop()
    await slow.close()
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(late.event_id), str(early.event_id)}


@pytest.mark.timeout(120)
async def test_two_relays_at_once_lose_nothing(pg_dsn: str, amqp_url: str, topo: Topology) -> None:
    total = scaled(1000, 10000)
    ids = await helpers.enqueue_committed(pg_dsn, [helpers.make_event(n) for n in range(total)])
    relays = [Relay(helpers.config(pg_dsn, amqp_url, topo, batch=50)) for _ in range(2)]
    await helpers.run_until_settled(relays, pg_dsn, total, within_s=60)
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(i) for i in ids}
    # SKIP LOCKED: each row is claimed by one relay at a time, so a duplicate needs a
    # publish that did not count (a confirm timeout on a loaded broker).
    failures = sum(sum(r.stats.failures.values()) for r in relays)
    assert sum(counts.values()) - len(counts) <= failures
    assert all(r.stats.published > 0 for r in relays)


class AuditNotedV1(BaseModel):
    model_config = ConfigDict(frozen=True)
    note: str


def catalog_with_unbound_type() -> Catalog:
    catalog = demo_catalog()
    catalog.register(EventType("audit.noted", 1, AuditNotedV1))
    return catalog


async def test_unroutable_event_is_held_and_never_blocks_the_rows_behind(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    catalog = catalog_with_unbound_type()
    unbound = Event(
        tenant="a", operation_id="o", type="audit.noted", version=1, payload={"note": "n"}
    )
    behind = [helpers.make_event(n) for n in range(5)]
    conn = await asyncpg.connect(pg_dsn)
    async with conn.transaction():
        await enqueue(conn, unbound, catalog=catalog)  # the head of the outbox
        for event in behind:
            await enqueue(conn, event)
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, unroutable_attempts=3))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.wait_until_settled(pg_dsn, expect_published=5, within_s=20)
        relay.stop()
    row = await conn.fetchrow("SELECT * FROM relay.outbox WHERE event_id = $1", unbound.event_id)
    assert row["state"] == "held" and row["last_reason"] == "unroutable"
    assert row["published_at"] is None and row["attempts"] == 3
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(e.event_id) for e in behind}  # control: the rest went through
    # An operator can release it once a binding exists; it is then eligible again.
    async with conn.transaction():
        released = await outbox.release_held(
            conn, "a", [unbound.event_id], who="test", evidence="binding added"
        )
        assert len(released) == 1
    assert (
        await conn.fetchval("SELECT state FROM relay.outbox WHERE event_id = $1", unbound.event_id)
        == "pending"
    )
    await conn.close()


@pytest.mark.parametrize("other", ["unroutable", "routable"])
async def test_two_tenants_events_with_one_id_keep_their_own_outcomes(
    pg_dsn: str, amqp_url: str, topo: Topology, other: str
) -> None:
    """An event id is unique within a tenant, not across tenants. RabbitMQ's return of an
    unroutable publish is matched to its publish by message id: with two publishes of one id
    in flight on the channel, the return was charged to the other, and the unroutable row was
    marked published though no queue had it (lost), the routable one counted unroutable and
    sent twice. Each now keeps its own: the unroutable row is held, the routable one
    published once. (Control, routable: only the unbound type is held.)"""
    catalog = catalog_with_unbound_type()
    shared = uuid.uuid4()
    unbound = Event(tenant="b", operation_id="o", type="audit.noted", version=1,
                    payload={"note": "n"}, event_id=shared)  # fmt: skip
    second = (
        Event(
            tenant="a",
            operation_id="o",
            type="audit.noted",
            version=1,
            payload={"note": "n"},
            event_id=shared,
        )
        if other == "unroutable"
        else helpers.make_event(1, tenant="a").model_copy(update={"event_id": shared})
    )
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():  # one claim takes both
            await enqueue(conn, unbound, catalog=catalog)
            await enqueue(conn, second, catalog=catalog)
        relay = Relay(helpers.config(pg_dsn, amqp_url, topo, unroutable_attempts=3))
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            routed = 1 if other == "routable" else 0
            await helpers.wait_until_settled(pg_dsn, expect_published=routed, within_s=20)
            relay.stop()
        states = dict(await conn.fetch("SELECT tenant, state FROM relay.outbox"))
    finally:
        await conn.close()
    if other == "unroutable":
        assert states == {"a": "held", "b": "held"}
    else:
        assert states == {"a": "published", "b": "held"}
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert counts == ({str(shared): 1} if other == "routable" else {})


async def test_forced_nack_leaves_the_row_unpublished_and_it_is_retried(
    pg_dsn: str, amqp_url: str, topo: Topology, broker_names: object
) -> None:
    amqp = await aio_pika.connect(amqp_url)
    channel = await amqp.channel()
    # control: without the rejecting queue, a publish is confirmed and marked
    await helpers.enqueue_committed(pg_dsn, [helpers.make_event(0)])
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, retry_max_s=0.2))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.wait_until_settled(pg_dsn, expect_published=1, within_s=20)
        # A full classic queue with reject-publish makes the broker nack what routes to it.
        blocker = await channel.declare_queue(
            broker_names.queue("blocker"),  # type: ignore[attr-defined]
            arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
        )
        await blocker.bind(topo.exchange, routing_key="report.accepted.v1")
        event = helpers.make_event(1)
        await helpers.enqueue_committed(pg_dsn, [event])
        with anyio.fail_after(20):
            while relay.stats.failures.get("nacked", 0) < 3:  # noqa: ASYNC110 (another task's counter)
                await anyio.sleep(0.05)
        row = await helpers.fetch_row(pg_dsn, event.event_id)
        assert row["state"] == "pending" and row["last_reason"] == "nacked"
        assert row["attempts"] >= 3 and row["published_at"] is None
        await blocker.delete()
        await helpers.wait_until_settled(pg_dsn, expect_published=2, within_s=20)
        relay.stop()
    await amqp.close()
    row = await helpers.fetch_row(pg_dsn, event.event_id)
    assert row["state"] == "published" and row["last_reason"] == "nacked"
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert counts[str(event.event_id)] >= 1


async def test_publish_span_links_to_create_and_traceparent_travels(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    exporter = memory_exporter()
    event = helpers.make_event(1)
    await helpers.enqueue_committed(pg_dsn, [event])
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    await helpers.run_until_settled([relay], pg_dsn, 1, within_s=20)
    spans = exporter.get_finished_spans()
    create = next(s for s in spans if s.name.startswith("create "))
    publish = next(s for s in spans if s.name == f"publish {topo.exchange}")
    assert [link.context.span_id for link in publish.links] == [create.context.span_id]
    assert publish.kind is SpanKind.PRODUCER and create.kind is SpanKind.PRODUCER
    assert publish.attributes is not None
    assert publish.attributes["messaging.system"] == "rabbitmq"
    assert publish.attributes["messaging.operation.type"] == "send"
    assert publish.attributes["messaging.operation.name"] == "publish"
    assert publish.attributes["messaging.destination.name"] == topo.exchange
    assert publish.attributes["messaging.rabbitmq.destination.routing_key"] == event.ce_type
    assert publish.attributes["messaging.message.id"] == str(event.event_id)
    assert publish.attributes["accord.operation_id"] == event.operation_id
    message = await helpers.get_one(amqp_url, topo.queue("report"))
    traceparent = message.headers["traceparent"]
    assert isinstance(traceparent, str)
    assert traceparent.split("-")[1:3] == [
        format(create.context.trace_id, "032x"),
        format(create.context.span_id, "016x"),
    ]
    assert message.message_id == str(event.event_id)
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT


async def test_a_message_the_relay_published_reads_with_the_cloudevents_sdk(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """Binary-mode CloudEvents as the broker delivered it (headers and properties after the
    round trip through RabbitMQ), read by the official SDK's RabbitMQ binding."""
    event = helpers.make_event(7)
    await helpers.enqueue_committed(pg_dsn, [event])
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    await helpers.run_until_settled([relay], pg_dsn, 1, within_s=20)
    message = await helpers.get_one(amqp_url, topo.queue("report"))
    assert message.content_type is not None
    headers = {k: v for k, v in message.headers.items() if isinstance(v, str)}
    # the ce- attributes arrive as strings; the quorum queue adds x-delivery-count, an integer
    assert {k for k in message.headers if k.startswith("ce-")} <= set(headers), message.headers
    ce = from_binary(
        RabbitMQMessage(headers, message.content_type, message.body), JSONFormat(), CloudEvent
    )
    assert (ce.get_id(), ce.get_type(), ce.get_specversion()) == (
        str(event.event_id),
        event.ce_type,
        "1.0",
    )
    assert ce.get_extension("tenantid") == event.tenant
    assert ce.get_extension("operationid") == event.operation_id
    assert ce.get_data() == event.payload


async def test_stale_lease_is_reclaimed_and_republish_is_byte_identical(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    event = helpers.make_event(1)
    await helpers.enqueue_committed(pg_dsn, [event])
    dead = Relay(helpers.config(pg_dsn, amqp_url, topo, lease_s=1.0, publish_timeout_s=0.5))
    conn = await asyncpg.connect(pg_dsn)
    token = uuid.uuid4()
    async with conn.transaction():
        rows = await outbox.claim(conn, token, 10, 1.0)
    assert len(rows) == 1
    async with amqp_publisher(amqp_url, topo.exchange) as publisher:
        outcomes = await dead._publish_batch(publisher, rows)  # published, then "dies"
    assert outcomes[0].state == "published"
    live = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=0.1))
    async with anyio.create_task_group() as tg:
        tg.start_soon(live.run)
        await helpers.wait_until_settled(pg_dsn, expect_published=1, within_s=20)
        live.stop()
    async with conn.transaction():  # the dead relay's late settle is a no-op
        assert await outbox.settle(conn, token, outcomes) == 0
    await conn.close()
    first = await helpers.get_one(amqp_url, topo.queue("report"))
    second = await helpers.get_one(amqp_url, topo.queue("report"))
    assert first.body == second.body and first.message_id == second.message_id
    assert first.headers["publish-id"] != second.headers["publish-id"]
    strip = lambda h: {k: v for k, v in h.items() if k != "publish-id"}  # noqa: E731
    assert strip(first.headers) == strip(second.headers)
    assert json.loads(first.body) == event.payload


async def test_published_rows_are_pruned_in_bounded_batches(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    await helpers.enqueue_committed(pg_dsn, [helpers.make_event(n) for n in range(25)])
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    await helpers.run_until_settled([relay], pg_dsn, 25, within_s=20)
    conn = await asyncpg.connect(pg_dsn)
    async with conn.transaction():
        await enqueue(conn, helpers.make_event(99))  # pending: never pruned
    pruner = Relay(helpers.config(pg_dsn, amqp_url, topo, retention_s=3600, prune_batch=10))
    assert await pruner.prune_once(conn) == 0  # control: inside the retention window
    pruner = Relay(helpers.config(pg_dsn, amqp_url, topo, retention_s=0, prune_batch=10))
    assert [await pruner.prune_once(conn) for _ in range(4)] == [10, 10, 5, 0]
    assert await conn.fetchval("SELECT count(*) FROM relay.outbox") == 1
    await conn.close()


async def enqueue_silently(dsn: str, event: Event) -> None:
    """Commit an outbox row exactly as ``enqueue`` writes it, minus its NOTIFY (test-only)."""
    silent = sql.ENQUEUE.replace(f", {sql.WAKE}", "")
    assert silent != sql.ENQUEUE
    conn = await asyncpg.connect(dsn)
    try:
        body = encode_payload(event, 262_144)
        digest = demo_catalog().digest(event)
        await conn.execute(silent, *outbox.enqueue_args(event, digest, body, None))
    finally:
        await conn.close()


LISTENING = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
)


async def _relay_listens(dsn: str) -> None:
    """Until a relay's LISTEN connection is up."""

    async def listening() -> bool:
        return bool(await helpers.pg_value(dsn, LISTENING))

    await wait_for(listening, within=20)


@pytest.mark.timeout(60)
async def test_notify_wakes_the_relay_and_polling_finds_what_no_notify_announced(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    poll_s = 5.0
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=poll_s))
    first_silent, loud, second_silent = (helpers.make_event(n) for n in range(3))

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        # listening, then idle: found nothing, waits for a NOTIFY or the poll
        await _relay_listens(pg_dsn)
        await anyio.sleep(0.5)
        # control: a row without a NOTIFY is not seen before the next poll
        await enqueue_silently(pg_dsn, first_silent)
        await anyio.sleep(1.0)
        assert (await helpers.fetch_row(pg_dsn, first_silent.event_id))["state"] == "pending"
        # the NOTIFY of a committed enqueue wakes the relay long before the poll (5 s)
        started = anyio.current_time()
        await helpers.enqueue_committed(pg_dsn, [loud])
        await helpers.wait_until_settled(pg_dsn, expect_published=2, within_s=poll_s - 1.5)
        assert anyio.current_time() - started < poll_s - 1.5
        # polling remains the truth: a row no NOTIFY announced is published by the poll
        await enqueue_silently(pg_dsn, second_silent)
        await helpers.wait_until_settled(pg_dsn, expect_published=3, within_s=poll_s + 5)
        relay.stop()
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(e.event_id) for e in (first_silent, loud, second_silent)}


@pytest.mark.timeout(60)
async def test_one_notify_wakes_one_loop_and_costs_one_claim(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    poll_s = 30.0
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=poll_s))
    assert relay.config.loops == 2  # two loops asleep: a NOTIFY could wake either or both

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await _relay_listens(pg_dsn)
        await anyio.sleep(0.5)  # each loop claimed once at its start, found nothing, sleeps
        before = relay.stats.claims
        for n in range(3):
            started = anyio.current_time()
            await helpers.enqueue_committed(pg_dsn, [helpers.make_event(n)])
            # control: the NOTIFY woke a loop, long before the poll
            await helpers.wait_until_settled(pg_dsn, expect_published=n + 1, within_s=10)
            assert anyio.current_time() - started < 10
            await anyio.sleep(0.2)
        # one claim per NOTIFY: the loop it woke took the row; the other slept on
        assert relay.stats.claims - before == 3
        relay.stop()
    assert relay.stats.published == 3


async def _commit_spaced(pg_dsn: str, events: list[Event], gap_s: float) -> None:
    """Each event in its own committed transaction, ``gap_s`` apart."""
    for event in events:
        await helpers.enqueue_committed(pg_dsn, [event])
        await anyio.sleep(gap_s)


@pytest.mark.timeout(60)
async def test_a_woken_relay_lingers_so_events_committed_meanwhile_share_one_claim(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """The control first: without a linger, a NOTIFY wakes the relay into a claim at once, so
    events committed 100 ms apart take more than one. Lingering 1.5 s after the wake-up, the
    same events share one claim, publish and settle, and none is lost."""
    gap_s, count = 0.1, 5
    # poll_s far above the test: only the NOTIFYs wake the relay.
    for round_, linger_s in enumerate((0.0, 1.5)):
        relay = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=30.0, linger_s=linger_s))
        events = [helpers.make_event(n) for n in range(count)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            await _relay_listens(pg_dsn)
            await anyio.sleep(0.5)  # and asleep: found nothing
            claims_idle = relay.stats.claims
            await _commit_spaced(pg_dsn, events, gap_s)
            published = count * (round_ + 1)  # the outbox keeps the earlier round's rows
            await helpers.wait_until_settled(pg_dsn, expect_published=published, within_s=20)
            relay.stop()
        counts = await helpers.drain(amqp_url, topo.queue("report"))
        assert set(counts) == {str(e.event_id) for e in events}, f"linger {linger_s}"
        if linger_s:
            assert relay.stats.cycles == 1, relay.stats
        else:
            assert relay.stats.cycles > 1, relay.stats
        assert relay.stats.claims - claims_idle >= relay.stats.cycles


@pytest.mark.timeout(60)
async def test_notifies_during_a_linger_ride_the_lingering_claim(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """Five events committed one after another, each with its NOTIFY, while the loop the
    first one woke lingers: that loop's one claim, after the linger, takes all five, and the
    other loop sleeps on (woken, it would linger and claim what the first had taken or would
    take). Control: the first NOTIFY wakes a loop long before the poll. Without the rule the
    later NOTIFYs cost three claims more (measured when it was written)."""
    poll_s, linger_s = 30.0, 1.0
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=poll_s, linger_s=linger_s))
    assert relay.config.loops == 2

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await _relay_listens(pg_dsn)
        await anyio.sleep(0.5)  # each loop claimed once at its start, found nothing, sleeps
        before = relay.stats.claims
        started = anyio.current_time()
        await helpers.enqueue_committed(pg_dsn, [helpers.make_event(n) for n in range(5)])
        assert anyio.current_time() - started < linger_s / 2  # all five within the linger
        await helpers.wait_until_settled(pg_dsn, expect_published=5, within_s=10)
        assert anyio.current_time() - started < 10  # control: woken, not polled
        await anyio.sleep(0.2)
        assert relay.stats.claims - before == 1
        assert relay.stats.cycles == 1
        relay.stop()
    assert relay.stats.published == 5


# -- the awake promise: a busy relay polls, and enqueues skip their NOTIFY (migration 0030) ---

PROMISED = "SELECT until > now() FROM relay.awake"
RAN_OUT = "SELECT until < now() FROM relay.awake"


async def _notified(pg_dsn: str, form: str, n: int) -> bool:
    """Commit one domain row and its event by ``form``; True if its NOTIFY came."""
    listener = await asyncpg.connect(pg_dsn)
    came = anyio.Event()
    await listener.add_listener(sql.NOTIFY_CHANNEL, lambda *_: came.set())
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            await _write(conn, form, n, helpers.make_event(n))
        with anyio.move_on_after(0.5):
            await came.wait()
        return came.is_set()
    finally:
        await conn.close()
        await listener.close()


@pytest.mark.parametrize("form", ["plain", "joined"])
async def test_an_enqueue_skips_its_notify_only_while_a_relay_promised_to_poll(
    pg_dsn: str, pg: asyncpg.Connection, form: str
) -> None:
    """No promise: the NOTIFY comes (control). A promise with ten seconds to run: none. One
    with less than the margin left: it comes again (the transaction may commit after the
    promise ran out, when no relay polls any more)."""
    await pg.execute("CREATE TABLE domain (n int PRIMARY KEY)")
    assert await pg.fetchval("SELECT until = '-infinity' FROM relay.awake")  # as migrated
    assert await _notified(pg_dsn, form, 1)
    await pg.execute("UPDATE relay.awake SET until = now() + interval '10 s'")
    assert not await _notified(pg_dsn, form, 2)
    margin = sql.AWAKE_MARGIN_S / 2
    await pg.execute(f"UPDATE relay.awake SET until = now() + interval '{margin} s'")
    assert await _notified(pg_dsn, form, 3)


@pytest.mark.timeout(60)
async def test_a_busy_relay_promises_to_poll_keeps_it_and_withdraws_it_at_its_stop(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """A claim of several rows makes the relay promise to poll; while the promise runs, a
    row no NOTIFY announced is published at once (the poll is 30 s). Control: once the
    promise ran out the same row waits for the poll. Three rounds: the NOTIFY that brings
    the batch wakes either loop, and whichever claims it, one loop must poll. A relay never
    promising (awake_s 0) leaves relay.awake alone; a clean stop takes the promise back."""
    awake_s, poll_s = 1.0, 30.0
    never = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=poll_s, awake_s=0))
    await helpers.enqueue_committed(pg_dsn, [helpers.make_event(n) for n in range(10)])
    await helpers.run_until_settled([never], pg_dsn, 10, within_s=20)
    assert never.stats.promises == 0 and not await helpers.pg_value(pg_dsn, PROMISED)

    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=poll_s, awake_s=awake_s))
    published = 10
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await _relay_listens(pg_dsn)
        await anyio.sleep(0.3)  # idle: each loop claimed once, found nothing, sleeps
        for round_ in range(3):
            first = 100 * (round_ + 1)
            batch = [helpers.make_event(n) for n in range(first, first + 10)]
            await helpers.enqueue_committed_together(pg_dsn, batch)
            published += 10
            await helpers.wait_until_settled(pg_dsn, expect_published=published, within_s=10)
            assert relay.stats.promises == round_ + 1 and await helpers.pg_value(pg_dsn, PROMISED)
            # promised: a row without a NOTIFY is found by the relay's poll at its linger
            started = anyio.current_time()
            await enqueue_silently(pg_dsn, helpers.make_event(first + 10))
            published += 1
            await helpers.wait_until_settled(
                pg_dsn, expect_published=published, within_s=awake_s / 2
            )
            assert anyio.current_time() - started < awake_s / 2
            # control: the promise ran out (a claim of one row renews nothing); the next row
            # without a NOTIFY waits for the poll
            await wait_for(lambda: helpers.pg_value(pg_dsn, RAN_OUT), within=awake_s + 2)
            await anyio.sleep(0.2)
            late = helpers.make_event(first + 11)
            await enqueue_silently(pg_dsn, late)
            await anyio.sleep(1.0)
            assert (await helpers.fetch_row(pg_dsn, late.event_id))["state"] == "pending"
            # and the next enqueue notifies again, which wakes the relay for both
            await helpers.enqueue_committed(pg_dsn, [helpers.make_event(first + 12)])
            published += 2
            await helpers.wait_until_settled(pg_dsn, expect_published=published, within_s=10)
        # promise again, then a clean stop takes it back
        await helpers.enqueue_committed_together(
            pg_dsn, [helpers.make_event(n) for n in range(10, 20)]
        )
        await helpers.wait_until_settled(pg_dsn, expect_published=published + 10, within_s=10)
        assert relay.stats.promises == 4 and await helpers.pg_value(pg_dsn, PROMISED)
        relay.stop()
    assert not await helpers.pg_value(pg_dsn, PROMISED)


@pytest.mark.timeout(60)
async def test_a_relay_whose_role_cannot_promise_publishes_everything_and_says_why(
    pg_dsn: str, pg: asyncpg.Connection, amqp_url: str, topo: Topology,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The promise is an optimisation: a role without its grant (this database's relay
    role, its UPDATE on relay.awake taken back here) gets an error logged once, naming the
    grant, and the relay publishes on, by NOTIFY and poll. Control: the same batches under
    the granted role promise."""
    batches = [[helpers.make_event(100 * b + n) for n in range(10)] for b in range(4)]
    for granted, pair in ((True, batches[:2]), (False, batches[2:])):
        if not granted:
            await pg.execute("REVOKE UPDATE (until) ON relay.awake FROM accord_relay")
        relay = Relay(helpers.config(pg_dsn, amqp_url, topo, pg_role="accord_relay"))
        caplog.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            for batch in pair:
                await helpers.enqueue_committed_together(pg_dsn, batch)
                done = 10 * (batches.index(batch) + 1)
                await helpers.wait_until_settled(pg_dsn, expect_published=done, within_s=10)
            relay.stop()
        refusals = [r for r in caplog.records if "cannot promise to poll" in r.getMessage()]
        if granted:
            assert relay.stats.promises >= 1 and not refusals
        else:
            assert relay.stats.promises == 0 and relay.stats.published == 20
            assert len(refusals) == 1 and "GRANT" in refusals[0].getMessage().upper()
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(e.event_id) for batch in batches for e in batch}


@pytest.mark.timeout(60)
async def test_a_relay_stopping_leaves_another_relays_longer_promise(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """Another relay promised for a minute (written by hand); this one, busy, promises for
    a second, which does not shorten it, and at its stop leaves it in force. (The control,
    a relay taking back its own promise, is the busy relay's test above.)"""
    await helpers.pg_value(pg_dsn, "UPDATE relay.awake SET until = now() + interval '60 s'")
    longer = await helpers.pg_value(pg_dsn, "SELECT until FROM relay.awake")
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, awake_s=1.0))
    await helpers.enqueue_committed_together(pg_dsn, [helpers.make_event(n) for n in range(10)])
    await helpers.run_until_settled([relay], pg_dsn, 10, within_s=20)
    assert relay.stats.promises == 1
    assert await helpers.pg_value(pg_dsn, "SELECT until FROM relay.awake") == longer


@pytest.mark.timeout(60)
async def test_a_promise_no_relay_keeps_delays_an_event_by_one_poll_and_loses_nothing(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """A promise left by a relay that died (written by hand, a minute long): enqueues do not
    NOTIFY, and another relay, which did not promise, finds their rows at its poll."""
    poll_s = 1.0
    await helpers.pg_value(pg_dsn, "UPDATE relay.awake SET until = now() + interval '60 s'")
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, poll_s=poll_s, awake_s=0))
    events = [helpers.make_event(n) for n in range(3)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await _relay_listens(pg_dsn)
        for event in events:
            started = anyio.current_time()
            await helpers.enqueue_committed(pg_dsn, [event])
            await helpers.wait_until_settled(pg_dsn, expect_published=events.index(event) + 1,
                                             within_s=poll_s + 2)  # fmt: skip
            assert anyio.current_time() - started < poll_s + 2
        relay.stop()
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(e.event_id) for e in events}


@pytest.mark.timeout(60)
async def test_a_promise_that_fails_for_another_reason_is_tried_again(
    pg_dsn: str, pg: asyncpg.Connection, amqp_url: str, topo: Topology,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Only a missing grant ends a relay's promises. A promise that fails otherwise (here
    its UPDATE of relay.awake waits past this database's lock_timeout while another session
    holds the row) skips that promise only: the relay publishes on by NOTIFY, and promises
    again once the row is free. Before, any error ended the promises until a restart, with
    a message naming a grant that was not missing."""
    database = await pg.fetchval("SELECT current_database()")
    await pg.execute(f"ALTER DATABASE \"{database}\" SET lock_timeout = '200ms'")
    holder = await asyncpg.connect(pg_dsn)
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.execute("SELECT * FROM relay.awake FOR UPDATE")
        relay = Relay(helpers.config(pg_dsn, amqp_url, topo, pg_role="accord_relay"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            first = [helpers.make_event(n) for n in range(40)]
            await helpers.enqueue_committed_together(pg_dsn, first)
            await helpers.wait_until_settled(pg_dsn, expect_published=40, within_s=10)
            await anyio.sleep(0.6)  # past the lock_timeout of the promise after that claim
            assert relay.stats.promises == 0
            await hold.rollback()  # the row is free again
            second = [helpers.make_event(n) for n in range(40, 80)]
            await helpers.enqueue_committed_together(pg_dsn, second)
            await helpers.wait_until_settled(pg_dsn, expect_published=80, within_s=10)
            relay.stop()
    finally:
        await holder.close()
    assert relay.stats.promises >= 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("this promise to poll failed" in m for m in messages)
    assert not any("cannot promise to poll" in m for m in messages)


def urlsplit_host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def _wire(event: Event) -> WireMessage:
    return to_amqp(event, encode_payload(event), digest="d" * 64, publish_id=str(uuid.uuid4()))


async def test_a_publish_that_times_out_ends_the_broker_session(
    amqp_url: str, topo: Topology
) -> None:
    """A broker that stops reading without blocking the connection (a frozen node, flow
    control) times every publish out, and each row's retry on the same session wrote one
    more copy the broker routed once it read again (a 20 s freeze: 6-7 copies of each row).
    A timeout now ends the session: the relay reconnects with its backoff, its connect the
    probe. Control: a confirmed publish leaves the session sound."""
    proxy = CuttableProxy(*urlsplit_host_port(amqp_url))
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        async with amqp_publisher(proxy.url(amqp_url), topo.exchange) as publisher:
            await publisher.publish(_wire(helpers.make_event(1)), confirm_timeout_s=10.0)
            assert not publisher.broken()
            proxy.hold()  # the broker stops answering: no confirm comes back
            with pytest.raises(PublishTimeout):
                await publisher.publish(_wire(helpers.make_event(2)), confirm_timeout_s=0.5)
            assert publisher.broken()
            proxy.release()
        tg.cancel_scope.cancel()


async def test_a_notify_does_not_cut_a_reconnect_backoff_short(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """While the broker is down, the relay tries again after its backoff, whatever NOTIFYs
    producers send meanwhile: woken like a poll, it reconnected once per producer commit
    (830 connections in 10 s of an outage at 100 commits/s, against 4)."""
    tries = 0

    @contextlib.asynccontextmanager
    async def down() -> AsyncIterator[Any]:
        nonlocal tries
        tries += 1
        raise ServiceUnavailable("the broker does not answer")
        yield  # pragma: no cover

    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, reconnect_max_s=0.5), publisher=down)
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        for _ in range(100):  # a NOTIFY every 10 ms for a second
            relay.wake()
            await anyio.sleep(0.01)
        relay.stop()
    assert 1 <= tries <= 8, tries
