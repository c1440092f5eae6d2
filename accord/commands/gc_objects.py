"""`accord gc-objects [--retention-s S] [--dir D]`: remove unreferenced result objects.

An object is kept while a ``jobs.results`` row names it, and while it is younger than the
retention whatever the rows say: a worker puts its result object *before* the fenced publish
that references it commits. Each try of that publish first restarts the object's clock (and
fails if the object is gone; before 2026-12-05 only its first try did, and a publish tried
again for longer than the retention could name a collected object), so the retention must
exceed one try of a publish, not the handler's whole run since its put. A retention shorter
than a job's lease is refused: it could take the object of a publish in flight. The lease is
the longest of ``ACCORD_JOB_LEASE_S`` and every lease the application (``--app`` or
``ACCORD_APP``, when given) declares for its jobs; a worker started with a longer
``--lease-s`` of its own needs a retention at least that long. Re-putting existing content
restarts an object's clock too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from accord import runtime
from accord.commands import args
from accord.commands.common import optional_app
from accord.errors import SettingsInvalid
from accord.jobs.runner.objects import LocalDirStore, collect_garbage
from accord.schemas import migrate
from accord.schemas.db import connect
from accord.schemas.settings import Settings

DEFAULT_RETENTION_S = 24 * 3600.0

# Every object key a published result references: the collector's keep set.
REFERENCED_KEYS = "SELECT object_key FROM jobs.results"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "gc-objects", help="remove unreferenced result objects", description=__doc__
    )
    parser.add_argument(
        "--retention-s",
        type=args.seconds(),
        default=DEFAULT_RETENTION_S,
        help="keep every object put within this many seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--dir", default=None, help="the object directory (default: settings object_dir)"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    """Raises SettingsInvalid (exit 2, nothing read or removed) for a retention shorter than
    a job's lease (the settings' or one the application declares)."""
    app = optional_app(args, settings)
    leases = {"ACCORD_JOB_LEASE_S": settings.job_lease_s}
    if app is not None:
        jobs = app.jobs.values()
        leases |= {
            f"the {j.workflow} job's lease_s": j.lease_s for j in jobs if j.lease_s is not None
        }
    named, longest = max(leases.items(), key=lambda item: item[1])
    if args.retention_s < longest:
        raise SettingsInvalid(
            f"--retention-s {args.retention_s:g} is shorter than a job's lease"
            f" ({named}={longest:g}): it could remove the result object of a job whose"
            " publish has not committed yet; pass --retention-s of at least the longest lease"
        )
    root = Path(args.dir or settings.object_dir)
    if not root.is_dir():  # a typo would otherwise collect nothing and say so with exit 0
        raise SettingsInvalid(
            f"{root} is not a directory: pass the object store's directory (--dir, or"
            " ACCORD_OBJECT_DIR, the workers' own)"
        )
    return int(runtime.run(_main, settings.pg_dsn, root, float(args.retention_s)))


async def _main(dsn: str, root: Path, retention_s: float) -> int:
    conn = await connect(dsn)  # DatabaseMissing says `accord migrate` creates it
    try:
        await migrate.require_current(conn)
        referenced = {row["object_key"] for row in await conn.fetch(REFERENCED_KEYS)}
    finally:
        await conn.close()
    # The keep set is read before the listing: an object referenced after this read is
    # either in the set already or younger than the retention (see the module docstring).
    deleted = await anyio.to_thread.run_sync(
        collect_garbage, LocalDirStore(root), referenced, retention_s
    )
    for key in deleted:
        print(f"deleted {key}")
    print(
        f"gc-objects: deleted {len(deleted)} unreferenced objects older than {retention_s:g}s"
        f" from {root} ({len(referenced)} referenced)"
    )
    return 0
