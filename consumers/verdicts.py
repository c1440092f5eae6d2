"""Whose failure is it: a failure met while applying a batch is the message's content
(permanent: PostgreSQL refused it, ``database_refusal``), the process's (a missing grant:
``PrivilegeMissing`` stops the consumer), nobody's (a lost connection, a rebuild holding a
projection's guard: the batch goes back or waits, no retry counted), or else transient and
retried (consumers.batch classifies what is left)."""

from __future__ import annotations

from typing import Any

import asyncpg

from accord.consumers.errors import (
    ConnectionLost,
    DatabaseRefused,
    DataException,
    IntegrityViolation,
    PrivilegeMissing,
    StatementRefused,
)
from accord.schemas.db import DB_CONNECTION_LOST, DB_SESSION_ENDED

# SQLSTATE classes that say PostgreSQL will refuse this content every time.
_REFUSALS: dict[str, type[DatabaseRefused]] = {
    "22": DataException,  # data exception: 22P05 (jsonb: \u0000), 22021, 22001, 22P02, ...
    "23": IntegrityViolation,  # integrity constraint violation: 23514 CHECK, 23502, 23503, ...
    "42": StatementRefused,  # syntax error or access rule violation
}


def database_refusal(exc: BaseException) -> DatabaseRefused | None:
    """The one classification of a database error: a permanent DatabaseRefused (with the
    SQLSTATE and the names of the constraint, table and column, never values) when
    PostgreSQL refused the content (SQLSTATE class 22, 23 or 42); None for anything else,
    which stays transient: a lost connection (class 08 and asyncpg's connection errors), a
    serialization failure or deadlock (class 40), a timeout, a non-database error."""
    if not isinstance(exc, asyncpg.PostgresError) or isinstance(exc, DB_CONNECTION_LOST):
        return None
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return None  # 42501 is the process's missing grant, not the content (raise_if_privilege)
    sqlstate = getattr(exc, "sqlstate", None)
    if not isinstance(sqlstate, str):
        return None
    kind = _REFUSALS.get(sqlstate[:2])
    if kind is None:
        return None
    fields: dict[str, Any] = {"sqlstate": sqlstate, "postgres_error": type(exc).__name__}
    for name in ("schema", "table", "column", "constraint"):
        value = getattr(exc, f"{name}_name", None)
        if isinstance(value, str):
            fields[name] = value
    refused = kind(**fields)
    refused.__cause__ = exc
    return refused


def raise_if_privilege(exc: BaseException) -> None:
    """42501 is the process's grants, not a message's content: stop before anything is
    acked, whichever pass (a statement or the COMMIT) met it."""
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        raise PrivilegeMissing(
            table=getattr(exc, "table_name", None), detail=str(exc).splitlines()[0][:200]
        ) from exc


class GuardHeld(Exception):
    """A rebuild holds the projection's guard: the batch waits (BatchProcessor)."""


class ServerBusy(Exception):
    """The server takes no message's work now, whatever the message: read-only (25006: a
    standby, a primary stepping down) or short of resources (class 53). The batch waits and
    is applied again (BatchProcessor), as for a rebuild's guard: charged to each message as
    its own failure, a read-only window of seconds requeued every message at once until the
    broker's delivery limit dead-lettered sound ones, with no record."""


_SERVER_BUSY = (asyncpg.ReadOnlySQLTransactionError, asyncpg.InsufficientResourcesError)


def raise_if_lost(conn: Any, exc: BaseException) -> None:
    """A failure that ended the connection is a lost connection, not a message's fault: the
    batch's messages go back untouched with the channel, none counted as a retry. Read as
    the message's own failure, every message of the batch would be requeued as a retry, and
    a few such returns could poison a sound message as retries_exhausted. A rebuild holding
    the guard, and a server that takes no work now (read-only, out of resources), are no
    message's fault either (GuardHeld, ServerBusy: waited out by the batch)."""
    if isinstance(exc, GuardHeld | ServerBusy):
        raise exc
    if isinstance(exc, _SERVER_BUSY) and not conn.is_closed():
        raise ServerBusy(type(exc).__name__) from exc
    if conn.is_closed() or isinstance(exc, DB_SESSION_ENDED):
        raise ConnectionLost(service="postgresql", error=type(exc).__name__) from exc
