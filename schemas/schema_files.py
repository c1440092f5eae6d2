"""The current SQL of each module, in one file per module, beside the forward-only migrations.

The migrations are the history (how a database got here: forward-only, checksummed); the
schema files are the present (what ``jobs.succeed`` *is* now, without replaying 0004, 0009,
0010 and 0011). Each module's file holds its PostgreSQL schema's tables, indexes,
constraints, functions, views, triggers, grants and comments:

    schemas/roles.sql        the cluster roles every module grants to (idempotent)
    schemas/schema.sql       ``schemas``: the migration ledger
    relay/schema.sql         ``relay``: the outbox
    consumers/schema.sql     ``consumers``: inbox, deliveries, poison
    jobs/schema.sql          ``jobs``: jobs, effects, the fence, authority, repair, waiting
    accord/ops/schema.sql    ``ops``: the replay ledger

They are generated from a freshly migrated database by ``pg_dump --schema-only`` (``make
schema``, i.e. ``python -m accord.schemas.schema_files``), so they cannot be hand-edited into
a state no migration reaches; tests/integration/test_schema_files.py builds one database from
the migrations and one from these files and compares their catalogs (and, as its control,
shows that an altered file is caught). A new migration therefore comes with ``make schema``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg

from accord.schemas import migrate

#: The ``accord`` package directory (in a checkout, accord/relay etc. link to the folders).
PACKAGE = Path(__file__).parent.parent
#: (PostgreSQL schema, its current-definition file), in the order a database is built.
MODULE_FILES: tuple[tuple[str, Path], ...] = (
    ("schemas", PACKAGE / "schemas" / "schema.sql"),
    ("relay", PACKAGE / "relay" / "schema.sql"),
    ("consumers", PACKAGE / "consumers" / "schema.sql"),
    ("jobs", PACKAGE / "jobs" / "schema.sql"),
    ("ops", PACKAGE / "ops" / "schema.sql"),
)
ROLES_FILE = PACKAGE / "schemas" / "roles.sql"

_HEADER = """\
-- The current definition of the `{schema}` schema: generated from a migrated database by
-- pg_dump (`make schema`); never edited by hand. The history (and the reasons, in comments)
-- is in schemas/migrations/; tests/integration/test_schema_files.py keeps the two equal.
"""
# pg_dump lines that carry no definition: version banners and psql-only meta-commands.
_NOISE = re.compile(r"^(\\(un)?restrict |-- Dumped (from|by) |-- PostgreSQL database dump)")


def clean(dump: str, schema: str) -> str:
    """A pg_dump of one schema as a schema file: banners and meta-commands removed."""
    lines = [line for line in dump.splitlines() if not _NOISE.match(line)]
    text = "\n".join(lines).strip() + "\n"
    text = re.sub(r"\n{3,}", "\n\n", text)
    return _HEADER.format(schema=schema) + "\n" + text


def dump(dsn: str) -> dict[Path, str]:
    """Each module's schema file as pg_dump writes it from the migrated database ``dsn``."""
    files: dict[Path, str] = {}
    for schema, path in MODULE_FILES:
        done = subprocess.run(
            ["pg_dump", "--schema-only", "--no-owner", "--schema", schema, dsn],
            capture_output=True,
            text=True,
            check=True,
        )
        files[path] = clean(done.stdout, schema)
    return files


def texts() -> list[str]:
    """The roles file, then every module's file, in build order."""
    return [ROLES_FILE.read_text(encoding="utf-8")] + [
        path.read_text(encoding="utf-8") for _, path in MODULE_FILES
    ]


async def _scratch(admin_dsn: str) -> dict[Path, str]:
    """Migrate a scratch database with accord's chain only, dump it, drop it."""
    name = f"accord_schema_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(admin_dsn)
    dsn = urlunsplit(parts._replace(path=f"/{name}"))
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            conn = await asyncpg.connect(dsn)
            try:
                await migrate.migrate(conn)
            finally:
                await conn.close()
            return dump(dsn)
        finally:
            await admin.execute(f'DROP DATABASE "{name}"')
    finally:
        await admin.close()


def main(argv: list[str]) -> int:
    """``python -m accord.schemas.schema_files [ADMIN_DSN]``: rewrite the schema files from a
    scratch database migrated by the current code (ADMIN_DSN, default TEST_PG_DSN or the
    local server's ``postgres`` database, must be allowed to CREATE DATABASE)."""
    admin = (
        argv[0]
        if argv
        else os.environ.get("TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    for path, text in anyio.run(_scratch, admin).items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
