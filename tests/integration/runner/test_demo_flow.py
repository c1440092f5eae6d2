"""The demo workflow end to end on real PostgreSQL, RabbitMQ and the provider simulator:
accept_submission → relay → report consumer → job → worker → report row + event."""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from accord.consumers import ConsumerRuntime, RuntimeConfig
from accord.demo import (
    WORKFLOW,
    SubmissionConflict,
    accept_submission,
    demo_topology,
    report,
    report_handler,
)
from accord.demo import app as demo_app
from accord.jobs import submit
from accord.relay import Relay, RelayConfig
from accord.schemas.events import Event
from tests.conftest import BrokerNames
from tests.integration.runner.conftest import CATALOG, TENANT, Rig, running, wait_for

pytestmark = pytest.mark.timeout(90)


async def test_accept_to_published_report_through_relay_consumer_and_worker(
    rig: Rig, amqp_url: str, broker_names: BrokerNames
) -> None:
    topo = demo_topology(broker_names.prefix)
    exchanges, queues = topo.names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    relay = Relay(
        RelayConfig(
            pg_dsn=rig.pg_dsn, amqp_url=amqp_url, exchange=topo.exchange, poll_s=0.05, lease_s=15
        )
    )
    consumer = ConsumerRuntime(
        config=RuntimeConfig(workflow=WORKFLOW, tenants=frozenset({TENANT})),
        amqp_url=amqp_url,
        pg_dsn=rig.pg_dsn,
        topology=topo,  # declared at start
        catalog=CATALOG,
        handlers=demo_app.consumer_class(WORKFLOW).handlers,
    )
    worker = rig.worker({WORKFLOW: (report_handler(rig.client), 30.0)})
    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer.run)
        with anyio.fail_after(30):
            await consumer.consuming.wait()
        tg.start_soon(relay.run)
        async with running(worker):
            async with rig.pool.acquire() as conn, conn.transaction():
                event = await accept_submission(conn, TENANT, "r-e2e", "annual review")
            # accepting again is idempotent: the same event, nothing enqueued twice
            async with rig.pool.acquire() as conn, conn.transaction():
                again = await accept_submission(conn, TENANT, "r-e2e", "annual review")
            assert again.event_id == event.event_id

            async def published_and_relayed() -> bool:
                return bool(
                    await rig.pool.fetchval(
                        "SELECT count(*) FROM relay.outbox"
                        " WHERE type = 'report.published' AND state = 'published'"
                    )
                )

            await wait_for(published_and_relayed, within=60)
        relay.stop()
        consumer.stop()
    done = await report(rig.pool, TENANT, "r-e2e")
    assert done is not None and done.generation == 1
    job = await rig.pool.fetchrow(
        "SELECT job_id, operation_id, state, digest FROM jobs.jobs WHERE job_id = $1", done.job_id
    )
    assert (job["operation_id"], job["state"], job["digest"]) == (
        event.operation_id,
        "succeeded",
        CATALOG.digest(event),
    )
    assert [e.receipt_id for e in rig.provider.evidence()] == [done.provider_receipt]
    outbox = await rig.pool.fetch("SELECT type, operation_id FROM relay.outbox ORDER BY id")
    assert [(r["type"], r["operation_id"]) for r in outbox] == [
        ("report.accepted", "report:r-e2e"),
        ("report.published", "report:r-e2e"),
    ]
    assert await rig.pool.fetchval("SELECT count(*) FROM consumers.inbox") == 1


async def test_accept_submission_conflict_and_atomicity(rig: Rig) -> None:
    async with rig.pool.acquire() as conn:
        # control: accepted in a transaction that rolls back leaves neither row
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await accept_submission(conn, TENANT, "r-1", "first")
                raise RuntimeError("domain decided otherwise")
        assert await _rows(conn) == (0, 0)
        async with conn.transaction():
            first = await accept_submission(conn, TENANT, "r-1", "first")
        assert await _rows(conn) == (1, 1)
        # the same submission again: the joined statement inserts nothing, so no outbox row,
        # and the original event is returned
        async with conn.transaction():
            again = await accept_submission(conn, TENANT, "r-1", "first")
        assert (again.event_id, again.occurred_at) == (first.event_id, first.occurred_at)
        assert await _rows(conn) == (1, 1)
        with pytest.raises(SubmissionConflict):
            async with conn.transaction():
                await accept_submission(conn, TENANT, "r-1", "second")
        assert await _rows(conn) == (1, 1)


async def _rows(conn: asyncpg.Connection) -> tuple[int, int]:
    submissions = await conn.fetchval("SELECT count(*) FROM demo.submissions")
    outbox = await conn.fetchval("SELECT count(*) FROM relay.outbox")
    return submissions, outbox


async def test_a_report_job_without_the_demo_s_submission_publishes_its_event_alone(
    rig: Rig,
) -> None:
    """A report.accepted from another producer (no demo.submissions row) starts a job whose
    publish writes no report row (it names a submission) and enqueues report.published on
    its own. Before, the report row's foreign key refused the publish after the provider
    call had succeeded, at every attempt. Control: a job of the demo's own submission
    writes its report row and the event in one statement."""
    worker = rig.worker({WORKFLOW: (report_handler(rig.client), 30.0)})
    own = await rig.submit_report("r-own")
    event = Event(
        tenant=TENANT, operation_id="report:r-foreign", type="report.accepted", version=1,
        payload={"report_id": "r-foreign", "subject": "from another producer"},
    )  # fmt: skip
    async with rig.pool.acquire() as conn, conn.transaction():
        foreign = (
            await submit(
                conn, tenant=TENANT, workflow=WORKFLOW, operation_id=event.operation_id,
                digest=CATALOG.digest(event), payload=dict(event.payload),
            )
        ).job_id  # fmt: skip
    async with running(worker):

        async def both_done() -> bool:
            return {await rig.state(own), await rig.state(foreign)} == {"succeeded"}

        await wait_for(both_done, within=30)
    assert await report(rig.pool, TENANT, "r-own") is not None
    assert await report(rig.pool, TENANT, "r-foreign") is None
    published = await rig.pool.fetch(
        "SELECT operation_id FROM relay.outbox WHERE type = 'report.published' ORDER BY id"
    )
    assert sorted(r["operation_id"] for r in published) == ["report:r-foreign", "report:r-own"]
