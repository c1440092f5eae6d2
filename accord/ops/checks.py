"""The readiness checks a process runs (accord.ops.health.Readiness). A check returns when the
dependency is fine and raises (a typed accord error where there is one) when it is not.

Each check looks over a connection it keeps between rounds (``Kept``): opened at the first
round, reused while rounds pass, closed after a round that fails (the next round opens a new
one, so a server that went away and came back is seen again) and when the rounds end. Before,
every round opened and closed its connections: two PostgreSQL backends forked and one AMQP
connection logged by RabbitMQ every two seconds in every process, for a question that one
round trip on an open connection answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import aio_pika.abc
import anyio
import asyncpg

from accord.jobs import registry
from accord.jobs.authority import AuthorityGate
from accord.jobs.errors import AuthorityUnchecked
from accord.ops.health import Check
from accord.relay.errors import BrokerBlocked
from accord.schemas import broker, migrate
from accord.schemas.db import connect
from accord.schemas.errors import DatabaseReadOnly

T = TypeVar("T")

# Does the server take writes? In recovery (a standby), or read-only by default for this
# connection (a server setting is seen at its reload), or for a new connection of this login
# to this database: a kept connection keeps the value it started with, while the process's
# pool opens new ones. Of ALTER ROLE/DATABASE ... SET default_transaction_read_only, the one
# a new connection applies wins (the role in this database, the role, the database, every
# role), and its value is read by PostgreSQL's own boolean input (on, t, yes, 1, ...).
READ_ONLY = """
SELECT pg_is_in_recovery()
    OR current_setting('transaction_read_only')::boolean
    OR COALESCE((
        SELECT substr(c.setting, strpos(c.setting, '=') + 1)::boolean
        FROM pg_catalog.pg_db_role_setting s, unnest(s.setconfig) AS c(setting)
        WHERE s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database d
                                    WHERE d.datname = current_database()))
          AND s.setrole IN (0, (SELECT r.oid FROM pg_catalog.pg_roles r
                                WHERE r.rolname = session_user))
          AND lower(split_part(c.setting, '=', 1)) = 'default_transaction_read_only'
        ORDER BY (s.setdatabase <> 0 AND s.setrole <> 0) DESC, (s.setrole <> 0) DESC,
                 (s.setdatabase <> 0) DESC
        LIMIT 1), false)
"""

#: How long closing a connection after a failed round may take.
CLOSE_S = 1.0


class Kept(Generic[T]):
    """One connection kept between the rounds that use it, per event loop (a connection
    belongs to the loop that opened it; ``Readiness.check_once`` runs a round on a loop of
    its own). A use takes the kept connection, or opens one when there is none or it has
    closed, and puts it back only if the use ended cleanly; ``aclose`` closes the one kept
    for the running loop (Readiness calls it when its rounds on that loop end)."""

    def __init__(
        self,
        open_: Callable[[], Awaitable[T]],
        close: Callable[[T], Awaitable[None]],
        closed: Callable[[T], bool],
    ) -> None:
        self._open, self._close, self._closed = open_, close, closed
        self._kept: dict[asyncio.AbstractEventLoop, T] = {}

    @asynccontextmanager
    async def use(self) -> AsyncIterator[T]:
        loop = asyncio.get_running_loop()
        thing = self._kept.pop(loop, None)  # taken: a concurrent use opens its own
        if thing is None or self._closed(thing):
            thing = await self._open()
        try:
            yield thing
        except BaseException:
            await self._shut(thing)
            raise
        self._kept[loop] = thing

    async def aclose(self) -> None:
        thing = self._kept.pop(asyncio.get_running_loop(), None)
        if thing is not None:
            await self._shut(thing)

    async def _shut(self, thing: T) -> None:
        # Shielded: a round cut short by its deadline still closes what it opened.
        # Best effort: the round has failed already, or the rounds are over.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(CLOSE_S),
            contextlib.suppress(Exception),
        ):
            await self._close(thing)


class Database(Kept[asyncpg.Connection]):
    """A PostgreSQL connection kept for the checks that share it (``postgresql``,
    ``registered``): one backend per process, not one per check."""

    def __init__(self, dsn: str) -> None:
        super().__init__(
            lambda: connect(dsn, timeout=2.0),
            lambda conn: conn.close(timeout=CLOSE_S),
            lambda conn: conn.is_closed(),
        )


class KeptCheck:
    """A check that looks over a kept connection; ``aclose`` closes it (Readiness)."""

    def __init__(self, kept: Kept[Any], look: Callable[[Any], Awaitable[None]]) -> None:
        self._kept, self._look = kept, look

    async def __call__(self) -> None:
        async with self._kept.use() as thing:
            await self._look(thing)

    async def aclose(self) -> None:
        await self._kept.aclose()


def _database(db: str | Database) -> Database:
    return Database(db) if isinstance(db, str) else db


def postgresql(
    db: str | Database, app_chains: Sequence[migrate.Chain] = (), *, writable: bool = True
) -> Check:
    """PostgreSQL answers and its schema is current (SchemaBehind otherwise); with
    ``writable`` (every process that writes), it takes writes too (DatabaseReadOnly: a
    standby, a primary stepping down, ``default_transaction_read_only``). Before, a process
    whose every write was refused read ready."""

    async def look(conn: asyncpg.Connection) -> None:
        await migrate.require_current(conn, app_chains)
        if writable and await conn.fetchval(READ_ONLY):
            raise DatabaseReadOnly()

    return "postgresql", KeptCheck(_database(db), look)


def registered(db: str | Database, workflow: str, owner: str) -> Check:
    """The job class is registered to this worker's owner (WorkflowNotRegistered, ...)."""

    async def look(conn: asyncpg.Connection) -> None:
        await registry.require(conn, workflow, owner)

    return "registration", KeptCheck(_database(db), look)


def authority(gate: AuthorityGate) -> Check:
    """A worker's authority gate is open: a check passed since its last new or lost database
    connection (AuthorityUnchecked otherwise: it claims nothing meanwhile)."""

    async def look() -> None:
        if not gate.is_open():
            raise AuthorityUnchecked()

    return "authority", look


def unblocked(blocked: Callable[[], bool]) -> Check:
    """A relay's publishing session is not blocked by the broker (BrokerBlocked: a memory or
    disk alarm; a check's own connection does not see it, as it publishes nothing)."""

    async def look() -> None:
        if blocked():
            raise BrokerBlocked()

    return "publishing", look


def rabbitmq(url: str, *, queue: str | None = None, exchange: str | None = None) -> Check:
    """RabbitMQ answers (a channel opened and closed on the kept connection: a round trip
    each) and, when named, the queue or exchange exists (a passive look on that channel)."""

    async def look(connection: aio_pika.abc.AbstractConnection) -> None:
        async with connection.channel() as channel:
            if queue is not None:
                await channel.get_queue(queue, ensure=True)
            if exchange is not None:
                await channel.get_exchange(exchange, ensure=True)

    kept: Kept[aio_pika.abc.AbstractConnection] = Kept(
        lambda: broker.connect(url, timeout=2.0),
        lambda connection: connection.close(),
        lambda connection: connection.is_closed,
    )
    return "rabbitmq", KeptCheck(kept, look)
