"""`/metrics` inside a long-running process: `accord relay` with ACCORD_METRICS_PORT set, and
the status figures there only with ACCORD_METRICS_STATUS."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio
import asyncpg
import pytest

from accord.demo import demo_topology
from accord.schemas.events import Event
from tests.conftest import BrokerNames
from tests.support import enqueue, free_port, scrape


@pytest.mark.timeout(90)
async def test_relay_serves_status_and_messaging_metrics(
    pg_dsn: str, pg: asyncpg.Connection, amqp_url: str, broker_names: BrokerNames
) -> None:
    topology = demo_topology(broker_names.prefix)
    exchanges, queues = topology.names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    port = free_port()
    env = {
        **os.environ,
        "ACCORD_APP": "accord.demo:app",
        "ACCORD_PG_DSN": pg_dsn,
        "ACCORD_AMQP_URL": amqp_url,
        "ACCORD_TOPOLOGY_PREFIX": broker_names.prefix,
        "ACCORD_METRICS_PORT": str(port),
        "ACCORD_RELAY_POLL_S": "0.1",
    }
    process = await anyio.open_process(
        [sys.executable, "-m", "accord", "relay"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with pg.transaction():
            for i in range(3):
                await enqueue(pg, Event(
                    tenant="acme", operation_id=f"report:m{i}", type="report.accepted",
                    version=1, payload={"report_id": f"m{i}", "subject": "metrics"},
                ))  # fmt: skip
        published = "SELECT count(*) FROM relay.outbox WHERE state = 'published'"
        figures: dict[str, float] | None = None
        with anyio.fail_after(60):
            while True:
                figures = await anyio.to_thread.run_sync(scrape, port)
                # the counters move at the broker's confirm; the rows settle just after
                if (
                    figures
                    and figures.get("messaging_client_sent_messages_total", 0) >= 3
                    and await pg.fetchval(published) == 3
                ):
                    break
                await anyio.sleep(0.2)
        # the relay's own publish spans feed the OpenTelemetry messaging metrics ...
        assert figures is not None and figures["messaging_client_sent_messages_total"] >= 3
        # ... and its loops the flow counters; the database's status figures are not its
        # to serve (ACCORD_METRICS_STATUS unset: `accord metrics-serve` serves them once)
        assert figures["accord_relay_events_published_total"] >= 3
        assert "accord_status_up" not in figures and "accord_jobs_by_state" not in figures
    finally:
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0


def test_a_process_serves_the_status_figures_only_when_told(pg_dsn: str, amqp_url: str) -> None:
    """``runtime.metrics`` (what relay, consume and worker run) with ``metrics_status``: the
    status figures, read from the database on each scrape; without it (the default, the
    control), the process's own figures only. /readyz answers either way."""
    from accord import runtime
    from accord.schemas.settings import Settings

    served: dict[bool, dict[str, float] | None] = {}
    for status in (True, False):
        settings = Settings(
            pg_dsn=pg_dsn, amqp_url=amqp_url, metrics_port=free_port(), metrics_status=status
        )
        with runtime.metrics(settings) as server:
            assert server is not None
            served[status] = scrape(server.port)
    on, off = served[True], served[False]
    assert on is not None and on["accord_status_up"] == 1.0 and "accord_jobs_by_state" in on
    assert off is not None and "accord_status_up" not in off
    assert "accord_ready" in off and "accord_loops_alive" in off  # its own: readiness, loops
