"""`/readyz` of a real `accord worker` means what it says: its PostgreSQL is reached through
a proxy of this test's own; cut, /readyz turns 503 naming postgresql within seconds;
restored, it is 200 again. /healthz and /metrics answer on the same port throughout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.cli import EXIT_TEMPFAIL
from accord.demo import demo_topology
from accord.demo.job import DEFAULT_OWNER
from accord.jobs import repair_sql
from accord.jobs.ledger import PgLedger
from tests.conftest import BrokerNames
from tests.integration.ops.proxy import Proxy
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(120)


def get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


def until(
    port: int, path: str, code: int, within: float, failing: set[str] | None = None
) -> tuple[float, dict[str, object]]:
    """Poll ``path`` until it answers ``code`` (and, given ``failing``, names exactly those
    failing checks); returns how long that took and the body."""
    started = time.monotonic()
    last: tuple[int, dict[str, object]] = (0, {})
    while time.monotonic() - started < within:
        try:
            last = get(port, path)
        except OSError:
            last = (0, {})
        named = last[1].get("failing")
        if last[0] == code and (
            failing is None or (isinstance(named, dict) and set(named) == failing)
        ):
            return time.monotonic() - started, last[1]
        time.sleep(0.2)
    raise AssertionError(f"{path} not {code} within {within}s: {last}")


@contextlib.contextmanager
def served(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running, its output in ``log``; on leaving, SIGTERM, and it must exit 0."""
    with (
        log.open("wb") as out,
        subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=out) as process,
    ):
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
    assert code == 0, log.read_text()[-2000:]


def held_then_ready(
    port: int, held: Proxy, log: Path, ready_line: bytes, also: dict[str, str] | None = None
) -> None:
    """While ``held`` holds what the start waits for, /readyz is 503 naming ``startup`` (and
    ``also``: a worker's authority, no check passed yet, while its database answers) and
    ``log`` has no ready line; once it lets the bytes through (the control), /readyz is 200
    and the ready line is there."""
    failing = {"startup": "starting", **(also or {})}
    _, body = until(port, "/readyz", 503, within=30, failing=set(failing))
    assert body == {"status": "not_ready", "failing": failing}
    time.sleep(1.0)  # still held: still starting
    assert get(port, "/readyz") == (503, body)
    assert ready_line not in log.read_bytes()
    held.restore()
    _, body = until(port, "/readyz", 200, within=30)
    assert body == {"status": "ready"}
    assert ready_line in log.read_bytes()


@pytest.fixture
def proxy(pg_dsn: str) -> Iterator[Proxy]:
    p = Proxy.of(pg_dsn)
    try:
        yield p
    finally:
        p.close()


def _worker_env(pg_dsn: str, proxy: Proxy, tmp_path: Path, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    return {**clean, "PYTHONPATH": str(ROOT), "ACCORD_APP": "accord.demo:app",
            "ACCORD_PG_DSN": proxy.url(pg_dsn),
            "ACCORD_JOURNAL_DIR": str(tmp_path / "journal"),
            "ACCORD_OBJECT_DIR": str(tmp_path / "objects"),
            "ACCORD_LEDGER_PATH": str(tmp_path / "authority.ledger"), **extra}  # fmt: skip


def _register(env: dict[str, str]) -> None:
    register = [sys.executable, "-m", "accord", "register", "--workflow", "report",
                "--owner", DEFAULT_OWNER, "--effects", "enabled", "--who", "test"]  # fmt: skip
    done = subprocess.run(register, env=env, cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


WORKER = [sys.executable, "-m", "accord", "worker", "--workflow", "report", "--poll-s", "0.2"]


# What /readyz of a worker names while its database is cut: the database, the class's
# registration, and the authority gate its claims wait on.
CUT = {"postgresql", "registration", "authority"}
# The authority watch's read of the tenants' epochs.
AUTHORITY_READ = repair_sql.TENANTS.encode()


def test_readyz_follows_the_database(pg_dsn: str, proxy: Proxy, tmp_path: Path) -> None:
    """The worker's database cut and restored while it serves: /readyz follows it, and the
    worker lives through it (its authority watch checks every 0.3 s here, so passes fail
    during the cut: before, the first one ended the worker with a traceback). While no
    authority check has passed since, it is not ready either (before, /readyz said ready
    while the worker claimed nothing)."""
    metrics_port = free_port()
    env = _worker_env(pg_dsn, proxy, tmp_path, ACCORD_METRICS_PORT=str(metrics_port),
                      ACCORD_LOG_FORMAT="json", ACCORD_AUTHORITY_CHECK_S="0.3")  # fmt: skip
    _register(env)
    worker = [*WORKER, "--rescue-every-s", "1"]
    log = (tmp_path / "worker.log").open("wb")
    with log, subprocess.Popen(worker, env=env, cwd=ROOT, stdout=log, stderr=log) as process:
        try:
            _, body = until(metrics_port, "/readyz", 200, within=30)  # control: ready
            assert body == {"status": "ready"}
            assert get(metrics_port, "/healthz")[0] == 200
            proxy.cut()
            took, body = until(metrics_port, "/readyz", 503, within=10, failing=CUT)
            assert took < 6, took
            assert get(metrics_port, "/healthz")[0] == 200  # alive, only not ready
            # The database back, but no authority check passes (its reads are held): the
            # worker claims nothing, and /readyz says so, naming only the authority.
            proxy.restore(stall_on=AUTHORITY_READ)
            _, body = until(metrics_port, "/readyz", 503, within=15, failing={"authority"})
            assert str(body["failing"]["authority"]).startswith("authority_unchecked")  # type: ignore[index]
            proxy.restore()
            took, _ = until(metrics_port, "/readyz", 200, within=15)
            assert took < 8, took
            assert process.poll() is None
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
    assert code == 0, (tmp_path / "worker.log").read_text()[-2000:]
    # runtime.stop_on_signals still prints its "worker: SIGTERM, draining" (not yet a log call)
    lines = [x for x in (tmp_path / "worker.log").read_text().splitlines()
             if not x.startswith("worker: SIGTERM")]  # fmt: skip
    records = [json.loads(x) for x in lines if x.startswith("{")]
    assert records and len(records) == len(lines), lines[:5]  # every line is one JSON object
    assert any(r["message"].startswith("worker ready") and r.get("event") == "ready"
               for r in records)  # fmt: skip


def test_readyz_waits_for_the_start_to_finish(
    pg_dsn: str, empty_pg_dsn: str, proxy: Proxy, tmp_path: Path
) -> None:
    """The worker's start checks its authority against the ledger, here a database of the
    test's own behind a second proxy that holds every byte: the readiness checks pass (its
    database answers, the class is registered) but the worker does not serve yet, so /readyz
    is 503 naming only ``startup``. Once the ledger answers, the start finishes and /readyz
    is 200 (the control). Before, /readyz said ready as soon as the checks passed, while the
    start could still fail."""
    asyncio.run(PgLedger(empty_pg_dsn).ensure())
    ledger = Proxy.of(empty_pg_dsn)
    metrics_port = free_port()
    env = _worker_env(pg_dsn, proxy, tmp_path, ACCORD_METRICS_PORT=str(metrics_port),
                      ACCORD_LEDGER_PG_DSN=ledger.url(empty_pg_dsn))  # fmt: skip
    _register(env)
    ledger.stall()
    try:
        with served(WORKER, env, tmp_path / "worker.log"):
            unchecked = {"authority": "authority_unchecked:AuthorityUnchecked"}
            held_then_ready(
                metrics_port, ledger, tmp_path / "worker.log", b"worker ready", also=unchecked
            )
    finally:
        ledger.close()


def test_a_session_lost_during_the_start_is_one_line(
    pg_dsn: str, empty_pg_dsn: str, proxy: Proxy, tmp_path: Path
) -> None:
    """The worker's database goes away while its start waits on the ledger (the flake that
    found this: a cut landing inside a slow start). The start's next call fails, and nothing
    in a start reconnects: the process ends with one line naming the lost PostgreSQL and exit
    75, for its supervisor to start it again, not with a driver's traceback (before: exit 1,
    ConnectionDoesNotExistError or ConnectionResetError from asyncpg)."""
    asyncio.run(PgLedger(empty_pg_dsn).ensure())
    ledger = Proxy.of(empty_pg_dsn)
    env = _worker_env(pg_dsn, proxy, tmp_path,
                      ACCORD_LEDGER_PG_DSN=ledger.url(empty_pg_dsn))  # fmt: skip
    _register(env)
    ledger.stall()
    try:
        with subprocess.Popen(
            WORKER, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as process:
            ledger.wait_holding()  # the start reached the ledger
            proxy.cut()
            ledger.restore()
            _, err = process.communicate(timeout=60)
    finally:
        ledger.close()
    assert process.returncode == EXIT_TEMPFAIL, err.decode()[-2000:]
    lines = err.decode().strip().splitlines()
    # The last line is the process's own (an uncaught error would end with its traceback):
    # the session that ended (ConnectionLost) or the pool's reconnect refused
    # (ServiceUnavailable), whichever the start's next call met first.
    last = lines[-1]
    assert last.startswith(("accord: ConnectionLost: ", "accord: ServiceUnavailable: ")), lines
    assert "service='postgresql'" in last


def test_healthz_turns_red_when_a_loop_is_stuck(pg_dsn: str, proxy: Proxy, tmp_path: Path) -> None:
    """The worker's database stops answering (the test's own proxy holds every byte): its
    claim loop blocks inside a query, stops reporting in, and /healthz turns 503 naming that
    loop within the grace; once the database answers again it is 200. Control: 200 first."""
    metrics_port = free_port()
    env = _worker_env(pg_dsn, proxy, tmp_path, ACCORD_METRICS_PORT=str(metrics_port),
                      ACCORD_HEALTH_GRACE_S="2")  # fmt: skip
    _register(env)
    worker = [*WORKER, "--rescue-every-s", "0"]
    log = (tmp_path / "worker.log").open("wb")
    with log, subprocess.Popen(worker, env=env, cwd=ROOT, stdout=log, stderr=log) as process:
        try:
            until(metrics_port, "/healthz", 200, within=30)  # control: alive
            time.sleep(1.0)
            assert get(metrics_port, "/healthz")[0] == 200
            proxy.stall()
            took, body = until(metrics_port, "/healthz", 503, within=15)
            assert "worker.claim.report" in json.dumps(body), body
            assert took < 8, took
            proxy.restore()
            until(metrics_port, "/healthz", 200, within=90)  # the blocked query times out
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=90)


def test_a_relay_whose_database_is_down_stays_live(
    pg_dsn: str, amqp_url: str, proxy: Proxy, broker_names: BrokerNames, tmp_path: Path
) -> None:
    """A real `accord relay` whose PostgreSQL is cut (the test's own proxy) is not ready but
    still alive: a restart would not bring the database back. Before, its publish loop
    stopped beating while it reconnected, and /healthz turned 503 ("stuck") after poll +
    publish timeout + grace. Control: 200 and ready first; ready again once restored."""
    exchanges, queues = demo_topology(broker_names.prefix).names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    metrics_port = free_port()
    env = _worker_env(pg_dsn, proxy, tmp_path, ACCORD_METRICS_PORT=str(metrics_port),
                      ACCORD_AMQP_URL=amqp_url, ACCORD_TOPOLOGY_PREFIX=broker_names.prefix,
                      ACCORD_HEALTH_GRACE_S="1", ACCORD_RELAY_POLL_S="0.2",
                      ACCORD_RELAY_PUBLISH_TIMEOUT_S="1")  # fmt: skip
    relay = [sys.executable, "-m", "accord", "relay"]
    with served(relay, env, tmp_path / "relay.log"):
        until(metrics_port, "/readyz", 200, within=30)  # control: ready and alive
        assert get(metrics_port, "/healthz")[0] == 200
        proxy.cut()
        until(metrics_port, "/readyz", 503, within=10)
        for _ in range(12):  # 6 s: three times poll + publish timeout + grace
            assert get(metrics_port, "/healthz")[0] == 200
            time.sleep(0.5)
        proxy.restore()
        until(metrics_port, "/readyz", 200, within=15)
        assert get(metrics_port, "/healthz")[0] == 200
