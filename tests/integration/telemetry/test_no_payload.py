"""Logs and spans carry identifiers and typed reasons, never payloads.

A submission whose subject is a marker string goes through the real relay, consumer and
worker with ACCORD_LOG_FORMAT=json and tracing to the test's OTLP receiver: every log line
of every process parses as one JSON object, lines written inside a span carry its trace and
span ids, and neither any log line nor any span attribute, event or link holds the marker.
Control: the marker did travel (it is in the published report and in the job's payload).
"""

from __future__ import annotations

import json
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from accord.demo.provider import ProviderServer
from tests.conftest import BrokerNames
from tests.integration.telemetry import support
from tests.integration.telemetry.receiver import otlp_receiver
from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)

PRODUCER = """
import asyncio, sys
import asyncpg
from accord import configure_tracing
from accord.demo.domain import accept_submission

async def main(dsn, report_id, subject):
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await accept_submission(conn, "acme", report_id, subject)
    finally:
        await conn.close()

assert configure_tracing()
asyncio.run(main(*sys.argv[1:]))
"""


async def test_no_log_line_and_no_span_holds_the_payload(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames, tmp_path: Path, provider: ProviderServer
) -> None:
    marker = f"PAYLOAD-MARKER-{uuid.uuid4().hex}"
    with otlp_receiver() as (endpoint, received):
        env = support.otel_env(endpoint, pg_dsn, amqp_url, broker_names, tmp_path, provider.url)
        env["ACCORD_LOG_FORMAT"] = "json"
        await support.register(env)
        logs: list[Path] = []
        processes = []
        for name, argv in (
            ("relay", ["relay"]),
            ("consumer", ["consume", "--workflow", "report"]),
            ("worker", ["worker", "--workflow", "report", "--poll-s", "0.2"]),
        ):
            path = tmp_path / f"{name}.log"
            logs.append(path)
            with path.open("wb") as out:
                processes.append(
                    await anyio.open_process(
                        [*support.ACCORD, *argv],
                        env={**env, "OTEL_SERVICE_NAME": name},
                        cwd=support.ROOT,
                        stdout=out,
                        stderr=out,
                    )
                )
        try:
            done = await anyio.run_process(
                [sys.executable, "-c", PRODUCER, pg_dsn, "marked-1", f"subject {marker}"],
                env={**env, "OTEL_SERVICE_NAME": "producer"}, cwd=support.ROOT, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr.decode()
            conn = await asyncpg.connect(pg_dsn)
            try:

                async def published() -> bool:
                    return bool(await conn.fetchval("SELECT count(*) FROM demo.reports"))

                await wait_for(published, within=60, every=0.2)
                payload = await conn.fetchval("SELECT payload::text FROM jobs.jobs")
            finally:
                await conn.close()
            assert marker in payload  # control: the marker really went through
            await support.until(lambda: received.named("attempt "), what="the attempt span")
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                codes = [await process.wait() for process in processes]
            for process in processes:
                await process.aclose()
    assert codes == [0, 0, 0]
    records: list[dict[str, Any]] = []
    for path in logs:
        for line in path.read_text().splitlines():
            assert marker not in line, (path.name, line)
            records.append(json.loads(line))  # every line is one JSON object
    assert {r["logger"] for r in records} and all("message" in r for r in records)
    inside = [r for r in records if r.get("trace_id")]
    assert inside and all(len(r["trace_id"]) == 32 and len(r["span_id"]) == 16 for r in inside)
    spans = received.spans
    assert spans
    for span in spans:
        text = json.dumps(
            [span.name, span.attributes, span.events, [link.attributes for link in span.links]],
            default=str,
        )
        assert marker not in text, span.name
