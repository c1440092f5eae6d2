"""Small PostgreSQL helpers shared by every module: the transaction contract and connecting."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg

from accord.schemas.errors import (
    DatabaseLoginRefused,
    DatabaseMissing,
    InvalidDsn,
    MigrationRefused,
    NotInTransaction,
    RetentionTooShort,
    ServiceUnavailable,
)

#: The most rows one prune batch may take: every prune function refuses more (migration
#: 0023), and a batch is one short transaction. Configurations are checked against it.
MAX_PRUNE_BATCH = 10_000


#: The SQLSTATE with which jobs.prune and consumers.prune_poison refuse a retention shorter
#: than a declared replay horizon (migration 0027); DETAIL holds the horizon as JSON.
RETENTION_TOO_SHORT = "AR001"


@contextmanager
def retention_refusal(retention_s: float) -> Iterator[None]:
    """Raise RetentionTooShort (with the horizon and the consumer that declared it) where
    the database refused a prune's retention (AR001); any other error passes unchanged."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != RETENTION_TOO_SHORT:
            raise
        detail = json.loads(getattr(exc, "detail", None) or "{}")
        horizon_s = float(detail["horizon_s"])
        raise RetentionTooShort(
            f"a retention of {retention_s:.0f} s is shorter than the replay horizon consumer"
            f" {detail['consumer']!r} declared ({horizon_s:.0f} s): nothing was removed; set it"
            " to at least the horizon",
            retention_s=float(retention_s),
            horizon_s=horizon_s,
            consumer=detail["consumer"],
        ) from exc


class Tx(Protocol):
    """The caller's open transaction: an asyncpg connection inside ``conn.transaction()``.

    Every function that works in the caller's transaction (enqueue, reserve, submit, the
    fences, a handler, a publish callback) takes one and never commits it; this Protocol is
    what they may call on it, so mypy checks the convention (asyncpg itself is untyped).
    """

    async def execute(self, query: str, *args: Any) -> str: ...

    async def fetch(self, query: str, *args: Any) -> list[Any]: ...

    async def fetchrow(self, query: str, *args: Any) -> Any: ...

    async def fetchval(self, query: str, *args: Any, column: int = 0) -> Any: ...

    async def prepare(self, query: str) -> Any: ...

    def is_in_transaction(self) -> bool: ...


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

# DB_CONNECTION_LOST, and the server's errors after which the same statement may well pass
# if tried again later, on a connection still sound: a serialization failure or a deadlock
# (class 40), a statement cancelled (57014: statement_timeout, a cancel), a lock not granted
# in time (55P03: lock_timeout), the server short of resources (class 53: too many
# connections, disk full, out of memory), a server in recovery (25006: a standby, or a
# primary stepping down, answers every write read-only until a failover ends: promoted, or
# restarted and the connection lost). Each such statement was rolled back. A process's
# loops (claim, renew, record, rescue, prune, watch, relay, consume) log them, back off and
# try again, as after a lost connection: before, one ended the process, and a worker's
# effects in flight were recorded unknown.
DB_RETRY_LATER: tuple[type[BaseException], ...] = (
    *DB_CONNECTION_LOST,
    asyncpg.TransactionRollbackError,
    asyncpg.QueryCanceledError,
    asyncpg.LockNotAvailableError,
    asyncpg.InsufficientResourcesError,
    asyncpg.ReadOnlySQLTransactionError,
)

# The narrower set that only the server's end of a session raises: the session is over even
# when asyncpg has not yet read the end of the stream (``is_closed()`` still False after a
# 57P01). Not OSError, TimeoutError or InterfaceError in general: foreign code (a consumer's
# handler) raises those for its own reasons, on a connection that is still sound.
DB_SESSION_ENDED: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.ConnectionDoesNotExistError,
)


# A deadline on every statement (asyncpg's command_timeout): a black-holed TCP connection
# otherwise stalls a loop until the kernel gives up, minutes to hours later. Its
# TimeoutError is in DB_CONNECTION_LOST, so loops reconnect. `accord migrate` passes None.
DEFAULT_COMMAND_TIMEOUT_S = 60.0


# The name this process's connections give PostgreSQL (pg_stat_activity.application_name,
# %a in log_line_prefix, pg_stat_statements by application), set once at start by the
# `accord` command (``accord worker report``, ``accord relay``, ...). A DSN that names one
# (``?application_name=...``) or a caller's own server_settings keep theirs.
_application_name: str | None = None
# PostgreSQL truncates the name to NAMEDATALEN - 1 bytes.
_NAME_BYTES = 63


def name_connections(name: str | None) -> None:
    """Name every connection this process opens from now on (None: leave them unnamed)."""
    global _application_name
    _application_name = (
        None if name is None else name.encode()[:_NAME_BYTES].decode(errors="ignore")
    )


def _named(dsn: str, kwargs: dict[str, Any]) -> None:
    if _application_name is None:
        return
    try:
        in_dsn = "application_name" in parse_qs(urlsplit(dsn).query)
    except ValueError:
        return  # an unparsable DSN: asyncpg's own error says so (InvalidDsn)
    settings = dict(kwargs.get("server_settings") or {})
    if not in_dsn and "application_name" not in settings:
        settings["application_name"] = _application_name
        kwargs["server_settings"] = settings


def rows_affected(status: str) -> int:
    """The row count of an asyncpg command status such as ``UPDATE 3`` or ``INSERT 0 1``."""
    return int(status.rsplit(" ", 1)[-1])


def require_transaction(tx: Tx) -> None:
    """Raise NotInTransaction unless ``tx`` is an asyncpg connection inside an open transaction."""
    is_in = getattr(tx, "is_in_transaction", None)
    if is_in is None or not is_in():
        raise NotInTransaction()


def where(dsn: str) -> dict[str, str]:
    """Where a DSN points, for an error a person can act on: host:port, user, database (never
    the password)."""
    try:
        parts = urlsplit(dsn)
        port = parts.port or 5432
    except ValueError:
        return {"dsn": "unparsable"}
    return {
        "at": f"{parts.hostname or 'localhost'}:{port}",
        "user": parts.username or "(default)",
        "database": parts.path.lstrip("/") or "(default)",
    }


@contextmanager
def _mapped(dsn: str, kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Foreign connection errors, mapped once: what retrying cannot fix is a ServiceRefused
    (the process stops with one line); an unreachable server is ServiceUnavailable (its
    loops retry with the shared backoff)."""
    role = (kwargs.get("server_settings") or {}).get("role")
    extra = {"role": role} if role else {}
    try:
        yield
    except (asyncpg.ClientConfigurationError, ValueError) as exc:
        # ValueError: asyncpg's parse of the DSN (a port that is not a number, say).
        raise InvalidDsn(detail=str(exc)) from None
    except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError) as exc:
        raise DatabaseLoginRefused(
            f"PostgreSQL refused the login ({exc}): create the user, or fix the DSN that names"
            " it (ACCORD_PG_DSN; ACCORD_REPAIR_PG_DSN or ACCORD_LEDGER_PG_DSN where set)",
            **where(dsn),
            **extra,
        ) from None
    except (asyncpg.InvalidParameterValueError, asyncpg.InsufficientPrivilegeError) as exc:
        if not role:
            raise
        raise DatabaseLoginRefused(
            f"PostgreSQL refused the role ({exc}): run `accord migrate`, which creates the"
            " process roles and grants the migrating user membership",
            **where(dsn),
            **extra,
        ) from None
    except asyncpg.InvalidCatalogNameError:
        raise DatabaseMissing(**where(dsn)) from None
    except (OSError, asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError) as exc:
        # Too many connections (53300: the server's max_connections or the role's CONNECTION
        # LIMIT) passes when others close theirs: transient, as a server not up yet.
        raise ServiceUnavailable(service="postgresql", detail=str(exc), **where(dsn)) from exc


# The most connections this login may hold at once: the smallest of its role's and its
# database's CONNECTION LIMIT and the server's slots left to it (max_connections less those
# reserved for superusers, and on PostgreSQL 16 and later for pg_use_reserved_connections,
# unless it is a member); a superuser is held to max_connections alone. NULL when the server
# sees the connection come from another port than the client's own ($1): a pooler (PgBouncer)
# or a proxy is in between, whose own limits apply, not these.
CONNECTION_ROOM = """
SELECT CASE
    WHEN inet_client_port() IS DISTINCT FROM $1::int THEN NULL
    WHEN r.rolsuper THEN current_setting('max_connections')::int
    ELSE least(nullif(r.rolconnlimit, -1), nullif(d.datconnlimit, -1),
               current_setting('max_connections')::int
               - current_setting('superuser_reserved_connections')::int
               - CASE WHEN u.member THEN 0
                      ELSE coalesce(current_setting('reserved_connections', true)::int, 0) END)
END
FROM pg_roles r, pg_database d,
     (SELECT coalesce(bool_or(pg_has_role(session_user, p.oid, 'MEMBER')), false) AS member
      FROM pg_roles p WHERE p.rolname = 'pg_use_reserved_connections') u
WHERE r.rolname = session_user AND d.datname = current_database()
"""


async def connection_room(dsn: str) -> int | None:
    """How many connections the DSN's login may hold at once, whoever else holds some (None:
    not known: a pooler or a proxy is in between). A process that needs more at once can
    never start: that is a refusal to name, not a busy server to wait out (53300,
    ServiceUnavailable)."""
    conn = await connect(dsn)
    try:
        transport = getattr(conn, "_transport", None)  # asyncpg keeps its socket's there
        local = transport.get_extra_info("sockname") if transport is not None else None
        port = local[1] if isinstance(local, tuple) and len(local) >= 2 else None
        room: int | None = await conn.fetchval(CONNECTION_ROOM, port)
    finally:
        await conn.close()
    return room


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """Open one connection: ServiceUnavailable when unreachable (transient), a ServiceRefused
    (InvalidDsn, DatabaseLoginRefused, DatabaseMissing) when retrying cannot help."""
    kwargs.setdefault("command_timeout", DEFAULT_COMMAND_TIMEOUT_S)
    _named(dsn, kwargs)
    with _mapped(dsn, kwargs):
        return await asyncpg.connect(dsn, **kwargs)


async def ensure_database(dsn: str) -> bool:
    """Create the DSN's database if it does not exist (via the ``postgres`` database); True if made.

    Used by `accord migrate` so a fresh machine needs no manual createdb.
    """
    try:
        conn = await connect(dsn)
    except DatabaseMissing:
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
        except asyncpg.InsufficientPrivilegeError as exc:
            raise MigrationRefused(
                f"the database does not exist and this user may not create it ({exc}):"
                " create it as an administrator (createdb), or grant the user CREATEDB",
                **where(dsn),
            ) from None
        return True
    finally:
        await admin.close()


async def create_pool(dsn: str, **kwargs: Any) -> asyncpg.Pool:
    """Open a pool; errors mapped as :func:`connect` maps them, on every connection the pool
    opens: its first ones and each that replaces a lost one (an acquire after the server went
    away raises ServiceUnavailable, not the socket's error)."""
    kwargs.setdefault("command_timeout", DEFAULT_COMMAND_TIMEOUT_S)
    _named(dsn, kwargs)
    settings = dict(kwargs)

    async def connect_mapped(*args: Any, **pool_kwargs: Any) -> asyncpg.Connection:
        with _mapped(dsn, settings):
            return await asyncpg.connect(*args, **pool_kwargs)

    pool = await asyncpg.create_pool(dsn, connect=connect_mapped, **kwargs)
    assert pool is not None
    return pool
