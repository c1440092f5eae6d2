"""The readiness checks keep their connections between rounds (accord.ops.checks) on real
PostgreSQL and RabbitMQ: one PostgreSQL connection shared by the database checks and one
AMQP connection, however many rounds run; a round that fails drops its connection and the
next one opens a new one; stopping closes them. Opens are counted by wrapping the checks'
real connect functions."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aio_pika
import asyncpg
import pytest

from accord.commands import relay
from accord.demo.app import app as demo_app
from accord.jobs import Store
from accord.ops import checks
from accord.ops.health import Readiness
from accord.relay import Relay, RelayConfig
from accord.relay.errors import BrokerBlocked
from accord.schemas.settings import Settings

pytestmark = pytest.mark.timeout(60)
T = TypeVar("T")
READ_ONLY = "default_transaction_read_only"


def counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every connection the checks open, by kind (the real connect functions run)."""
    opened: dict[str, list[Any]] = {"postgresql": [], "rabbitmq": []}
    real_pg, real_amqp = checks.connect, checks.broker.connect

    async def pg(*args: Any, **kwargs: Any) -> Any:
        conn = await real_pg(*args, **kwargs)
        opened["postgresql"].append(conn.get_server_pid())
        return conn

    async def amqp(*args: Any, **kwargs: Any) -> Any:
        connection = await real_amqp(*args, **kwargs)
        opened["rabbitmq"].append(connection)
        return connection

    monkeypatch.setattr(checks, "connect", pg)
    monkeypatch.setattr(checks.broker, "connect", amqp)
    return opened


def until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def on_db(pg_dsn: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """``work`` on a connection of the test's own to its database (the main thread)."""

    async def run() -> T:
        conn = await asyncpg.connect(pg_dsn)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


def backends(pg_dsn: str, pids: list[int]) -> set[int]:
    """Which of ``pids`` still have a backend."""
    rows = on_db(
        pg_dsn,
        lambda conn: conn.fetch("SELECT pid FROM pg_stat_activity WHERE pid = ANY($1)", pids),
    )
    return {r["pid"] for r in rows}


def terminate(pg_dsn: str, pid: int) -> None:
    """Ends one backend of this test's own database (the checks' kept connection)."""
    assert on_db(pg_dsn, lambda conn: conn.fetchval("SELECT pg_terminate_backend($1)", pid))


def test_the_checks_keep_one_connection_each_across_rounds(
    pg_dsn: str, amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rounds on the readiness thread: one PostgreSQL connection (the schema and the
    registration checks share it) and one AMQP connection, however many rounds. Its backend
    ended, the next round opens a new one and passes. A round that fails (the schema behind)
    closes what it used, so each failing round opens anew; once it passes again the opening
    stops. Stopped: no backend left. Control: each ``check_once`` (a round on a loop of its
    own) opens and closes its own connection, as every round did before."""
    on_db(pg_dsn, lambda conn: Store(conn).register_workflow("report", "o"))
    opened = counting(monkeypatch)
    rounds: list[float] = []

    async def counted() -> None:
        rounds.append(time.monotonic())

    def more_rounds(n: int) -> None:
        at = len(rounds)
        until(lambda: len(rounds) >= at + n)

    db = checks.Database(pg_dsn)
    readiness = Readiness(
        [
            checks.postgresql(db),
            checks.registered(db, "report", "o"),
            checks.rabbitmq(amqp_url),
            ("rounds", counted),
        ],
        every_s=0.02,
        started=lambda: True,
    )
    readiness.start()
    try:
        more_rounds(20)
        assert readiness.failing() == {}
        assert len(opened["postgresql"]) == 1 and len(opened["rabbitmq"]) == 1, opened
        [first] = opened["postgresql"]

        terminate(pg_dsn, first)
        until(lambda: len(opened["postgresql"]) == 2)
        more_rounds(2)
        assert readiness.failing() == {} and backends(pg_dsn, [first]) == set()

        newest = schema_behind(pg_dsn)
        until(lambda: readiness.failing().get("postgresql", "").endswith("SchemaBehind"))
        at = len(opened["postgresql"])
        more_rounds(5)
        assert len(opened["postgresql"]) >= at + 4  # each failing round opened its own
        schema_current(pg_dsn, newest)
        until(lambda: readiness.failing() == {})
        more_rounds(2)
        at = len(opened["postgresql"])
        more_rounds(10)
        assert len(opened["postgresql"]) == at  # kept again
        assert len(opened["rabbitmq"]) == 1  # the broker's connection throughout
    finally:
        readiness.close()
    assert backends(pg_dsn, opened["postgresql"]) == set(), "stopping closes the kept one"
    assert all(c.is_closed for c in opened["rabbitmq"])

    # control: rounds on loops of their own open and close their connections each time
    at = len(opened["postgresql"])
    once = Readiness([checks.postgresql(pg_dsn)], started=lambda: True)
    for _ in range(3):
        assert once.check_once() == {}
    assert len(opened["postgresql"]) == at + 3
    assert backends(pg_dsn, opened["postgresql"][-3:]) == set()


def schema_behind(pg_dsn: str) -> asyncpg.Record:
    """The newest applied migration's row taken out: the database reads as behind."""
    row = on_db(
        pg_dsn,
        lambda conn: conn.fetchrow(
            "DELETE FROM schemas.migrations WHERE (component, version) ="
            " (SELECT component, version FROM schemas.migrations"
            "  WHERE component = 'accord' ORDER BY version DESC LIMIT 1) RETURNING *"
        ),
    )
    assert row is not None
    return row


def schema_current(pg_dsn: str, row: asyncpg.Record) -> None:
    columns = list(row.keys())
    on_db(
        pg_dsn,
        lambda conn: conn.execute(
            f"INSERT INTO schemas.migrations ({', '.join(columns)})"
            f" VALUES ({', '.join(f'${i + 1}' for i in range(len(columns)))})",
            *row.values(),
        ),
    )


def test_a_missing_queue_fails_the_check_and_drops_its_connection(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A passive look at a queue that does not exist: the check fails each round, and each
    failed round closes its connection instead of keeping a broken one."""
    opened = counting(monkeypatch)
    readiness = Readiness(
        [checks.rabbitmq(amqp_url, queue="accord-test-no-such-queue")], started=lambda: True
    )
    for _ in range(2):
        failing = readiness.check_once()
        assert set(failing) == {"rabbitmq"}, failing
    assert len(opened["rabbitmq"]) == 2 and all(c.is_closed for c in opened["rabbitmq"])


def test_a_relay_is_ready_only_with_the_exchange_it_publishes_to(
    pg_dsn: str, amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's `/readyz` looks at its exchange: under a topology prefix with no exchange
    declared it is not ready (before, it checked only that RabbitMQ answered, so a relay that
    could publish nothing said ready). Control: once the exchange exists, ready."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("ACCORD_PG_DSN", pg_dsn)
    monkeypatch.setenv("ACCORD_AMQP_URL", amqp_url)
    monkeypatch.setenv("ACCORD_TOPOLOGY_PREFIX", prefix)
    readiness = Readiness(relay.readiness_checks(Settings(), demo_app), started=lambda: True)
    assert set(readiness.check_once()) == {"rabbitmq"}
    exchange = demo_app.topology(prefix).exchange

    async def declare(declared: bool) -> None:
        connection = await aio_pika.connect(amqp_url)
        async with connection:
            channel = await connection.channel()
            if declared:
                await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
            else:
                await channel.exchange_delete(exchange)

    asyncio.run(declare(True))
    try:
        assert readiness.check_once() == {}
    finally:
        asyncio.run(declare(False))


def test_a_relay_blocked_by_the_broker_is_not_ready(pg_dsn: str, amqp_url: str) -> None:
    """A memory or disk alarm blocks only publishing connections, so the rabbitmq check (a
    connection that publishes nothing) passes through it: the relay's own session says
    whether it can publish (``Relay.blocked``, set while its connection is blocked; the
    fault test raises a real alarm on a node of its own). Control: unblocked, ready."""
    config = RelayConfig(pg_dsn=pg_dsn, amqp_url=amqp_url, exchange="e")
    made = Relay(config)
    named = dict(relay.readiness_checks(Settings(), demo_app, [made]))
    assert asyncio.run(named["publishing"]()) is None  # control
    made.blocked = True
    with pytest.raises(BrokerBlocked):
        asyncio.run(named["publishing"]())


async def writable(conn: asyncpg.Connection, statement: str) -> None:
    """``statement`` on a connection whose database defaults to read-only."""
    await conn.execute(f"SET {READ_ONLY} = off")
    await conn.execute(statement)


def test_a_database_that_takes_no_writes_is_not_ready_for_a_process_that_writes(
    pg_dsn: str,
) -> None:
    """A server that answers but refuses every write (a standby, a primary stepping down, or
    ``default_transaction_read_only``, as here on the test's own database) reads not ready
    with its own reason, for the processes that write, on the connection the rounds keep
    (which keeps the setting it started with, while the process's pool opens new ones);
    `accord metrics-serve`'s check, which only reads, stays ready. Of the settings, the one a
    new connection applies wins (the login's in this database over the database's), spelled
    as PostgreSQL reads booleans. Controls: both pass before, and the writer's passes again
    once the settings are reset. Before, every process read ready while each of its writes
    was refused."""
    writer = Readiness([checks.postgresql(pg_dsn)], every_s=0.02, started=lambda: True)
    reader = Readiness(
        [checks.postgresql(pg_dsn, writable=False)], every_s=0.02, started=lambda: True
    )
    writer.start()
    reader.start()
    try:
        name = pg_dsn.rsplit("/", 1)[1]
        until(lambda: writer.failing() == {} and reader.failing() == {})
        on_db(pg_dsn, lambda c: c.execute(f'ALTER DATABASE "{name}" SET {READ_ONLY} = on'))
        until(lambda: writer.failing() == {"postgresql": "database_read_only:DatabaseReadOnly"})
        assert reader.failing() == {}
        # the setting a new connection applies wins: this login's in this database (control)
        user = on_db(pg_dsn, lambda c: c.fetchval("SELECT session_user"))
        in_db = f'ALTER ROLE "{user}" IN DATABASE "{name}"'
        on_db(pg_dsn, lambda c: writable(c, f"{in_db} SET {READ_ONLY} = off"))
        until(lambda: writer.failing() == {})
        on_db(pg_dsn, lambda c: writable(c, f"{in_db} SET {READ_ONLY} = 'tr'"))  # true
        until(lambda: writer.failing() == {"postgresql": "database_read_only:DatabaseReadOnly"})
        on_db(pg_dsn, lambda c: writable(c, f"{in_db} RESET {READ_ONLY}"))
        on_db(pg_dsn, lambda c: writable(c, f'ALTER DATABASE "{name}" RESET {READ_ONLY}'))
        until(lambda: writer.failing() == {})
    finally:
        writer.close()
        reader.close()
