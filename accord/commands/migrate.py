"""`accord migrate [--check]`: apply pending migrations, or say whether the DB is behind."""

from __future__ import annotations

import argparse

import asyncpg

from accord import runtime
from schemas import migrate
from schemas.db import connect, ensure_database
from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("migrate", help="apply pending schema migrations")
    parser.add_argument(
        "--check",
        action="store_true",
        help="apply nothing; exit 1 when the database is behind the code",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    return int(runtime.run(_main, settings.pg_dsn, bool(args.check)))


async def _main(dsn: str, check_only: bool) -> int:
    if not check_only and await ensure_database(dsn):
        print("created the database")
    try:
        conn = await connect(dsn, command_timeout=None)  # a migration may take long
    except asyncpg.InvalidCatalogNameError:
        print("database is behind the code: it does not exist yet")
        return 1
    try:
        if check_only:
            status = await migrate.check(conn)
            if status.pending:
                print(f"database is behind the code: pending {list(status.pending)}")
                return 1
            print(f"database is current: {len(status.applied)} migrations applied")
            return 0
        applied = await migrate.migrate(conn)
        print(f"applied {applied}" if applied else "nothing to apply: database is current")
        return 0
    finally:
        await conn.close()
