"""`accord register --workflow CLASS --owner NAME [--effects enabled|disabled]`.

Without ``--effects`` a registered class keeps its flag (a new one starts disabled): before
2026-12-05 the default turned effects off for a running class re-registered to its owner.

The integration checkpoint: names the one queue owner of a workflow class and whether its
jobs may begin external effects, as an explicit act of the migrating (administrative) role,
with a row in ``jobs.registration_audit``. A worker refuses to start for a class that is not
registered to its owner; with effects disabled, the class's jobs are refused at their first
``begin_effect`` (typed reason ``effects_disabled``) and `accord status` shows that they
wait for it. Changing the owner of a class with open work is refused (drain it first).
With ``--app``, the class must be one the application declares.
"""

from __future__ import annotations

import argparse
import getpass

from accord import runtime
from accord.commands import args
from accord.commands.common import optional_app
from accord.jobs import Store
from accord.schemas import migrate
from accord.schemas.db import connect
from accord.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "register",
        help="register a workflow class's queue owner (audited)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workflow", type=args.text, required=True, help="the workflow class")
    parser.add_argument(
        "--owner", type=args.text, required=True, help="the queue owner its workers run as"
    )
    parser.add_argument(
        "--effects",
        choices=("enabled", "disabled"),
        default=None,
        help="may its jobs begin external effects (default: unchanged for a registered class,"
        " disabled for a new one)",
    )
    parser.add_argument(
        "--who",
        type=args.text,
        default=None,
        help="the person or tool registering (default: the OS user)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = optional_app(args, settings)
    chains: tuple[migrate.Chain, ...] = ()
    if app is not None:
        app.job_class(args.workflow)  # AppInvalid: the application runs no such class
        chains = app.migration_chains()
    who = args.who or getpass.getuser()
    return int(runtime.run(_main, settings.pg_dsn, args, who, chains))


async def _main(
    dsn: str, args: argparse.Namespace, who: str, chains: tuple[migrate.Chain, ...]
) -> int:
    conn = await connect(dsn)
    try:
        await migrate.require_current(conn, chains)
        done = await Store(conn).register_workflow(
            args.workflow,
            args.owner,
            effects_enabled=None if args.effects is None else args.effects == "enabled",
            who=who,
        )
    finally:
        await conn.close()
    print(
        f"registered workflow={done.workflow} owner={done.owner}"
        f" effects={'enabled' if done.effects_enabled else 'disabled'} who={who}"
    )
    return 0
