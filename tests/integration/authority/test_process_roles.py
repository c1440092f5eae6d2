"""The relay and the consumers run as their own principals (migration 0014), and each still
does its own work under its role.

Each refusal comes after its control: the same principal doing what it may. The relay's role
cannot touch jobs or the inbox (nor enqueue, nor rewrite an event); the consumer's role cannot
publish a job or resolve an effect (nor claim, begin an effect, enqueue, or change poison).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aio_pika
import anyio
import asyncpg
import pytest

from accord.consumers import ConsumerRuntime, RuntimeConfig, inbox
from accord.demo import app as demo_app
from accord.demo import demo_topology
from accord.jobs import EffectState, JobState, Store, repair_sql, sql
from accord.relay import Relay
from accord.relay import sql as relay_sql
from accord.schemas.events import Event
from accord.schemas.topology import Topology
from tests.conftest import BrokerNames
from tests.integration.consumers.conftest import own
from tests.integration.consumers.support import (
    CATALOG,
    TENANT,
    amqp_message,
    publish,
    report,
    running,
    wire_message,
)
from tests.integration.relay import helpers
from tests.support import enqueue, wait_for

pytestmark = pytest.mark.timeout(120)

DENIED = asyncpg.InsufficientPrivilegeError
RELAY_ROLE = "accord_relay"
CONSUMER_ROLE = "accord_consumer"


async def connect_as(dsn: str, role: str) -> asyncpg.Connection:
    """A connection that takes ``role`` at start, as the processes do."""
    return await asyncpg.connect(dsn, server_settings={"role": role})


async def refused(
    conn: asyncpg.Connection, statements: Sequence[tuple[str, tuple[Any, ...]]]
) -> None:
    for stmt, args in statements:
        try:
            await conn.execute(stmt, *args)
        except DENIED:
            continue
        pytest.fail(f"not refused: {stmt}")


async def count(pg: asyncpg.Connection, query: str) -> int:
    return int(await pg.fetchval(query))


@pytest.fixture
async def topo(amqp_url: str, broker_names: BrokerNames) -> Topology:
    return await helpers.declare_demo(amqp_url, broker_names)


@pytest.fixture
async def relay_conn(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await connect_as(pg_dsn, RELAY_ROLE)
    yield conn
    await conn.close()


@pytest.fixture
async def consumer_pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(
        pg_dsn, min_size=1, max_size=2, server_settings={"role": CONSUMER_ROLE}
    )
    assert pool is not None
    yield pool
    await pool.close()


async def test_the_relay_publishes_holds_and_prunes_but_cannot_touch_jobs_or_the_inbox(
    pg_dsn: str,
    pg: asyncpg.Connection,
    amqp_url: str,
    topo: Topology,
    relay_conn: asyncpg.Connection,
) -> None:
    # control: a relay whose connections (claim/settle loops, LISTEN) take the relay role
    events = [helpers.make_event(n) for n in range(4)]
    oversize = helpers.make_event(99, pad=1900)
    await helpers.enqueue_committed(pg_dsn, [*events, oversize])
    config = helpers.config(
        pg_dsn, amqp_url, topo, pg_role=RELAY_ROLE, max_message_bytes=1000, retention_s=3600.0
    )
    relay = Relay(config)
    await helpers.run_until_settled([relay], pg_dsn, expect=4, within_s=30)
    assert relay.stats.published == 4 and relay.stats.held == 1
    # it may promise to poll (relay.awake) and take its promise back, and nothing more there
    promise = await relay_conn.fetchrow(relay_sql.PROMISE_AWAKE, 1.0)
    assert promise["own"] and await pg.fetchval("SELECT until > now() FROM relay.awake")
    await relay_conn.execute(relay_sql.WITHDRAW_AWAKE, promise["until"])
    assert await pg.fetchval("SELECT until <= now() FROM relay.awake")
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(e.event_id) for e in events}
    held = await pg.fetchrow(
        "SELECT state, last_reason FROM relay.outbox WHERE event_id = $1", oversize.event_id
    )
    assert (held["state"], held["last_reason"]) == ("held", "oversize")
    # ... and prunes published rows past the retention window, under its role
    assert await relay_conn.fetchval("SELECT current_user") == RELAY_ROLE
    await pg.execute(
        "UPDATE relay.outbox SET published_at = now() - interval '2 days' WHERE state = 'published'"
    )
    assert await relay.prune_once(relay_conn) == 4
    assert await count(pg, "SELECT count(*) FROM relay.outbox") == 1  # the held row stays

    # the jobs module and the inbox are out of its reach, by plain SQL or by function
    await pg.execute(
        "INSERT INTO consumers.inbox (tenant, consumer, operation_id, event_id, digest,"
        " event_type, version, occurred_at)"
        " VALUES ('a', 'report', 'op', gen_random_uuid(), repeat('0', 64), 'x', 1, now())"
    )
    await refused(
        relay_conn,
        [
            ("SELECT count(*) FROM jobs.jobs", ()),
            ("UPDATE jobs.jobs SET state = 'queued'", ()),
            ("SELECT count(*) FROM jobs.effects", ()),
            (sql.SUBMIT, ("a", "report", "op", "d", "{}", 5)),
            (sql.CLAIM, ("report", "w", 30.0, 1)),
            ("SELECT count(*) FROM consumers.inbox", ()),
            ("DELETE FROM consumers.inbox", ()),
            ("SELECT count(*) FROM consumers.deliveries", ()),
            ("SELECT count(*) FROM consumers.poison", ()),
            ("SELECT count(*) FROM demo.submissions", ()),
            # its own table: it settles rows, it never rewrites or injects an event
            ("UPDATE relay.outbox SET body = ''::bytea", ()),
            ("UPDATE relay.outbox SET tenant = 'other'", ()),
            ("UPDATE relay.awake SET one = false", ()),  # only its promise's end
        ],
    )
    with pytest.raises(DENIED):
        async with relay_conn.transaction():
            await enqueue(relay_conn, helpers.make_event(7))
    assert await count(pg, "SELECT count(*) FROM consumers.inbox") == 1
    assert await count(pg, "SELECT count(*) FROM relay.outbox") == 1

    # it removes published rows only, and never moves a held one: a committed event leaves by
    # being published, a held one through a person (0062; the controls above: its prune, its
    # settle holding the oversize row)
    pending = helpers.make_event(8)
    await helpers.enqueue_committed(pg_dsn, [pending])
    await refused(
        relay_conn,
        [
            ("DELETE FROM relay.outbox WHERE state = 'held'", ()),
            ("UPDATE relay.outbox SET state = 'pending' WHERE state = 'held'", ()),
            ("UPDATE relay.outbox SET attempts = 0 WHERE state = 'held'", ()),
            (
                "UPDATE relay.outbox SET state = 'published', published_at = now()"
                " WHERE state = 'held'",
                (),
            ),
            ("DELETE FROM relay.outbox WHERE event_id = $1", (pending.event_id,)),
        ],
    )
    states = await pg.fetch("SELECT event_id, state FROM relay.outbox ORDER BY id")
    assert [(r["event_id"], r["state"]) for r in states] == [
        (oversize.event_id, "held"),
        (pending.event_id, "pending"),
    ]


def _runtime(amqp_url: str, pg_dsn: str, topo: Topology, workflow: str) -> ConsumerRuntime:
    return ConsumerRuntime(
        config=RuntimeConfig(workflow=workflow, tenants=frozenset({TENANT}), reconnect_delay_s=0.2),
        amqp_url=amqp_url,
        pg_dsn=pg_dsn,
        topology=topo,
        catalog=CATALOG,
        handlers=demo_app.consumer_class(workflow).handlers,
        pg_role=CONSUMER_ROLE,
    )


def _published(operation_id: str) -> Event:
    return Event(
        tenant=TENANT,
        operation_id=operation_id,
        type="report.published",
        version=1,
        payload={"report_id": f"r-{operation_id}", "object_key": "k", "provider_receipt": "p"},
    )


async def test_the_consumer_submits_projects_and_poisons_but_cannot_publish_a_job_or_resolve_an_effect(  # noqa: E501
    pg_dsn: str,
    pg: asyncpg.Connection,
    amqp_url: str,
    broker_names: BrokerNames,
    consumer_pool: asyncpg.Pool,
) -> None:
    topo = own(broker_names, demo_topology(broker_names.prefix))
    accepted = report("op-roles-1")
    malformed = aio_pika.Message(b"not json", message_id=str(uuid.uuid4()))
    # control: the demo's two classes consume as accord_consumer (their runtimes also run the
    # inbox prune at session start): submit a job, record a duplicate and a poison, project
    async with (
        running(_runtime(amqp_url, pg_dsn, topo, "report")),
        running(_runtime(amqp_url, pg_dsn, topo, "report_projection")),
    ):
        message = amqp_message(wire_message(accepted))
        again = amqp_message(wire_message(accepted))  # a re-publish: same event, new publish id
        await publish(
            amqp_url,
            topo,
            [
                (accepted.ce_type, message),
                (accepted.ce_type, again),
                (accepted.ce_type, malformed),
                ("report.published.v1", amqp_message(wire_message(_published("op-roles-1")))),
            ],
        )

        async def settled() -> bool:
            return (
                await count(pg, "SELECT count(*) FROM consumers.deliveries") >= 3
                and await count(pg, "SELECT count(*) FROM consumers.poison") >= 1
            )

        await wait_for(settled, within=30)
    job = await pg.fetchrow("SELECT job_id, state FROM jobs.jobs")
    assert job["state"] == JobState.QUEUED
    outcomes = await pg.fetch(
        "SELECT consumer, outcome FROM consumers.deliveries ORDER BY consumer, outcome"
    )
    assert [tuple(r) for r in outcomes] == [
        ("report", "duplicate"),
        ("report", "new"),
        ("report_projection", "new"),
    ]
    assert await pg.fetchval("SELECT reason FROM consumers.poison") == "missing_header"
    assert await count(pg, "SELECT count(*) FROM demo_projection.published_reports") == 1
    # ... and prunes the inbox and the delivery log past the replay window, under its role
    # (the inbox past the window its runtime declared too: migration 0028)
    await pg.execute(
        "UPDATE consumers.inbox SET first_seen_at = now() - interval '60 days',"
        " occurred_at = now() - interval '60 days'"
    )
    await pg.execute("UPDATE consumers.deliveries SET received_at = now() - interval '60 days'")
    async with consumer_pool.acquire() as conn, conn.transaction():
        assert await conn.fetchval("SELECT current_user") == CONSUMER_ROLE
        pruned = [
            await inbox.prune(conn, inbox.Consumer(name, demo_app.catalog, 3600.0))
            for name in ("report", "report_projection")
        ]
        assert pruned == [(1, 2), (1, 1)]  # each consumer its own rows

    # the worker's lease on that job: the consumer role can neither publish it nor resolve
    # an effect, by function or by plain SQL
    owner = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    assert owner is not None
    try:
        worker = Store(owner)
        await worker.register_workflow("report", "w-1", effects_enabled=True)
        [lease] = await worker.claim("report", "w-1", lease_s=60)
        await worker.begin_effect(lease, "provider.create_report", "intent")
        consumer = Store(consumer_pool)
        with pytest.raises(DENIED):
            await consumer.publish(lease)
        with pytest.raises(DENIED):
            await consumer.begin_effect(lease, "other.effect", "intent")
        with pytest.raises(DENIED):
            await consumer.claim("report", "w-1", lease_s=60)
        async with consumer_pool.acquire() as conn:
            await refused(
                conn,
                [
                    (sql.SUCCEED, lease.fence_args()),
                    (sql.FENCE, lease.fence_args()),
                    (
                        repair_sql.RESOLVE_EFFECT,
                        (lease.job_id, "provider.create_report", "succeeded", None, "c", "e", None),
                    ),
                    (repair_sql.RELEASE_HOLD, (lease.job_id, "c", "e")),
                    ("UPDATE jobs.jobs SET state = 'succeeded'", ()),
                    ("UPDATE jobs.effects SET state = 'succeeded'", ()),
                    ("SELECT count(*) FROM jobs.jobs", ()),
                    ("SELECT count(*) FROM relay.outbox", ()),
                    # its own tables: poison is evidence it only appends; reservations are
                    # never rewritten
                    ("SELECT reason, headers FROM consumers.poison", ()),
                    ("UPDATE consumers.poison SET reason = 'rejected'", ()),
                    ("DELETE FROM consumers.poison", ()),
                    ("UPDATE consumers.inbox SET digest = repeat('1', 64)", ()),
                    # the application grants only what its handlers write
                    ("SELECT count(*) FROM demo.submissions", ()),
                    ("DELETE FROM demo_projection.published_reports", ()),
                ],
            )
            with pytest.raises(DENIED):
                async with conn.transaction():
                    await enqueue(conn, report("op-roles-2"))
        # the lease is untouched by all of that: its owner finishes the effect and publishes
        assert await pg.fetchval("SELECT state FROM jobs.jobs") == JobState.RUNNING
        await worker.finish_effect(
            lease, "provider.create_report", EffectState.SUCCEEDED, receipt="r"
        )
        await worker.publish(lease)
        assert await pg.fetchval("SELECT state FROM jobs.jobs") == JobState.SUCCEEDED
    finally:
        await owner.close()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def test_the_role_given_is_the_role_the_processes_connect_as(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """Negative control for the two tests above: given a role without their grants
    (accord_projection), the relay and the consumer runtime are refused by PostgreSQL, so
    ``pg_role`` is really the role their connections take."""
    await helpers.enqueue_committed(pg_dsn, [helpers.make_event(1)])
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, pg_role="accord_projection"))
    with anyio.fail_after(30), pytest.raises(BaseException) as raised:
        await relay.run()
    assert any(isinstance(leaf, DENIED) for leaf in _leaves(raised.value)), raised.value
    runtime = _runtime(amqp_url, pg_dsn, topo, "report")
    runtime.pg_role = "accord_projection"
    with anyio.fail_after(30), pytest.raises(BaseException) as raised:
        await runtime.run()
    assert any(isinstance(leaf, DENIED) for leaf in _leaves(raised.value)), raised.value
