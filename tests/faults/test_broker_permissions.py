"""A RabbitMQ user whose permissions stop short of what a process needs: the broker refuses
it the same way at every retry, so the process ends with one line naming what to grant and
exit 2 instead of retrying for ever. The users live on a private RabbitMQ node
(tests/rabbit_node.py); the shared broker is never touched.

Each test first runs the same command as ``guest`` (every permission: the control), then as
a user the test made with one permission missing.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.demo import demo_topology
from tests.integration.relay import helpers
from tests.rabbit_node import RabbitNode

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def limited_user(rabbit_node: RabbitNode) -> Iterator[tuple[str, str]]:
    """A user of the private node with no permissions yet: (name, password)."""
    name, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rabbit_node.ctl("add_user", name, password)
    try:
        yield name, password
    finally:
        rabbit_node.ctl("delete_user", name)


def _url(node: RabbitNode, user: tuple[str, str] | None = None) -> str:
    if user is None:
        return node.url
    return f"amqp://{user[0]}:{user[1]}@127.0.0.1:{node.port}/"


def _env(pg_dsn: str, amqp_url: str, prefix: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    return {**clean, "PYTHONPATH": str(ROOT), "ACCORD_APP": "accord.demo:app",
            "ACCORD_PG_DSN": pg_dsn, "ACCORD_AMQP_URL": amqp_url,
            "ACCORD_TOPOLOGY_PREFIX": prefix, "ACCORD_CONSUMER_TENANTS": "*"}  # fmt: skip


def _names(prefix: str) -> tuple[list[str], list[str]]:
    return demo_topology(prefix).names()


def _exactly(names: list[str]) -> str:
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def _serves(argv: list[str], env: dict[str, str], ready: str) -> None:
    """The control: the command says ``ready``, then stops on SIGTERM with exit 0."""
    with subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as process:  # fmt: skip
        try:
            assert process.stdout is not None
            lines = []
            for line in process.stdout:
                lines.append(line)
                if ready in line:
                    break
            assert ready in "".join(lines), "".join(lines)[-2000:]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    assert process.returncode == 0


def _refused(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    return done.stderr.strip().splitlines()[-1]


ROWS = (
    "SELECT 'pending:' || count(*) FILTER (WHERE state = 'pending')"
    " || ' leased:' || count(*) FILTER (WHERE lease_token IS NOT NULL)"
    " || ' access_refused:' || count(*) FILTER (WHERE last_reason = 'access_refused')"
    " FROM relay.outbox"
)
CONSUME = [sys.executable, "-m", "accord", "consume", "--workflow", "report"]
RELAY = [sys.executable, "-m", "accord", "relay"]


def test_a_consumer_that_may_not_read_its_queue_stops_with_one_line(
    rabbit_node: RabbitNode, limited_user: tuple[str, str], pg_dsn: str, prefix: str
) -> None:
    """The user may declare the topology (configure, write, and read on the exchanges for
    the bindings) but not read the class's queue: basic.consume is refused."""
    _serves(CONSUME, _env(pg_dsn, _url(rabbit_node), prefix), "consumer ready")
    exchanges, _ = _names(prefix)
    rabbit_node.ctl("set_permissions", "-p", "/", limited_user[0], ".*", ".*", _exactly(exchanges))
    line = _refused(CONSUME, _env(pg_dsn, _url(rabbit_node, limited_user), prefix))
    assert line.startswith("accord: BrokerAccessRefused: "), line
    assert f"queue='{demo_topology(prefix).queue('report')}'" in line
    assert "read permission" in line and "ACCESS_REFUSED" in line
    rabbit_node.ctl("set_permissions", "-p", "/", limited_user[0], ".*", ".*", ".*")
    _serves(CONSUME, _env(pg_dsn, _url(rabbit_node, limited_user), prefix), "consumer ready")


def test_a_relay_that_may_not_write_to_the_exchange_stops_with_one_line(
    rabbit_node: RabbitNode, limited_user: tuple[str, str], pg_dsn: str, prefix: str
) -> None:
    """The user may declare the topology (configure, read, and write on the queues for the
    bindings) but not publish to the events exchange."""
    _serves(RELAY, _env(pg_dsn, _url(rabbit_node), prefix), "relay ready")
    _, queues = _names(prefix)
    rabbit_node.ctl("set_permissions", "-p", "/", limited_user[0], ".*", _exactly(queues), ".*")
    # Batches of 4 from 24 rows: both of the relay's loops hold a batch when it is refused.
    asyncio.run(helpers.enqueue_committed(pg_dsn, [helpers.make_event(n) for n in range(24)]))
    limited = _env(pg_dsn, _url(rabbit_node, limited_user), prefix)
    limited["ACCORD_RELAY_BATCH"] = "4"
    line = _refused(RELAY, limited)
    assert line.startswith("accord: PublishRefused: "), line  # a BrokerAccessRefused
    assert f"exchange='{demo_topology(prefix).exchange}'" in line
    assert "write permission" in line and "ACCESS_REFUSED" in line
    rows = asyncio.run(helpers.pg_value(pg_dsn, ROWS))
    # Every batch was settled before the relay stopped: all kept (pending, none held, none
    # published), none left leased to wait out its lease, the refused ones saying why.
    assert rows == "pending:24 leased:0 access_refused:" + rows.rsplit(":", 1)[1], rows
    assert int(rows.rsplit(":", 1)[1]) >= 1, rows
    # Once the user may publish, the same relay publishes the rows it could not.
    rabbit_node.ctl("set_permissions", "-p", "/", limited_user[0], ".*", ".*", ".*")
    with subprocess.Popen(RELAY, env=limited, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) as relay:  # fmt: skip
        try:
            asyncio.run(helpers.wait_until_settled(pg_dsn, expect_published=24, within_s=30))
        finally:
            relay.send_signal(signal.SIGTERM)
            relay.wait(timeout=30)
