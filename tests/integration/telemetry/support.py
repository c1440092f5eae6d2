"""Real `accord` processes configured only by OTEL_* variables, against a test receiver."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from accord.demo import demo_topology
from accord.demo.job import DEFAULT_OWNER, WORKFLOW
from tests.conftest import BrokerNames

ROOT = Path(__file__).resolve().parents[3]
ACCORD = [sys.executable, "-m", "accord"]

# The producer: an application's own process, traced by one call, accepting one submission.
PRODUCER = """
import asyncio, sys
import asyncpg
from accord import telemetry
from accord.demo.domain import accept_submission

async def main(dsn, tenant, report_id):
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await accept_submission(conn, tenant, report_id, "quarterly figures")
    finally:
        await conn.close()

assert telemetry.configure()
asyncio.run(main(*sys.argv[1:]))
"""


def otel_env(
    endpoint: str, pg_dsn: str, amqp_url: str, names: BrokerNames, work: Path, provider_url: str
) -> dict[str, str]:
    exchanges, queues = demo_topology(names.prefix).names()
    names.exchanges.extend(exchanges)
    names.queues.extend(queues)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test",
        ACCORD_APP="accord.demo:app",
        ACCORD_PG_DSN=pg_dsn,
        ACCORD_AMQP_URL=amqp_url,
        ACCORD_TOPOLOGY_PREFIX=names.prefix,
        ACCORD_DEMO_PROVIDER_URL=provider_url,
        ACCORD_CONSUMER_TENANTS="acme,globex",
        ACCORD_JOURNAL_DIR=str(work / "journal"),
        ACCORD_OBJECT_DIR=str(work / "objects"),
        ACCORD_LEDGER_PATH=str(work / "authority.ledger"),
        ACCORD_RELAY_POLL_S="0.1",
        ACCORD_RELAY_RETRY_BASE_S="0.2",
        ACCORD_RELAY_LEASE_S="5",
        ACCORD_RELAY_PUBLISH_TIMEOUT_S="3",
    )
    return env


async def run_once(env: dict[str, str], service: str, *argv: str) -> str:
    done = await anyio.run_process(
        [*ACCORD, *argv], env={**env, "OTEL_SERVICE_NAME": service}, cwd=ROOT, check=False
    )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    return out


async def register(env: dict[str, str]) -> None:
    await run_once(
        {**env, "OTEL_TRACES_EXPORTER": "none"},
        "register",
        "register", "--workflow", WORKFLOW, "--owner", DEFAULT_OWNER, "--effects", "enabled",
    )  # fmt: skip


async def produce(env: dict[str, str], tenant: str, report_id: str) -> None:
    done = await anyio.run_process(
        [sys.executable, "-c", PRODUCER, env["ACCORD_PG_DSN"], tenant, report_id],
        env={**env, "OTEL_SERVICE_NAME": "producer"},
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()


@asynccontextmanager
async def process(
    env: dict[str, str], service: str, *argv: str
) -> AsyncIterator[anyio.abc.Process]:
    """One long-running `accord` process; SIGTERM (drain, flush spans) when the block ends,
    unless the test killed it."""
    proc = await anyio.open_process(
        [*ACCORD, *argv], env={**env, "OTEL_SERVICE_NAME": service}, cwd=ROOT,
        stdin=None, stdout=None, stderr=None,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with anyio.move_on_after(20):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await proc.aclose()


async def until(check: Callable[[], Any], timeout_s: float = 60.0, what: str = "") -> Any:
    with anyio.fail_after(timeout_s):
        while True:
            value = check()
            if value:
                return value
            await anyio.sleep(0.1)
