"""The readiness checks a process runs (accord.ops.health.Readiness): each opens what it
needs on the checker's own event loop, looks, and closes it again. A check returns when the
dependency is fine and raises (a typed accord error where there is one) when it is not."""

from __future__ import annotations

from collections.abc import Sequence

from accord.jobs import registry
from accord.ops.health import Check
from accord.schemas import broker, migrate
from accord.schemas.db import connect


def postgresql(dsn: str, app_chains: Sequence[migrate.Chain] = ()) -> Check:
    """PostgreSQL answers and its schema is current (SchemaBehind otherwise)."""

    async def check() -> None:
        conn = await connect(dsn, timeout=2.0)
        try:
            await migrate.require_current(conn, app_chains)
        finally:
            await conn.close(timeout=1.0)

    return "postgresql", check


def rabbitmq(url: str, *, queue: str | None = None, exchange: str | None = None) -> Check:
    """RabbitMQ answers (and, when named, the queue or exchange exists: a passive look)."""

    async def check() -> None:
        connection = await broker.connect(url, timeout=2.0)
        try:
            channel = await connection.channel()
            if queue is not None:
                await channel.get_queue(queue, ensure=True)
            if exchange is not None:
                await channel.get_exchange(exchange, ensure=True)
        finally:
            await connection.close()

    return "rabbitmq", check


def registered(dsn: str, workflow: str, owner: str) -> Check:
    """The job class is registered to this worker's owner (WorkflowNotRegistered, ...)."""

    async def check() -> None:
        conn = await connect(dsn, timeout=2.0)
        try:
            await registry.require(conn, workflow, owner)
        finally:
            await conn.close(timeout=1.0)

    return "registration", check
