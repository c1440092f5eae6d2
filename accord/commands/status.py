"""`accord status [--since WINDOW] [--json]`: work by state, what finished within the window,
and why waiting work waits, with example job ids where a person must act (one snapshot).

Finished work is counted by tenant and class for succeeded, failed, poison and canceled jobs
that reached that state since WINDOW (a duration such as 90s, 15m, 1h, 7d, or an ISO 8601
timestamp; default 24h). Follow an id with `accord jobs show ID`."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from accord import runtime
from accord.commands.common import optional_app
from accord.ops import collect_status, parse_since, render_table, to_json
from accord.schemas import migrate
from accord.schemas.db import connect
from accord.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "status",
        help="show work by state, what finished lately, and why waiting work waits",
        description=__doc__,
    )
    parser.add_argument(
        "--since",
        default="24h",
        metavar="WINDOW",
        help="count jobs finished since then: a duration (90s, 15m, 1h, 7d) or an ISO 8601"
        " timestamp (%(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = optional_app(args, settings)
    chains = app.migration_chains() if app is not None else ()
    since = parse_since(args.since)  # InvalidSince before anything connects
    return int(runtime.run(_main, settings.pg_dsn, bool(args.json), chains, since))


async def _main(
    dsn: str, as_json: bool, chains: tuple[migrate.Chain, ...], since: datetime | float
) -> int:
    conn = await connect(dsn)
    try:
        await migrate.require_current(conn, chains)
        report = await collect_status(conn, since)
    finally:
        await conn.close()
    if as_json:
        print(json.dumps(to_json(report), indent=2, sort_keys=True))
    else:
        print(render_table(report), end="")
    return 0
