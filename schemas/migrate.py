"""The migrator: forward-only numbered SQL files, one advisory lock, a checksum ledger.

Two kinds of chain share the ledger ``schemas.migrations``: accord's own (component
``accord``, the files in ``accord/schemas/migrations``) and, after it, the chain of the
application this database serves (component = the application's name, its own directory).

Invariant: the ledger lists exactly the files applied, per component, each with the SHA-256
of its text when applied. A changed applied file is refused (MigrationTampered); an unknown
applied version is refused (SchemaAhead); a pending file numbered below an applied one of
its chain is refused (it would apply out of order); each pending file is applied in its own
transaction together with its ledger row, so a failed file leaves nothing half-applied; a
pending file that begins or ends a transaction itself (``BEGIN``, ``COMMIT``, ...) is refused
before any file is applied, since its COMMIT would commit part of it alone (MigrationFailed).
Files are plain SQL that psql can run.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import asyncpg

from accord.schemas import sql
from accord.schemas.db import DB_RETRY_LATER, connect
from accord.schemas.errors import (
    MigrationError,
    MigrationFailed,
    MigrationRefused,
    MigrationTampered,
    SchemaAhead,
    SchemaBehind,
    ServiceUnavailable,
)
from accord.schemas.statement import transaction_control

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
ACCORD = "accord"

#: Files of accord's own chain that 0.2.0 moved out (0007: an application's tables, now in
#: that application's own chain) or rewrote (0006: a comment; 0008: without that
#: application's projection table), by version, with the checksum 0.1 applied them with.
#: A database migrated by 0.1 has these rows: the migrator re-records them first (a moved
#: file's row goes, a rewritten file's row takes the current checksum; the objects they
#: created stay as they are), and a read-only check reports them as pending.
RETIRED: dict[int, str] = {
    6: "ed5d04c91a0f7fdfa9c69549863b65700f7fb26dc7339a0d1a72fce643fddf88",
    7: "679b5adf88576a1737aa54597d383ff4fd8a4aef614d57c04e8e5003c99612a5",
    8: "504dd9260c7cad2de538f8b7291d28b81b66a6505eee341326b82331b0804bfe",
}


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Chain:
    """One component's forward-only migrations, ordered by version."""

    component: str
    migrations: tuple[Migration, ...]


@dataclass(frozen=True, slots=True)
class Status:
    applied: tuple[int, ...]
    pending: tuple[int, ...]
    #: Pending files by component (accord's and the application's).
    pending_by_component: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def current(self) -> bool:
        return not self.pending


def _read(entries: Sequence[Traversable], where: str) -> tuple[Migration, ...]:
    found: list[Migration] = []
    for entry in entries:
        match = _FILE.match(entry.name)
        if match is None:
            if entry.name.lower().endswith(".sql"):
                # Skipped, it would leave the schema behind the code while every check
                # said current.
                raise MigrationError(
                    "a migration file must be named NNNN_name.sql (four digits, then"
                    " lowercase letters, digits and underscores): rename it",
                    where=where,
                    file=entry.name,
                )
            continue
        found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError("two migration files share a version", where=where, versions=versions)
    return tuple(found)


def load_migrations() -> list[Migration]:
    """The migration files shipped in ``accord/schemas/migrations``, ordered by version."""
    entries = list(resources.files("accord.schemas.migrations").iterdir())
    return list(_read(entries, "accord/schemas/migrations"))


def accord_chain() -> Chain:
    return Chain(ACCORD, tuple(load_migrations()))


def directory_chain(component: str, directory: Path | Traversable) -> Chain:
    """An application's chain: the ``NNNN_name.sql`` files of ``directory``."""
    if component == ACCORD:
        raise MigrationError("an application's migrations cannot use accord's component name")
    if not directory.is_dir():
        raise MigrationError(
            "the application's migration directory does not exist",
            component=component,
            directory=str(directory),
        )
    return Chain(component, _read(list(directory.iterdir()), str(directory)))


def _chains(app_chains: Sequence[Chain]) -> list[Chain]:
    return [accord_chain(), *app_chains]


async def _applied(conn: asyncpg.Connection, component: str) -> list[asyncpg.Record]:
    if not await conn.fetchval(sql.LEDGER_HAS_COMPONENT):
        return list(await conn.fetch(sql.APPLIED_LEGACY)) if component == ACCORD else []
    return list(await conn.fetch(sql.APPLIED, component))


def _retired(row: asyncpg.Record, chain: Chain) -> bool:
    """A row of accord's chain as 0.1 applied a file that 0.2 moved or rewrote."""
    return chain.component == ACCORD and RETIRED.get(row["version"]) == row["checksum"]


async def _verify_chain(conn: asyncpg.Connection, chain: Chain) -> tuple[set[int], list[int]]:
    by_version = {m.version: m for m in chain.migrations}
    applied = await _applied(conn, chain.component)
    done: set[int] = set()
    retired: list[int] = []
    for row in applied:
        if _retired(row, chain):
            retired.append(row["version"])
            continue
        known = by_version.get(row["version"])
        if known is None:
            raise SchemaAhead(component=chain.component, version=row["version"], name=row["name"])
        if known.checksum != row["checksum"]:
            raise MigrationTampered(
                component=chain.component,
                version=row["version"],
                name=row["name"],
                recorded=row["checksum"][:12],
                on_disk=known.checksum[:12],
            )
        done.add(row["version"])
    newest = max(done, default=0)
    late = [m.version for m in chain.migrations if m.version not in done and m.version < newest]
    # A rewritten file whose 0.1 row is still in the ledger is not "late": it is re-recorded.
    late = [v for v in late if v not in retired]
    if late:
        # Forward-only: a file numbered below an applied one would run in a different order
        # here than on a fresh database, and the two schemas would drift apart.
        raise MigrationError(
            "a pending migration is numbered below one already applied; renumber it",
            component=chain.component,
            pending=late,
            newest_applied=newest,
        )
    pending = [m.version for m in chain.migrations if m.version not in done]
    return done, sorted(set(pending) | set(retired))


async def _verify(conn: asyncpg.Connection, chains: Sequence[Chain]) -> Status:
    """Compare the ledger with the code; raise on tampering or a database ahead of the code."""
    if not await conn.fetchval(sql.LEDGER_EXISTS):
        every = [(c.component, tuple(m.version for m in c.migrations)) for c in chains]
        return Status((), tuple(v for _, vs in every for v in vs), tuple(every))
    applied: list[int] = []
    by_component: list[tuple[str, tuple[int, ...]]] = []
    for chain in chains:
        done, pending = await _verify_chain(conn, chain)
        applied.extend(sorted(done))
        by_component.append((chain.component, tuple(pending)))
    return Status(
        applied=tuple(applied),
        pending=tuple(v for _, vs in by_component for v in vs),
        pending_by_component=tuple(by_component),
    )


async def check(conn: asyncpg.Connection, app_chains: Sequence[Chain] = ()) -> Status:
    """Read-only: the database's migration status against the code. Never writes."""
    return await _verify(conn, _chains(app_chains))


async def _adopt_retired(conn: asyncpg.Connection) -> None:
    """Re-record the rows of accord's chain that 0.1 applied from files 0.2 moved or
    rewrote (RETIRED); the objects those files created are left as they are."""
    current = {m.version: m.checksum for m in load_migrations()}
    for version, old in RETIRED.items():
        if version in current:
            await conn.execute(sql.REWRITE, version, old, current[version])
        else:
            await conn.execute(sql.RETIRE, version, old)


async def migrate(
    conn: asyncpg.Connection, *, through: int | None = None, app_chains: Sequence[Chain] = ()
) -> list[tuple[str, int]]:
    """Apply every pending migration under the advisory lock: accord's own chain (up to
    version ``through``, if given), then each application chain; returns (component,
    version) of each file applied, in order.

    Owns its transactions (one per file): call it from the CLI or a fixture, never
    from inside another transaction.
    """
    chains = _chains(app_chains)
    await conn.execute(sql.LOCK, sql.MIGRATION_LOCK_KEY)
    try:
        async with conn.transaction():
            with _refused("the migration ledger (schema schemas)"):
                await conn.execute(sql.ENSURE_LEDGER)
            await _adopt_retired(conn)
        status = await _verify(conn, chains)
        pending = dict(status.pending_by_component)
        _refuse_transaction_control(chains, pending)
        applied: list[tuple[str, int]] = []
        for chain in chains:
            for migration in chain.migrations:
                if migration.version not in pending[chain.component]:
                    continue
                if (
                    chain.component == ACCORD
                    and through is not None
                    and migration.version > through
                ):
                    break
                async with conn.transaction():
                    with _refused(f"{chain.component} {migration.version:04d}_{migration.name}"):
                        await conn.execute(migration.text)
                    await conn.execute(
                        sql.RECORD,
                        chain.component,
                        migration.version,
                        migration.name,
                        migration.checksum,
                    )
                applied.append((chain.component, migration.version))
            if chain.component == ACCORD and through is not None:
                break  # an upgrade test stops accord's chain part-way: nothing may follow it
        return applied
    finally:
        await conn.execute(sql.UNLOCK, sql.MIGRATION_LOCK_KEY)


def _refuse_transaction_control(
    chains: Sequence[Chain], pending: dict[str, tuple[int, ...]]
) -> None:
    """MigrationFailed, before anything is applied, for a pending file that begins or ends a
    transaction itself: each file is applied in one transaction of its own, and a COMMIT in
    it would commit what came before alone (an error after it then left the file half
    applied, with no ledger row, and every later migrate failing on what did commit)."""
    for chain in chains:
        for migration in chain.migrations:
            if migration.version not in pending[chain.component]:
                continue
            control = transaction_control(migration.text)
            if control is not None:
                raise MigrationFailed(
                    applying=f"{chain.component} {migration.version:04d}_{migration.name}",
                    detail=f"the file runs {control} itself: accord applies each file in one"
                    " transaction of its own (remove the file's BEGIN/COMMIT)",
                )


@contextmanager
def _refused(what: str) -> Iterator[None]:
    """A privilege PostgreSQL refused the migrating user: MigrationRefused naming ``what``;
    any other error of its SQL (but a lost or busy server): MigrationFailed naming it. Its
    transaction rolls back either way: nothing of it applied."""
    try:
        yield
    except asyncpg.InsufficientPrivilegeError as exc:
        raise MigrationRefused(
            f"PostgreSQL refused the migrating user a privilege ({exc}): migrate as a superuser"
            " or as the database's owner with CREATEROLE",
            applying=what,
        ) from None
    except asyncpg.PostgresError as exc:
        if isinstance(exc, DB_RETRY_LATER):
            raise
        raise MigrationFailed(applying=what, sqlstate=exc.sqlstate, detail=str(exc)[:300]) from None


async def require_current_at(dsn: str, app_chains: Sequence[Chain] = ()) -> None:
    """Start-up check for a process: connect, refuse a schema older than the code, close. A
    server that cancels or cannot serve the check (a statement timeout, a lock not granted,
    a read-only server, a lost session) is ServiceUnavailable: one line at a start."""
    conn = await connect(dsn)
    try:
        await require_current(conn, app_chains)
    except DB_RETRY_LATER as exc:
        if isinstance(exc, ServiceUnavailable):
            raise
        raise ServiceUnavailable(
            service="postgresql", detail=f"the schema check: {type(exc).__name__}"
        ) from exc
    finally:
        await conn.close()


async def require_current(conn: asyncpg.Connection, app_chains: Sequence[Chain] = ()) -> None:
    """Refuse to start on a schema older than the code (SchemaBehind) or tampered/ahead."""
    status = await check(conn, app_chains)
    if status.pending:
        behind = {c: list(v) for c, v in status.pending_by_component if v}
        raise SchemaBehind(pending=behind)
