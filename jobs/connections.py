"""The jobs store's connections: the pool's, one a worker keeps, or one held for a sequence
of calls, each behind the seam that maps a connection lost in use to accord's ConnectionLost.

Internal to the jobs package (``jobs.store`` is their one user); the per-call costs are
measured by ``bench.jobs_bench --worker``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import asyncpg

from accord.schemas.db import DB_CONNECTION_LOST
from accord.schemas.errors import ConnectionLost, ServiceUnavailable


class Held:
    """The connection a worker keeps, as the context manager ``Store._connection`` returns
    (entering it is free: no acquire). A class, not ``asynccontextmanager``: a publish enters
    one per job, and the generator-based manager costs several times as much per call."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def lend(self) -> Held:
        return self

    async def __aenter__(self) -> Any:
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        return None


class Session:
    """One pool connection held across a sequence of calls (``Store.hold``): taken at the
    first call, kept while calls end cleanly, given back at the end.

    A call that ends in any exception (a lost connection, a cancellation that may have left a
    statement or a transaction half done, a refusal raised inside a transaction) gives the
    connection back to the pool at once, which resets it (a rollback releases any lock it
    held) or discards it, exactly as a pool call's release always did; the next call takes a
    fresh one. A held connection found closed between calls is replaced before use, as the
    pool replaces one. One call at a time runs on it: a call made while another is in flight
    (a handler's concurrent effects) takes its own pool connection for that call.

    With ``spares`` (``Store.keeping``), the first call takes a kept connection before the
    pool's, and a session that ends clean keeps its connection there, unreset (see Spares).
    """

    __slots__ = ("_busy", "_conn", "_pool", "_spares")

    def __init__(self, pool: asyncpg.Pool, spares: Spares | None = None) -> None:
        self._pool = pool
        self._spares = spares
        self._conn: Any = None
        self._busy = False

    def lend(self) -> Any:
        if self._busy:
            return self._pool.acquire()
        self._busy = True  # before any await: no other task can be lent it meanwhile
        return self

    async def __aenter__(self) -> Any:
        try:
            if self._conn is not None and not clean(self._conn):
                await self.close()
            if self._conn is None:
                self._conn = await self._take()
        except BaseException:
            self._busy = False
            raise
        return self._conn

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._busy = False
        if exc is not None or not clean(self._conn):
            await self.close()

    async def _take(self) -> Any:
        conn = None if self._spares is None else await self._spares.take()
        return conn if conn is not None else await self._pool.acquire()

    async def close(self, *, keep: bool = False) -> None:
        """Give the connection back to the pool (none held: nothing to do); with ``keep``,
        one that is clean goes to the spares instead, when there are spares."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if keep and self._spares is not None and clean(conn):
            await self._spares.keep(conn)
            return
        await give_back(self._pool, conn)


class Spares:
    """The connections a keeping store's holds ended with (``Store.keeping``), kept unreset
    for the next hold: on such a store each publish callback, the only application code
    that runs on them, ends in ``jobs.clean_session``, which resets the session's server
    state as the pool's reset query would. What a callback might add on the Python side (a
    log listener on ``tx``) is outside its contract (database writes).

    The most recently kept is taken first, and one kept longer than ``idle_s`` goes back to
    the pool, so after a burst the pool's own idle limit, where it has one, closes what is no
    longer needed (`accord worker`'s pool has none: it keeps every connection it opened).
    """

    __slots__ = ("_idle_s", "_kept", "_pool")

    def __init__(self, pool: asyncpg.Pool, idle_s: float) -> None:
        self._pool = pool
        self._idle_s = idle_s
        self._kept: list[tuple[Any, float]] = []  # (connection, kept at), oldest first

    async def take(self) -> Any:
        """The most recently kept clean connection, or None. Those kept longer than
        ``idle_s`` go back to the pool first (its reset, and any idle limit, then apply): after a
        quiet spell a kept connection a firewall may have dropped is not the next one used."""
        await self._expire(anyio.current_time())
        while self._kept:
            conn, _ = self._kept.pop()
            if clean(conn):
                return conn
            await give_back(self._pool, conn)
        return None

    async def keep(self, conn: Any) -> None:
        now = anyio.current_time()
        self._kept.append((conn, now))
        await self._expire(now)

    async def _expire(self, now: float) -> None:
        while self._kept and self._kept[0][1] < now - self._idle_s:
            await give_back(self._pool, self._kept.pop(0)[0])

    async def give_all(self) -> None:
        """Every kept connection back to the pool; shielded: it runs at shutdown too."""
        with anyio.CancelScope(shield=True):
            while self._kept:
                await give_back(self._pool, self._kept.pop()[0])


async def give_back(pool: asyncpg.Pool, conn: Any) -> None:
    """Release ``conn`` to ``pool``, which resets it. Never raises a lost connection: the
    pool's reset found it dead and discarded it, and the pool opens another when asked; what
    the calls on it did, they already reported."""
    # asyncpg shields the release: a cancellation here cannot lose the connection.
    with contextlib.suppress(*DB_CONNECTION_LOST):
        await pool.release(conn)


class Mapped:
    """One call's connection (the pool's acquire, or the held one) with the seam's mapping:
    a connection lost while in use leaves the store as accord's ConnectionLost, whatever
    asyncpg called it. A class, for the same per-call cost reason as ``Held``: it costs
    2-3 µs per call (``bench.jobs_bench --worker``), against 39 µs for the cheapest round
    trip on a held connection and 163 µs through a pool acquire and release."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def __aenter__(self) -> Any:
        try:
            return await self._inner.__aenter__()
        except DB_CONNECTION_LOST as exc:
            if isinstance(exc, ConnectionLost):
                raise
            raise lost(exc) from exc

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        suppressed = bool(await self._inner.__aexit__(exc_type, exc, tb))
        foreign = isinstance(exc, DB_CONNECTION_LOST) and not isinstance(exc, ConnectionLost)
        if exc is not None and foreign and not suppressed:
            raise lost(exc) from exc
        return suppressed


def clean(conn: Any) -> bool:
    """Open and outside any transaction. A pool's connection that the server cut is handed
    back to the pool by asyncpg itself, and its proxy then refuses every call: not clean."""
    try:
        return not (conn.is_closed() or conn.is_in_transaction())
    except asyncpg.InterfaceError:
        return False


def lost(exc: BaseException) -> ConnectionLost:
    """ConnectionLost naming the driver's or the socket's error: a pool's reconnect refused
    arrives as ServiceUnavailable (schemas.db.create_pool), whose cause names it."""
    cause = exc.__cause__ if isinstance(exc, ServiceUnavailable) and exc.__cause__ else exc
    return ConnectionLost(service="postgresql", error=type(cause).__name__)
