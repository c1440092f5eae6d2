"""`accord migrate [--check]`: apply pending migrations, or say whether the DB is behind.

Accord's own chain first, then, with ``--app``, the application's own directory of
migrations, in the same checksum ledger (the application's name is its component). With
``ACCORD_LEDGER_PG_DSN``, the authority ledger's table in that separate database too (its
schema, the table and the guards that keep it append-only: idempotent).
"""

from __future__ import annotations

import argparse

from accord import runtime
from accord.commands.common import optional_app
from accord.jobs.ledger import PgLedger
from accord.schemas import migrate
from accord.schemas.db import connect, ensure_database
from accord.schemas.errors import DatabaseMissing
from accord.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "migrate",
        help="apply pending schema migrations (accord's, then the application's)",
        description=__doc__,
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="apply nothing; exit 1 when the database is behind the code",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = optional_app(args, settings)
    chains = app.migration_chains() if app is not None else ()
    code = int(runtime.run(_main, settings.pg_dsn, bool(args.check), chains))
    if code == 0 and not args.check and settings.ledger_pg_dsn:
        runtime.run(ensure_database, settings.ledger_pg_dsn)
        runtime.run(PgLedger(settings.ledger_pg_dsn).ensure)
        print("the authority ledger's table is in place (ACCORD_LEDGER_PG_DSN)")
    return code


async def _main(dsn: str, check_only: bool, chains: tuple[migrate.Chain, ...]) -> int:
    if not check_only and await ensure_database(dsn):
        print("created the database")
    try:
        conn = await connect(dsn, command_timeout=None)  # a migration may take long
    except DatabaseMissing:
        print("database is behind the code: it does not exist yet (`accord migrate` creates it)")
        return 1
    try:
        if check_only:
            status = await migrate.check(conn, chains)
            if status.pending:
                behind = {c: list(v) for c, v in status.pending_by_component if v}
                print(f"database is behind the code: pending {behind}")
                return 1
            print(f"database is current: {len(status.applied)} migrations applied")
            return 0
        applied = await migrate.migrate(conn, app_chains=chains)
        print(f"applied {applied}" if applied else "nothing to apply: database is current")
        return 0
    finally:
        await conn.close()
