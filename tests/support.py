"""Shared test helpers: service discovery, scale knobs, unique names."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from accord.demo.catalog import demo_catalog
from accord.relay import enqueue as relay_enqueue
from accord.schemas.events import Event

DEMO_CATALOG = demo_catalog()

SOAK = os.environ.get("ACCORD_SOAK", "") not in ("", "0")
IN_CI = os.environ.get("CI", "") not in ("", "0", "false")


def free_port() -> int:
    """A loopback TCP port nothing listens on now (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scaled(default: int, soak: int) -> int:
    """The size of a scenario: small by default, big under ACCORD_SOAK=1."""
    return soak if SOAK else default


def unique(prefix: str = "t") -> str:
    """A short name unique to this test run: database, exchange and queue names."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def unavailable(reason: str) -> None:
    """Skip locally with a reason; in CI a missing service is a failure, never a skip."""
    if IN_CI:
        pytest.fail(f"required service unavailable in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def docker_answers() -> bool:
    """True only when a Docker engine responds (the testcontainers fallback)."""
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], within: float = 60, every: float = 0.05
) -> None:
    """Poll ``predicate`` (the database, a broker, another task's counter: things with no
    event to wait on) until it holds; fail after ``within`` s."""
    with anyio.fail_after(within):
        while not await predicate():  # noqa: ASYNC110 - polling, no event to wait on
            await anyio.sleep(every)


async def enqueue(tx: Any, event: Event, **options: Any) -> int:
    """``accord.relay.enqueue``, by default with the demo's catalog (the tests' subject)."""
    options.setdefault("catalog", DEMO_CATALOG)
    return await relay_enqueue(tx, event, **options)


# End every promise a lowering declaration made: the horizons it replaced have run out
# (migration 0028 keeps each in force until its end).
LAPSED = "UPDATE consumers.replay_promises SET until = now() - interval '1 second'"


@asynccontextmanager
async def logged_plans(pg: asyncpg.Connection) -> AsyncIterator[list[str]]:
    """The plans of every statement ``pg`` runs inside the block, nested ones included, as
    auto_explain logs them (a generic plan shows its parameters as $n, a custom one the
    values)."""
    plans: list[str] = []

    def log(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
        plans.append(message.message)

    pg.add_log_listener(log)
    await pg.execute(
        "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
        " SET auto_explain.log_nested_statements = on; SET client_min_messages = log"
    )
    try:
        yield plans
    finally:
        await pg.execute("RESET client_min_messages")
        pg.remove_log_listener(log)


def filtered_out(plan: str) -> list[int]:
    """Each "Rows Removed by Filter" figure of an EXPLAIN ANALYZE plan (text), in order: the
    rows a scan read and did not return."""
    return [int(n) for n in re.findall(r"Removed by Filter: (\d+)", plan)]


def scrape(port: int) -> dict[str, float] | None:
    """A process's /metrics on ``port``, each sample summed over its labels (None when it
    does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:  # summed over labels (destination, operation, ...)
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals
