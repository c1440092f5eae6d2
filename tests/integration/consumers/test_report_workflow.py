"""The demo's report workflow: report.accepted submits a job; redelivery never resets it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import asyncpg
import pytest

from accord.consumers import ConsumerRuntime, PoisonReason, RuntimeConfig
from accord.demo import app as demo_app
from accord.demo import demo_topology
from accord.jobs import JobState, Store, submit
from accord.schemas.topology import Topology
from tests.conftest import BrokerNames
from tests.integration.consumers.conftest import own
from tests.integration.consumers.support import (
    CATALOG,
    TENANT,
    amqp_message,
    counts,
    declare_topology,
    publish,
    report,
    running,
    wire_message,
)
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def demo(broker_names: BrokerNames) -> Topology:
    return own(broker_names, demo_topology(broker_names.prefix))


def _runtime(amqp_url: str, pg_dsn: str, topo: Topology) -> ConsumerRuntime:
    return ConsumerRuntime(
        config=RuntimeConfig(workflow="report", tenants=frozenset({TENANT})),
        amqp_url=amqp_url,
        pg_dsn=pg_dsn,
        topology=topo,
        catalog=CATALOG,
        handlers=demo_app.consumer_class("report").handlers,
    )


async def _deliveries(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM consumers.deliveries") >= n)


async def test_redelivering_report_accepted_never_resets_a_job(
    amqp_url: str, pg_dsn: str, pg: asyncpg.Connection, demo: Topology
) -> None:
    event = report("op-report-1")
    message = wire_message(event)
    await declare_topology(amqp_url, demo)
    async with running(_runtime(amqp_url, pg_dsn, demo)):
        await publish(amqp_url, demo, [(event.ce_type, amqp_message(message))])
        await wait_for(lambda: _deliveries(pg, 1))
        job = await pg.fetchrow("SELECT job_id, state, digest FROM jobs.jobs")
        assert job["state"] == JobState.QUEUED and job["digest"] == CATALOG.digest(event)
        # the worker runs the job to success
        pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
        try:
            store = Store(pool)
            await store.register_workflow("report", "worker-1")
            [lease] = await store.claim("report", "worker-1", lease_s=30)
            await store.publish(lease)
        finally:
            await pool.close()
        # the broker redelivers (same message), and the producer re-publishes (new event id)
        republished = event.model_copy(update={"event_id": __import__("uuid").uuid4()})
        await publish(
            amqp_url,
            demo,
            [
                (event.ce_type, amqp_message(message)),
                (event.ce_type, amqp_message(wire_message(republished))),
            ],
        )
        await wait_for(lambda: _deliveries(pg, 3))
        # even with its inbox row gone, a redelivery only finds the existing job
        await pg.execute("DELETE FROM consumers.inbox")
        await publish(amqp_url, demo, [(event.ce_type, amqp_message(message))])
        await wait_for(lambda: _deliveries(pg, 4))
    jobs = await pg.fetch("SELECT job_id, state FROM jobs.jobs")
    assert [(r["job_id"], r["state"]) for r in jobs] == [(job["job_id"], JobState.SUCCEEDED)]
    assert await counts(pg) == {"new": 2, "duplicate": 2}


async def test_a_job_with_another_digest_is_a_permanent_conflict(
    amqp_url: str, pg_dsn: str, pg: asyncpg.Connection, demo: Topology
) -> None:
    event = report("op-report-2")
    async with pg.transaction():
        await submit(pg, tenant=TENANT, workflow="report", operation_id="op-report-2", digest="x")
    ok = report("op-report-3")
    await declare_topology(amqp_url, demo)
    async with running(_runtime(amqp_url, pg_dsn, demo)):
        await publish(amqp_url, demo, [(ok.ce_type, amqp_message(wire_message(ok)))])  # control
        await wait_for(lambda: _deliveries(pg, 1))
        await publish(amqp_url, demo, [(event.ce_type, amqp_message(wire_message(event)))])
        await wait_for(lambda: _deliveries(pg, 2))
    row = await pg.fetchrow("SELECT reason, operation_id FROM consumers.poison")
    assert (row["reason"], row["operation_id"]) == (PoisonReason.CONFLICT, "op-report-2")
    assert (
        await pg.fetchval("SELECT digest FROM jobs.jobs WHERE operation_id = $1", "op-report-2")
        == "x"
    )
    assert await pg.fetchval("SELECT count(*) FROM consumers.inbox") == 1


def _env(pg_dsn: str, amqp_url: str, prefix: str) -> dict[str, str]:
    return {
        **os.environ,
        "ACCORD_APP": "accord.demo:app",
        "ACCORD_PG_DSN": pg_dsn,
        "ACCORD_AMQP_URL": amqp_url,
        "ACCORD_TOPOLOGY_PREFIX": prefix,
        "ACCORD_CONSUMER_TENANTS": "",
    }


async def test_accord_consume_runs_the_report_workflow_until_sigterm(
    amqp_url: str, pg_dsn: str, pg: asyncpg.Connection, demo: Topology
) -> None:
    env = _env(pg_dsn, amqp_url, demo.prefix)
    cli = [sys.executable, "-m", "accord", "consume", "--workflow", "report"]
    # control for the config: without explicit tenants it refuses to start
    refused = await anyio.run_process(cli, env=env, cwd=ROOT, check=False)
    assert refused.returncode == 2 and b"tenant" in refused.stderr
    event = report("op-cli")
    process = await anyio.open_process(
        [*cli, "--tenant", TENANT], env=env, cwd=ROOT, stderr=subprocess.PIPE
    )
    try:
        await declare_topology(amqp_url, demo)
        await publish(amqp_url, demo, [(event.ce_type, amqp_message(wire_message(event)))])
        await wait_for(lambda: _deliveries(pg, 1), within=30)
    finally:
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            code = await process.wait()
    assert code == 0
    assert (
        await pg.fetchval("SELECT state FROM jobs.jobs WHERE operation_id = 'op-cli'") == "queued"
    )
