"""Configuration and connection problems: one line naming what and where, and the right exit.

The real `accord` command for each problem. Permanent refusals (an unknown database user, a
database that does not exist, an invalid DSN, an unknown vhost, a refused broker login) stop
the process with exit status 2 and one line that names host:port, user, database or vhost
and what to do; they are never retried. A SIGTERM that arrives before a process has finished
starting ends it with exit 0. Faults come only from servers this test runs itself (a port
that accepts and never answers) or from names that do not exist: the shared services are
never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest

from accord import logs
from accord.cli import EXIT_REFUSED, EXIT_TEMPFAIL
from accord.demo import demo_topology
from accord.demo.job import DEFAULT_OWNER
from accord.jobs.runner import open_journal
from accord.jobs.runner.journal_records import Claim
from accord.schemas import topology
from accord.schemas.db import DB_CONNECTION_LOST, connect, connection_room, create_pool
from accord.schemas.errors import ServiceUnavailable
from tests.conftest import BrokerNames, delete_broker_names
from tests.integration.ops.proxy import Proxy
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "accord.demo:app"
pytestmark = pytest.mark.timeout(180)


def accord(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    return subprocess.run(
        [sys.executable, "-m", "accord", *args],
        env={**clean, "PYTHONPATH": str(ROOT), "ACCORD_APP": APP, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


#: The errors that say a service did not answer, took no writes or was lost: exit 75, where
#: every other error accord can name exits 2 (accord.cli).
TEMPFAIL = ("ServiceUnavailable", "ConnectionLost", "DatabaseReadOnly")


def one_line(done: subprocess.CompletedProcess[str], error: str, *names: str) -> str:
    expected = EXIT_TEMPFAIL if error in TEMPFAIL else EXIT_REFUSED
    assert done.returncode == expected, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"accord: {error}: "), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def with_db(dsn: str, *, user: str | None = None, database: str | None = None) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc if user is None else f"{user}@{parts.hostname}:{parts.port or 5432}"
    path = parts.path if database is None else f"/{database}"
    return urlunsplit(parts._replace(netloc=netloc, path=path))


def with_amqp(url: str, *, password: str | None = None, vhost: str | None = None) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if password is not None:
        netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port or 5672}"
    path = parts.path if vhost is None else f"/{vhost}"
    return urlunsplit(parts._replace(netloc=netloc, path=path))


def test_a_database_user_that_does_not_exist(pg_dsn: str) -> None:
    user = f"nobody_{uuid.uuid4().hex[:8]}"
    dsn = with_db(pg_dsn, user=user)
    for command in (["status"], ["relay"], ["worker", "--workflow", "report"]):
        line = one_line(accord(*command, ACCORD_PG_DSN=dsn), "DatabaseLoginRefused", user)
        assert "at='127.0.0.1:" in line and "fix the DSN that names it (ACCORD_PG_DSN" in line


def test_a_database_that_does_not_exist_names_accord_migrate(pg_dsn: str) -> None:
    name = f"missing_{uuid.uuid4().hex[:8]}"
    dsn = with_db(pg_dsn, database=name)
    for command in (["status"], ["relay"], ["consume", "--workflow", "report", "--tenant", "*"]):
        line = one_line(accord(*command, ACCORD_PG_DSN=dsn), "DatabaseMissing", name)
        assert "`accord migrate` creates it" in line
    checked = accord("migrate", "--check", ACCORD_PG_DSN=dsn)
    assert checked.returncode == 1 and "`accord migrate` creates it" in checked.stdout


@contextlib.asynccontextmanager
async def login_role(admin_dsn: str, options: str = "") -> AsyncIterator[str]:
    """A login role of this test's own (``options`` as CREATE ROLE takes them), dropped at
    the end: a user with limits or without privileges, on the shared server, touching
    nothing else."""
    name = f"t_role_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f"CREATE ROLE {name} LOGIN {options}")
        yield name
    finally:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name
        )
        await admin.execute(f"DROP ROLE IF EXISTS {name}")
        await admin.close()


async def test_a_role_at_its_connection_limit_is_transient(pg_dsn: str, pg_admin_dsn: str) -> None:
    """PostgreSQL refuses a connection past the role's CONNECTION LIMIT (or the server's
    max_connections) with 53300: that passes once others close theirs, so it is
    ServiceUnavailable (a serving process's loops retry it; a start ends with one line, exit
    75), not asyncpg's TooManyConnectionsError escaping as a traceback (before: exit 1, and a
    serving loop that met it crashed). Control: with the limit lifted, the same user
    connects."""
    async with login_role(pg_admin_dsn, "CONNECTION LIMIT 0") as role:
        dsn = with_db(pg_dsn, user=role)
        with pytest.raises(ServiceUnavailable) as refused:
            await connect(dsn)
        assert isinstance(refused.value, DB_CONNECTION_LOST)  # what every loop retries
        assert "too many connections" in str(refused.value)
        done = await asyncio.to_thread(accord, "status", ACCORD_PG_DSN=dsn)
        one_line(done, "ServiceUnavailable", "too many connections", "at='127.0.0.1:")
        admin = await asyncpg.connect(pg_admin_dsn)
        try:
            await admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT -1")
        finally:
            await admin.close()
        conn = await connect(dsn)  # control
        assert await conn.fetchval("SELECT current_user") == role
        await conn.close()


async def test_a_worker_pool_larger_than_its_login_may_hold_is_a_refusal(
    pg_dsn: str, pg_admin_dsn: str, tmp_path: Path
) -> None:
    """`accord worker` opens its whole pool at the start (2 x concurrency + 5). A login whose
    CONNECTION LIMIT is below that met 53300 at every start, ServiceUnavailable, exit 75: a
    supervisor restarted it for ever. It is a refusal naming both numbers, exit 2, before
    anything connects past the check. Control: the room the check reads follows the role's
    limit, a superuser (the test's own DSN) is held to max_connections alone, and through a
    proxy (as through PgBouncer, whose own limits apply) it is not known: no refusal."""
    async with login_role(pg_admin_dsn, "CONNECTION LIMIT 5") as role:
        dsn = with_db(pg_dsn, user=role)
        env = {"ACCORD_PG_DSN": dsn, "ACCORD_JOURNAL_DIR": str(tmp_path / "journal"),
               "ACCORD_OBJECT_DIR": str(tmp_path / "objects")}  # fmt: skip
        done = await asyncio.to_thread(
            accord, "worker", "--workflow", "report", "--concurrency", "4", **env
        )
        one_line(done, "ConfigError", "CONNECTION LIMIT", "pool=13", "room=5")
        assert not (tmp_path / "journal").exists()
        assert await connection_room(dsn) == 5
        admin = await asyncpg.connect(pg_admin_dsn)
        try:
            await admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT 20")
        finally:
            await admin.close()
        assert await connection_room(dsn) == 20  # control: 13 fit
        proxy = Proxy.of(dsn)
        try:
            assert await connection_room(proxy.url(dsn)) is None
        finally:
            proxy.close()
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        assert await connection_room(pg_dsn) == int(await admin.fetchval("SHOW max_connections"))
    finally:
        await admin.close()


@contextlib.contextmanager
def accord_logs() -> Iterator[io.StringIO]:
    """What accord's own log configuration writes to stderr meanwhile (then as it was)."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    err = io.StringIO()
    logs.configure("text", "INFO", stderr=err, stdout=io.StringIO())
    try:
        yield err
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
        root.setLevel(level)


async def test_a_pool_that_cannot_reopen_a_lost_connection_logs_one_line(
    pg_dsn: str, pg_admin_dsn: str
) -> None:
    """A pool connection the server ended, while the server refuses a new one (its login at
    CONNECTION LIMIT 0): asyncpg's pool retries in the background and logged a traceback at
    each try ('Failed to restore the pool connection floor'), every few seconds for as long
    as it lasted. One line naming the error's type instead (accord.logs)."""
    line = "postgresql: a lost pool connection not reopened yet (ServiceUnavailable: "

    async def logged() -> bool:
        return line in err.getvalue() and "too many connections" in err.getvalue()

    with accord_logs() as err:
        async with login_role(pg_admin_dsn) as role:
            pool = await create_pool(with_db(pg_dsn, user=role), min_size=1, max_size=1)
            try:
                admin = await asyncpg.connect(pg_admin_dsn)
                try:
                    await admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT 0")
                    await admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
                        role,
                    )
                finally:
                    await admin.close()
                await wait_for(logged, within=20)
            finally:
                await pool.close()
    assert "Traceback" not in err.getvalue(), err.getvalue()[-2000:]


def test_a_pool_floor_failure_that_is_no_server_s_keeps_its_traceback() -> None:
    """Control of the above: the pool's ``init`` runs at each reconnect too, and a defect there
    (not a server's failure) keeps its traceback rather than read as a retry."""
    with accord_logs() as err:
        try:
            raise TypeError("init() takes 1 positional argument")
        except TypeError:
            logging.getLogger("asyncpg.pool").warning(
                "Failed to restore the pool connection floor; retrying", exc_info=True
            )
    assert "Failed to restore the pool connection floor" in err.getvalue()
    assert "Traceback" in err.getvalue() and "builtins.TypeError" in err.getvalue()


async def test_migrate_by_a_user_without_the_privileges_is_one_line(
    empty_pg_dsn: str, pg_admin_dsn: str
) -> None:
    """`accord migrate` as a user that may not create the database, or may not create the
    migration ledger's schema in an existing one: one line naming what it was applying and
    what to do, exit 2, nothing applied (before: InsufficientPrivilegeError's traceback).
    Control: the same command as the administrator migrates that database."""
    async with login_role(pg_admin_dsn) as role:
        missing = f"missing_{uuid.uuid4().hex[:8]}"
        done = await asyncio.to_thread(
            accord, "migrate", ACCORD_PG_DSN=with_db(empty_pg_dsn, user=role, database=missing)
        )
        line = one_line(done, "MigrationRefused", "may not create it", "CREATEDB")
        done = await asyncio.to_thread(
            accord, "migrate", ACCORD_PG_DSN=with_db(empty_pg_dsn, user=role)
        )
        line = one_line(done, "MigrationRefused", "applying='the migration ledger")
        assert "superuser" in line
    admin = await asyncpg.connect(empty_pg_dsn)
    try:  # nothing applied
        assert await admin.fetchval("SELECT to_regclass('schemas.migrations')") is None
    finally:
        await admin.close()
    done = await asyncio.to_thread(accord, "migrate", ACCORD_PG_DSN=empty_pg_dsn)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_metrics_port_another_process_holds_is_one_line(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames
) -> None:
    """ACCORD_METRICS_PORT held by another process (two processes given one port, or a
    restart while the old one still stops): one line naming the port, exit 2 (before:
    OSError's traceback, exit 1). Control: once the port is free, the same relay serves."""
    exchanges, queues = demo_topology(broker_names.prefix).names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    env = {"ACCORD_PG_DSN": pg_dsn, "ACCORD_AMQP_URL": amqp_url,
           "ACCORD_TOPOLOGY_PREFIX": broker_names.prefix}  # fmt: skip
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    with holder:
        line = one_line(accord("relay", ACCORD_METRICS_PORT=str(port), **env), "ConfigError",
                        f"port={port}", "ACCORD_METRICS_PORT")  # fmt: skip
        assert "Address already in use" in line
    one_line(accord("relay", ACCORD_METRICS_PORT="70000", **env), "SettingsInvalid", "METRICS_PORT")
    one_line(accord("relay", ACCORD_METRICS_STATUS="maybe", **env), "SettingsInvalid",
             "ACCORD_METRICS_STATUS")  # fmt: skip
    with _start("relay", ACCORD_METRICS_PORT=str(port), **env) as relay:
        try:
            _wait_for_line(relay, "relay ready", within=30)
        finally:
            relay.send_signal(signal.SIGTERM)
            assert relay.wait(timeout=30) == 0


def test_a_journal_or_object_path_that_cannot_be_made(pg_dsn: str, tmp_path: Path) -> None:
    """The worker's journal or object store under a file (or without permission): one line
    naming the path, exit 2, not the file system's traceback (nor, for the objects, every
    job failing its put). Control: directories that can be made let the same worker start
    (it then stops on SIGTERM)."""
    env = {"ACCORD_PG_DSN": pg_dsn, "ACCORD_LEDGER_PATH": str(tmp_path / "authority.ledger"),
           "ACCORD_OBJECT_DIR": str(tmp_path / "objects")}  # fmt: skip
    register = ["register", "--workflow", "report", "--owner", DEFAULT_OWNER, "--who", "test"]
    assert accord(*register, **env).returncode == 0
    (tmp_path / "file").write_bytes(b"")
    bad = str(tmp_path / "file" / "journals" / "w.journal")
    line = one_line(accord("worker", "--workflow", "report", "--journal", bad, **env),
                    "JournalUnavailable", bad)  # fmt: skip
    assert "Not a directory" in line
    objects = str(tmp_path / "file" / "objects")  # the object store's, likewise, at the start
    line = one_line(accord("worker", "--workflow", "report", "--journal", bad,
                           **{**env, "ACCORD_OBJECT_DIR": objects}),
                    "ObjectStoreUnavailable", objects)  # fmt: skip
    assert "Not a directory" in line
    good = str(tmp_path / "journals" / "w.journal")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    argv = [sys.executable, "-m", "accord", "worker", "--workflow", "report", "--journal", good]
    with subprocess.Popen(
        argv, env={**clean, "PYTHONPATH": str(ROOT), "ACCORD_APP": APP, **env}, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as worker:  # fmt: skip
        try:
            assert worker.stdout is not None
            assert "worker ready" in worker.stdout.readline()  # the ready line, on stdout
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.communicate(timeout=30)
    assert worker.returncode == 0


def test_a_full_disk_at_the_worker_s_start_is_one_line(pg_dsn: str, tmp_path: Path) -> None:
    """A worker's start seals its journal's live segment into a new one (here one Claim
    record of an earlier run is left behind). With no room to write it (the process's file
    size limit, RLIMIT_FSIZE, at 16 bytes: EFBIG where a full disk gives ENOSPC), the start
    ends with one line naming the journal, exit 2, and the live segment stays as it was
    (before: OSError's traceback, exit 1). Control: without the limit, the same worker
    starts (and cuts the torn tail the second case left)."""
    env = {"ACCORD_PG_DSN": pg_dsn, "ACCORD_LEDGER_PATH": str(tmp_path / "authority.ledger"),
           "ACCORD_OBJECT_DIR": str(tmp_path / "objects")}  # fmt: skip
    register = ["register", "--workflow", "report", "--owner", DEFAULT_OWNER, "--who", "test"]
    assert accord(*register, **env).returncode == 0
    journal_path = tmp_path / "journals" / "w1.journal"

    async def earlier_run() -> None:
        journal = open_journal(journal_path, "w1")
        try:
            await journal.write(Claim(tenant="t", job_id=1, attempt_id=uuid.uuid4(), generation=1))
        finally:
            journal.close()

    asyncio.run(earlier_run())
    before = journal_path.read_bytes()
    limit = 16  # bytes: a new segment's header alone is more
    argv = [sys.executable, "-m", "accord", "worker", "--workflow", "report",
            "--journal", str(journal_path)]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}

    def start_without_room() -> str:
        full = subprocess.run(
            argv, env={**clean, "PYTHONPATH": str(ROOT), "ACCORD_APP": APP, **env}, cwd=ROOT,
            capture_output=True, text=True, timeout=60, check=False,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
        )  # fmt: skip
        line = one_line(full, "JournalUnavailable", str(journal_path))
        assert "File too large" in line
        return line

    start_without_room()
    assert journal_path.read_bytes() == before  # the live segment untouched
    # A torn tail (a second record cut short) is quarantined and cut at the start: with no
    # room for the quarantine's copy, the same line, and the journal as it was.
    asyncio.run(earlier_run())
    torn = journal_path.read_bytes()[:-5]
    journal_path.write_bytes(torn)
    start_without_room()
    assert journal_path.read_bytes() == torn
    with _start("worker", "--workflow", "report", "--journal", str(journal_path), **env) as worker:
        try:
            _wait_for_line(worker, "worker ready", within=30)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=30) == 0


def test_an_invalid_dsn_and_an_invalid_url(pg_dsn: str) -> None:
    one_line(accord("status", ACCORD_PG_DSN="host=localhost dbname=x"), "InvalidDsn", "DSN")
    one_line(accord("status", ACCORD_RELAY_IN_FLIGHT="-3"), "SettingsInvalid", "RELAY_IN_FLIGHT")
    # A port that is not a number, in either URL; a duration that is not finite (before: a
    # traceback, and a relay that said ready with an infinite lease, then crashed).
    bad_port = "postgresql://postgres@127.0.0.1:abc/x"
    one_line(accord("status", ACCORD_PG_DSN=bad_port), "InvalidDsn", "abc")
    env = {"ACCORD_PG_DSN": pg_dsn, "ACCORD_AMQP_URL": "amqp://guest:guest@127.0.0.1:abc/"}
    one_line(accord("relay", **env), "InvalidDsn", "ACCORD_AMQP_URL")
    one_line(accord("status", ACCORD_RELAY_LEASE_S="inf"), "SettingsInvalid", "RELAY_LEASE_S")


def test_an_unknown_vhost_stops_the_relay_and_the_consumer(pg_dsn: str, amqp_url: str) -> None:
    vhost = f"no_such_vhost_{uuid.uuid4().hex[:8]}"
    url = with_amqp(amqp_url, vhost=vhost)
    env = {"ACCORD_PG_DSN": pg_dsn, "ACCORD_AMQP_URL": url}
    for command in (["relay"], ["consume", "--workflow", "report", "--tenant", "*"]):
        line = one_line(accord(*command, **env), "BrokerVhostRefused", vhost)
        assert "rabbitmqctl add_vhost" in line and "at='127.0.0.1:" in line


@pytest.fixture
def demo_names(amqp_url: str) -> Iterator[str]:
    """A topology prefix of this test's own; the demo topology a process declared under it
    is deleted afterwards (a sync test's broker_names)."""
    names = BrokerNames(prefix=f"t{uuid.uuid4().hex[:10]}")
    yield names.prefix
    names.exchanges, names.queues = (list(n) for n in demo_topology(names.prefix).names())
    asyncio.run(delete_broker_names(amqp_url, names))


def test_a_refused_broker_login_stops_the_consumer_within_seconds(
    pg_dsn: str, amqp_url: str, demo_names: str
) -> None:
    """Control first: with the right password the consumer serves (SIGTERM ends it, 0)."""
    env = {"ACCORD_PG_DSN": pg_dsn, "ACCORD_AMQP_URL": amqp_url, "ACCORD_CONSUMER_TENANTS": "*",
           "ACCORD_TOPOLOGY_PREFIX": demo_names}  # fmt: skip
    with _start("consume", "--workflow", "report", **env) as good:
        try:
            _wait_for_line(good, "consumer ready", within=30)
        finally:
            good.send_signal(signal.SIGTERM)
            assert good.wait(timeout=30) == 0
    refused_env = {**env, "ACCORD_AMQP_URL": with_amqp(amqp_url, password="wrong-password")}
    started = time.monotonic()
    done = accord("consume", "--workflow", "report", **refused_env)
    elapsed = time.monotonic() - started
    line = one_line(done, "BrokerLoginRefused", "user='guest'", "vhost='/'")
    assert "wrong-password" not in line  # the password is never printed
    assert elapsed < 15, elapsed  # stopped, not retried for ever


async def test_a_topology_the_broker_holds_otherwise_stops_the_relay(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames
) -> None:
    """A queue of the application's topology already declared with another delivery limit
    (a queue's arguments cannot change in place): the relay's start refuses with one line
    naming the exchange and the broker's own words, exit 2 (before: aiormq's
    ChannelPreconditionFailed traceback, exit 1). Control: once that queue is gone, the same
    relay declares the topology and says ready."""
    code = demo_topology(broker_names.prefix)
    exchanges, queues = code.names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    first = code.workflows[0]
    other = topology.Topology(
        code.prefix, (replace(first, delivery_limit=first.delivery_limit + 4),)
    )
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await topology.declare(await connection.channel(), other)
    env = {"ACCORD_PG_DSN": pg_dsn, "ACCORD_AMQP_URL": amqp_url,
           "ACCORD_TOPOLOGY_PREFIX": broker_names.prefix}  # fmt: skip
    done = await asyncio.to_thread(accord, "relay", **env)
    line = one_line(done, "ConfigError", code.exchange, "x-delivery-limit")
    assert "differs from the code's" in line
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await (await connection.channel()).queue_delete(code.queue(first.workflow))
    with _start("relay", **env) as relay:
        try:
            await asyncio.to_thread(_wait_for_line, relay, "relay ready", within=30)
        finally:
            relay.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(relay.wait, 30) == 0


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port of this test's own that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server.getsockname()[1]


@pytest.mark.parametrize(
    "command",
    [["relay"], ["consume", "--workflow", "report", "--tenant", "*"]],
    ids=["relay", "consume"],
)
def test_sigterm_before_the_process_serves_exits_0(
    command: list[str], pg_dsn: str, silent_port: int
) -> None:
    env = {
        "ACCORD_PG_DSN": pg_dsn,
        "ACCORD_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{silent_port}/",
    }
    with _start(*command, **env) as process:
        time.sleep(2.0)  # connecting to a broker that never answers: not serving yet
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def _start(*args: str, **env: str) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    return subprocess.Popen(
        [sys.executable, "-m", "accord", *args],
        env={**clean, "PYTHONPATH": str(ROOT), "ACCORD_APP": APP, **env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_line(process: subprocess.Popen[str], text: str, *, within: float) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + within
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"no {text!r} within {within}s: {''.join(seen)[-2000:]}")


def test_passive_topology_checks_and_says_what_is_missing(pg_dsn: str, amqp_url: str) -> None:
    """ACCORD_TOPOLOGY_DECLARE=false: the processes only check the topology (no configure
    permission needed); a missing one is one line, not a traceback, for relay and consumer."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    env = {"ACCORD_PG_DSN": pg_dsn, "ACCORD_AMQP_URL": amqp_url, "ACCORD_TOPOLOGY_PREFIX": prefix,
           "ACCORD_TOPOLOGY_DECLARE": "false"}  # fmt: skip
    one_line(accord("relay", **env), "ConfigError", f"{prefix}.events")
    one_line(
        accord("consume", "--workflow", "report", "--tenant", "*", **env),
        "ConfigError",
        "topology differs",
    )


async def test_a_start_whose_schema_check_the_server_cancels_is_one_line(
    pg_dsn: str, pg_admin_dsn: str
) -> None:
    """A login whose statements the server cancels (a statement_timeout of 1 ms): the start's
    schema check is ServiceUnavailable naming it, one line, exit 75 (before: a
    QueryCanceledError traceback, exit 1)."""
    async with login_role(pg_admin_dsn, "SUPERUSER") as role:
        admin = await asyncpg.connect(pg_admin_dsn)
        try:
            await admin.execute(f"ALTER ROLE {role} SET statement_timeout = '1ms'")
        finally:
            await admin.close()
        dsn = with_db(pg_dsn, user=role)
        done = await asyncio.to_thread(accord, "relay", ACCORD_PG_DSN=dsn)
        one_line(done, "ServiceUnavailable", "the schema check: QueryCanceledError")
