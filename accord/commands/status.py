"""`accord status [--json]`: work by state, and why waiting work waits (one snapshot)."""

from __future__ import annotations

import argparse
import json

from accord import runtime
from accord.commands.common import optional_app
from accord.ops import collect_status, render_table, to_json
from accord.schemas import migrate
from accord.schemas.db import connect
from accord.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "status", help="show work by state, and why waiting work waits", description=__doc__
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = optional_app(args, settings)
    chains = app.migration_chains() if app is not None else ()
    return int(runtime.run(_main, settings.pg_dsn, bool(args.json), chains))


async def _main(dsn: str, as_json: bool, chains: tuple[migrate.Chain, ...]) -> int:
    conn = await connect(dsn)
    try:
        await migrate.require_current(conn, chains)
        report = await collect_status(conn)
    finally:
        await conn.close()
    if as_json:
        print(json.dumps(to_json(report), indent=2, sort_keys=True))
    else:
        print(render_table(report), end="")
    return 0
