"""Fixtures on real services: PostgreSQL from TEST_PG_DSN, RabbitMQ from TEST_AMQP_URL.

Loopback defaults; testcontainers only when a Docker engine answers. Each test gets
its own database cloned from a migrated template and its own broker names. Without
services, tests skip locally and fail when CI is set (tests.support.unavailable).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest

from accord.demo import app as demo_app
from accord.schemas import migrate
from tests.databases import DatabaseSupply
from tests.support import docker_answers, unavailable, unique

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def with_database(dsn: str, name: str) -> str:
    """The same server DSN pointing at another database."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


async def _probe_pg(dsn: str) -> str | None:
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


async def _probe_amqp(url: str) -> str | None:
    try:
        conn = await aio_pika.connect(url, timeout=5)
    except (OSError, aio_pika.exceptions.AMQPError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """A DSN with CREATE DATABASE rights: TEST_PG_DSN, loopback, or a testcontainer."""
    dsn = os.environ.get("TEST_PG_DSN", DEFAULT_PG)
    problem = asyncio.run(_probe_pg(dsn))
    if problem is None:
        yield dsn
        return
    if docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15", driver=None) as container:
            yield container.get_connection_url()
        return
    unavailable(f"PostgreSQL at {dsn} unavailable ({problem}); set TEST_PG_DSN")


@pytest.fixture(scope="session")
def pg_template(pg_admin_dsn: str) -> Iterator[str]:
    """A database migrated once per session; every test clones it."""
    name = unique("accord_tpl_")

    async def setup() -> None:
        admin = await asyncpg.connect(pg_admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        conn = await asyncpg.connect(with_database(pg_admin_dsn, name))
        try:
            await migrate.migrate(conn, app_chains=demo_app.migration_chains())
        finally:
            await conn.close()

    async def teardown() -> None:
        admin = await asyncpg.connect(pg_admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    asyncio.run(setup())
    yield name
    asyncio.run(teardown())


@asynccontextmanager
async def fresh_database(admin_dsn: str, prefix: str) -> AsyncIterator[str]:
    """A new, empty database, dropped afterwards."""
    name = unique(prefix)
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield with_database(admin_dsn, name)
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture(scope="session")
def pg_databases(pg_admin_dsn: str, pg_template: str) -> Iterator[DatabaseSupply]:
    """Clones of the migrated template, made ahead of the tests that take them."""
    supply = DatabaseSupply(pg_admin_dsn, pg_template, prefix="accord_t_")
    yield supply
    supply.close()


@pytest.fixture
async def pg_dsn(pg_admin_dsn: str, pg_databases: DatabaseSupply) -> AsyncIterator[str]:
    """A fresh database for this test, cloned from the migrated template."""
    name = await asyncio.to_thread(pg_databases.take)
    try:
        yield with_database(pg_admin_dsn, name)
    finally:
        pg_databases.give_back(name)


@pytest.fixture
async def empty_pg_dsn(pg_admin_dsn: str) -> AsyncIterator[str]:
    """A fresh, never-migrated database (for migrator tests and restores)."""
    async with fresh_database(pg_admin_dsn, "accord_e_") as dsn:
        yield dsn


@pytest.fixture
async def pg(pg_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """One connection to this test's migrated database."""
    conn = await asyncpg.connect(pg_dsn)
    yield conn
    await conn.close()


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """RabbitMQ: TEST_AMQP_URL, loopback, or a testcontainer."""
    url = os.environ.get("TEST_AMQP_URL", DEFAULT_AMQP)
    problem = asyncio.run(_probe_amqp(url))
    if problem is None:
        yield url
        return
    if docker_answers():
        from testcontainers.rabbitmq import RabbitMqContainer

        with RabbitMqContainer("rabbitmq:3.13") as container:
            params = container.get_connection_params()
            yield f"amqp://guest:guest@{params.host}:{params.port}/"
        return
    unavailable(f"RabbitMQ at {url} unavailable ({problem}); set TEST_AMQP_URL")


@dataclass
class BrokerNames:
    """This test's own broker namespace; everything declared under it is deleted afterwards."""

    prefix: str
    exchanges: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)

    def exchange(self, name: str) -> str:
        full = f"{self.prefix}.{name}"
        self.exchanges.append(full)
        return full

    def queue(self, name: str) -> str:
        full = f"{self.prefix}.{name}"
        self.queues.append(full)
        return full


async def delete_broker_names(amqp_url: str, names: BrokerNames) -> None:
    """Delete the queues, then the exchanges, ``names`` holds (each on a channel of its own:
    a missing one closes its channel, never the rest)."""
    conn = await aio_pika.connect(amqp_url)
    try:
        for queue in names.queues:
            channel = await conn.channel()
            await channel.queue_delete(queue)
            await channel.close()
        for exchange in names.exchanges:
            channel = await conn.channel()
            await channel.exchange_delete(exchange)
            await channel.close()
    finally:
        await conn.close()


@pytest.fixture
async def broker_names(amqp_url: str) -> AsyncIterator[BrokerNames]:
    names = BrokerNames(prefix=unique("t"))
    yield names
    await delete_broker_names(amqp_url, names)
