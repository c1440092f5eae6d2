"""Small PostgreSQL helpers shared by every module: the transaction contract and connecting."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from accord.schemas.errors import NotInTransaction, ServiceUnavailable

#: The caller's open transaction: an asyncpg connection inside ``conn.transaction()``. Every
#: function that writes in the caller's transaction (enqueue, reserve, submit, a handler)
#: takes one and never commits it.
Tx = asyncpg.Connection

# Errors that mean "the database connection is gone (or the server restarted)": reconnect
# and retry, never crash and never treat as a verdict. CrashShutdownError (57P02) is an
# OperatorInterventionError, not a PostgresConnectionError, so it is named explicitly.
# InternalClientError ("cannot switch to state 15; another operation (2) is in progress") is
# what asyncpg raises on the next statement when the server terminated an idle connection
# (pg_terminate_backend); the connection is unusable (MagicStack/asyncpg#784, #1069), so it
# is a lost connection too (tests/faults/test_relay_services.py).
DB_CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    ServiceUnavailable,
)


# A deadline on every statement (asyncpg's command_timeout): a black-holed TCP connection
# otherwise stalls a loop until the kernel gives up, minutes to hours later. Its
# TimeoutError is in DB_CONNECTION_LOST, so loops reconnect. `accord migrate` passes None.
DEFAULT_COMMAND_TIMEOUT_S = 60.0


def rows_affected(status: str) -> int:
    """The row count of an asyncpg command status such as ``UPDATE 3`` or ``INSERT 0 1``."""
    return int(status.rsplit(" ", 1)[-1])


def require_transaction(tx: Any) -> None:
    """Raise NotInTransaction unless ``tx`` is an asyncpg connection inside an open transaction."""
    is_in = getattr(tx, "is_in_transaction", None)
    if is_in is None or not is_in():
        raise NotInTransaction()


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """Open one connection; a refused or unreachable server becomes ServiceUnavailable."""
    kwargs.setdefault("command_timeout", DEFAULT_COMMAND_TIMEOUT_S)
    try:
        return await asyncpg.connect(dsn, **kwargs)
    except (OSError, asyncpg.CannotConnectNowError) as exc:
        raise ServiceUnavailable(service="postgresql", detail=str(exc)) from exc


async def ensure_database(dsn: str) -> bool:
    """Create the DSN's database if it does not exist (via the ``postgres`` database); True if made.

    Used by `accord migrate` so a fresh machine needs no manual createdb.
    """
    try:
        conn = await connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        pass
    else:
        await conn.close()
        return False
    params = urlsplit(dsn)
    name = params.path.lstrip("/")
    admin = await connect(urlunsplit(params._replace(path="/postgres")))
    try:
        quoted = await admin.fetchval("SELECT quote_ident($1)", name)
        try:
            await admin.execute(f"CREATE DATABASE {quoted}")
        except asyncpg.DuplicateDatabaseError:
            return False
        return True
    finally:
        await admin.close()


async def create_pool(dsn: str, **kwargs: Any) -> asyncpg.Pool:
    """Open a pool; a refused or unreachable server becomes ServiceUnavailable."""
    kwargs.setdefault("command_timeout", DEFAULT_COMMAND_TIMEOUT_S)
    try:
        pool = await asyncpg.create_pool(dsn, **kwargs)
    except (OSError, asyncpg.CannotConnectNowError) as exc:
        raise ServiceUnavailable(service="postgresql", detail=str(exc)) from exc
    assert pool is not None
    return pool
