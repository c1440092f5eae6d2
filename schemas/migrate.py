"""The migrator: forward-only numbered SQL files, one advisory lock, a checksum ledger.

Invariant: the ledger ``schemas.migrations`` lists exactly the files applied, each with
the SHA-256 of its text when applied. A changed applied file is refused
(MigrationTampered); an unknown applied version is refused (SchemaAhead); a pending file
numbered below an applied one is refused (it would apply out of order); each
pending file is applied in its own transaction together with its ledger row, so a
failed file leaves nothing half-applied. Files are plain SQL that psql can run.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from schemas import sql
from schemas.db import connect
from schemas.errors import MigrationError, MigrationTampered, SchemaAhead, SchemaBehind

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Status:
    applied: tuple[int, ...]
    pending: tuple[int, ...]

    @property
    def current(self) -> bool:
        return not self.pending


def load_migrations() -> list[Migration]:
    """The migration files shipped in ``schemas/migrations``, ordered by version."""
    found: list[Migration] = []
    for entry in resources.files("schemas.migrations").iterdir():
        match = _FILE.match(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError("two migration files share a version", versions=versions)
    return found


async def _verify(conn: asyncpg.Connection, code: list[Migration]) -> Status:
    """Compare the ledger with the code; raise on tampering or a database ahead of the code."""
    if not await conn.fetchval(sql.LEDGER_EXISTS):
        return Status(applied=(), pending=tuple(m.version for m in code))
    by_version = {m.version: m for m in code}
    applied = await conn.fetch(sql.APPLIED)
    for row in applied:
        known = by_version.get(row["version"])
        if known is None:
            raise SchemaAhead(version=row["version"], name=row["name"])
        if known.checksum != row["checksum"]:
            raise MigrationTampered(
                version=row["version"],
                name=row["name"],
                recorded=row["checksum"][:12],
                on_disk=known.checksum[:12],
            )
    done = {row["version"] for row in applied}
    newest = max(done, default=0)
    late = [m.version for m in code if m.version not in done and m.version < newest]
    if late:
        # Forward-only: a file numbered below an applied one would run in a different order
        # here than on a fresh database, and the two schemas would drift apart.
        raise MigrationError(
            "a pending migration is numbered below one already applied; renumber it",
            pending=late,
            newest_applied=newest,
        )
    return Status(
        applied=tuple(sorted(done)),
        pending=tuple(m.version for m in code if m.version not in done),
    )


async def check(conn: asyncpg.Connection) -> Status:
    """Read-only: the database's migration status against the code. Never writes."""
    return await _verify(conn, load_migrations())


async def migrate(conn: asyncpg.Connection, *, through: int | None = None) -> list[int]:
    """Apply every pending migration (up to version ``through``, if given) under the advisory
    lock; returns the versions applied.

    Owns its transactions (one per file): call it from the CLI or a fixture, never
    from inside another transaction.
    """
    code = load_migrations()
    await conn.execute(sql.LOCK, sql.MIGRATION_LOCK_KEY)
    try:
        await conn.execute(sql.ENSURE_LEDGER)
        status = await _verify(conn, code)
        applied: list[int] = []
        for migration in code:
            if migration.version not in status.pending:
                continue
            if through is not None and migration.version > through:
                break
            async with conn.transaction():
                await conn.execute(migration.text)
                await conn.execute(
                    sql.RECORD, migration.version, migration.name, migration.checksum
                )
            applied.append(migration.version)
        return applied
    finally:
        await conn.execute(sql.UNLOCK, sql.MIGRATION_LOCK_KEY)


async def require_current_at(dsn: str) -> None:
    """Start-up check for a process: connect, refuse a schema older than the code, close."""
    conn = await connect(dsn)
    try:
        await require_current(conn)
    finally:
        await conn.close()


async def require_current(conn: asyncpg.Connection) -> None:
    """Refuse to start on a schema older than the code (SchemaBehind) or tampered/ahead."""
    status = await check(conn)
    if status.pending:
        raise SchemaBehind(pending=list(status.pending))
