"""The real `accord relay`'s start: it says ready only once it can publish, and a broker lost
in the middle of its start ends it with one line and exit 2. PostgreSQL and RabbitMQ are
reached through proxies of this test's own, which hold or cut what passes; the shared
services are never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accord.cli import EXIT_TEMPFAIL
from accord.demo import demo_topology
from tests.conftest import BrokerNames
from tests.integration.ops.proxy import Proxy
from tests.integration.ops.test_readiness import held_then_ready, served
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[3]
RELAY = [sys.executable, "-m", "accord", "relay"]
pytestmark = pytest.mark.timeout(120)


def _env(pg_dsn: str, amqp_url: str, names: BrokerNames, **extra: str) -> dict[str, str]:
    exchanges, queues = demo_topology(names.prefix).names()
    names.exchanges.extend(exchanges)
    names.queues.extend(queues)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    return {**clean, "PYTHONPATH": str(ROOT), "ACCORD_APP": "accord.demo:app",
            "ACCORD_PG_DSN": pg_dsn, "ACCORD_AMQP_URL": amqp_url,
            "ACCORD_TOPOLOGY_PREFIX": names.prefix, **extra}  # fmt: skip


def test_the_relay_is_ready_once_its_loops_connect(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames, tmp_path: Path
) -> None:
    """The relay's start passes (schema current, topology declared), then its loops connect
    to PostgreSQL as the relay role: the test's proxy holds those connections (the first
    bytes naming ``accord_relay``). The readiness checks pass (they connect without the
    role), yet the relay publishes nothing, so /readyz is 503 naming only ``startup`` and no
    ready line is logged. Once the proxy lets them through, the relay is ready (the control).
    Before, it logged its ready line and /readyz said 200 before any loop had connected."""
    proxy = Proxy.of(pg_dsn)
    port = free_port()
    env = _env(proxy.url(pg_dsn), amqp_url, broker_names,
               ACCORD_METRICS_PORT=str(port))  # fmt: skip
    proxy.stall_on(b"accord_relay")  # the loops' startup packets (role=accord_relay)
    try:
        with served(RELAY, env, tmp_path / "relay.log"):
            proxy.wait_holding()
            held_then_ready(port, proxy, tmp_path / "relay.log", b"relay ready")
    finally:
        proxy.close()


def test_a_broker_lost_during_the_relay_start_is_one_line(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames
) -> None:
    """RabbitMQ goes away while the relay's start declares the topology (the proxy holds the
    exchange's declaration, then cuts the connection). Nothing in a start reconnects: the
    relay ends with one line naming the lost broker and exit 75 (a service's failure, not a
    refusal: exit 2), for its supervisor to start it again, not with aiormq's traceback
    (before: exit 1). Control: through the same proxy,
    restored, the same relay starts and says ready."""
    proxy = Proxy.of(amqp_url)
    env = _env(pg_dsn, proxy.url(amqp_url), broker_names)
    exchange = demo_topology(broker_names.prefix).exchange.encode()
    try:
        proxy.stall_on(exchange)
        with subprocess.Popen(RELAY, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) as relay:  # fmt: skip
            proxy.wait_holding()
            proxy.cut()
            proxy.restore()
            _, err = relay.communicate(timeout=60)
        assert relay.returncode == EXIT_TEMPFAIL, err.decode()[-2000:]
        last = err.decode().strip().splitlines()[-1]
        assert last.startswith("accord: ConnectionLost: "), err.decode()[-2000:]
        assert "service='rabbitmq'" in last
        with subprocess.Popen(RELAY, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as relay:  # fmt: skip
            try:
                assert relay.stdout is not None
                assert "relay ready" in relay.stdout.readline()
            finally:
                relay.send_signal(signal.SIGTERM)
                relay.communicate(timeout=30)
        assert relay.returncode == 0
    finally:
        proxy.close()


def test_a_broker_silent_during_the_relay_start_is_one_line(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames
) -> None:
    """RabbitMQ stops answering, its connection left open, while the relay's start declares
    the topology (the proxy holds the exchange's declaration for good): the start gives up
    after its timeout with one line naming the broker, exit 75, instead of waiting for the
    heartbeats to give up (a minute or more)."""
    proxy = Proxy.of(amqp_url)
    env = _env(pg_dsn, proxy.url(amqp_url), broker_names)
    try:
        proxy.stall_on(demo_topology(broker_names.prefix).exchange.encode())
        started = time.monotonic()
        done = subprocess.run(RELAY, env=env, cwd=ROOT, capture_output=True, timeout=60)
        took = time.monotonic() - started
    finally:
        proxy.close()
    assert done.returncode == EXIT_TEMPFAIL, done.stderr.decode()[-2000:]
    last = done.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("accord: ServiceUnavailable: "), last
    assert "service='rabbitmq'" in last and "declaration" in last
    assert took < 30, took
