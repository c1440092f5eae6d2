"""`accord replay --workflow NAME --since ISO|DURATION [--rebuild]`: rebuild a projection.

Re-delivers the retained outbox events (published or pending) of the projection's types, in order,
under the ``accord_projection`` principal, which cannot submit jobs or begin effects.
Exit 0 when every event applied; 1 when any was not (each one is listed and recorded in
ops.replay_refusals, the run going on past it, as the live consumer poisons it and goes on:
a handler that reached past the principal, a statement PostgreSQL refused for the event's
content, an event that no longer decodes with the catalog); 2 on an error (unknown
projection, window exceeded, a handler's own error or a schema it does not match, a rebuild
whose first batch applied nothing, ...); 75 when a deadlock, a timeout or a database taking
no writes was met again and again (ReplayInterrupted: run it again later).
"""

from __future__ import annotations

import argparse
import dataclasses
from datetime import datetime

from accord import runtime
from accord.app import App
from accord.commands import args
from accord.commands.common import check_retention, require_app, served_tenants
from accord.ops import Projection, parse_since, prune_ledger, replay
from accord.schemas import migrate
from accord.schemas.db import connect
from accord.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "replay", help="replay retained events to a projection", description=__doc__
    )
    parser.add_argument("--workflow", required=True, help="the projection's workflow class")
    parser.add_argument(
        "--since", required=True, help="ISO 8601 timestamp, or a duration such as 2h or 7d"
    )
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="empty the projection first (in the same batch, under the rebuild guard its live"
        " consumer waits for); refused once the relay pruned events, or with --since after the"
        " oldest retained one",
    )
    parser.add_argument(
        "--batch", type=args.count(maximum=10_000), default=200, help="events per transaction"
    )
    parser.add_argument(
        "--tenant",
        type=args.text,
        action="append",
        default=[],
        help="a tenant whose events it applies, as the projection's consumer serves them"
        " (repeatable; default: ACCORD_CONSUMER_TENANTS, else the declared tenants; none"
        " or '*': every tenant)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    """Raises SettingsInvalid (exit 2, nothing read or removed) for retentions the other
    processes refuse: replay prunes its ledger by the audit retention."""
    check_retention(settings)
    app = require_app(args, settings)
    since = parse_since(args.since)
    declared = app.projection_of(args.workflow)
    served = served_tenants(args.tenant, settings, declared.tenants)
    projection = dataclasses.replace(declared, tenants=tuple(served))
    return int(runtime.run(_main, settings, app, projection, since, bool(args.rebuild), args.batch))


async def _main(
    settings: Settings,
    app: App,
    projection: Projection,
    since: datetime | float,
    rebuild: bool,
    batch: int,
) -> int:
    catalog = app.catalog
    reader = await connect(settings.pg_dsn)
    try:
        await migrate.require_current(reader, app.migration_chains())
        writer = await connect(settings.pg_dsn)
        try:
            # The ledger's one writer keeps it bounded: runs past the audit retention go first.
            runs, refusals = await prune_ledger(writer, retention_s=settings.audit_retention_s)
            if runs or refusals:
                print(f"replay ledger: removed {runs} runs and {refusals} refused events"
                      f" older than {settings.audit_retention_s:g} s")  # fmt: skip
            summary = await replay(
                reader,
                writer,
                projection,
                since=since,  # a duration is read by the replay's snapshot clock
                catalog=catalog,
                retention_s=settings.relay_retention_s,
                rebuild=rebuild,
                batch=max(1, batch),
            )
        finally:
            await writer.close()
    finally:
        await reader.close()
    for r in summary.refusals:
        print(
            f"refused: outbox_id={r.outbox_id} tenant={r.tenant} operation_id={r.operation_id}"
            f" event_id={r.event_id} type={r.event_type} reason={r.reason}"
            + (f" sqlstate={r.sqlstate}" if r.sqlstate else "")
        )
    print(
        f"replay run {summary.run_id} workflow={summary.workflow}"
        f" since={summary.since.isoformat()} events={summary.events} applied={summary.applied}"
        f" refused={summary.refused} skipped={summary.skipped}"
    )
    return 1 if summary.refused or summary.skipped else 0
