"""`accord worker --workflow NAME`: run job workers for one of the application's job
classes until SIGTERM.

Refuses to start on a schema older than the code, and unless ``--owner`` (default: the owner
the application declares for the class) is the registered queue owner of the class
(``accord register``; ``jobs.Store.require_registration``). Opens this runner's journal
(a torn tail is quarantined and cut, a corrupt one refused), reports the effects an
earlier run began whose outcome the database never recorded, and carries only those into a
new journal segment (``journal_segment_bytes`` bounds each). The first SIGTERM (or SIGINT)
stops claiming and lets in-flight handlers finish within ``--grace-s``, then cancels them
(interrupted effects are recorded unknown); a second one cancels at once. Exit 0 after a
clean stop, 2 on a refusal, 75 when a service or the journal failed (a restart may cure it),
non-zero after any other crashed loop.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from accord import runtime
from accord.app import App
from accord.commands import args
from accord.commands.common import check_retention, require_app
from accord.commands.repair import ledger_from_settings
from accord.jobs import Store
from accord.jobs.authority import AuthorityGate, authority_watch, require_authority
from accord.jobs.runner import LocalDirStore, Registered, Worker, WorkerConfig, open_journal
from accord.ops import checks
from accord.schemas import migrate
from accord.schemas.db import connection_room, create_pool
from accord.schemas.errors import ConfigError
from accord.schemas.settings import MAX_LEASE_S, Settings

log = logging.getLogger("accord.worker")


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """One `accord worker` process: the class it serves and how."""

    workflow: str
    journal: Path
    config: WorkerConfig

    @property
    def runner_id(self) -> str:
        # The journal file names its runner: reopening the same file is the same runner.
        return self.journal.stem


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "worker", help="run job workers for one workflow class", description=__doc__
    )
    parser.add_argument("--workflow", required=True, help="the application's job class")
    parser.add_argument(
        "--owner",
        type=args.text,
        default=None,
        help="the registered queue owner (default: the class's owner)",
    )
    parser.add_argument(
        "--concurrency",
        type=args.count(maximum=10_000),
        default=4,
        help="jobs at once (%(default)s)",
    )
    parser.add_argument(
        "--journal",
        default=None,
        help="journal file (default: <journal_dir>/<owner>.<class>.journal)",
    )
    parser.add_argument(
        "--lease-s",
        type=args.seconds(positive=True, maximum=MAX_LEASE_S),
        default=None,
        help="default: the class's lease, else job_lease_s",
    )
    parser.add_argument(
        "--poll-s", type=args.seconds(positive=True), default=1.0, help="claim poll interval"
    )
    parser.add_argument(
        "--rescue-every-s",
        type=args.seconds(),
        default=5.0,
        help="host the rescue call (0: do not)",
    )
    parser.add_argument(
        "--prune-every-s",
        type=args.seconds(),
        default=None,
        help="host the retention call (default: jobs_prune_every_s; 0: do not)",
    )
    parser.add_argument("--grace-s", type=args.seconds(), default=10.0, help="SIGTERM grace period")
    parser.add_argument(
        "--timeout-s",
        type=args.seconds(positive=True),
        default=None,
        help="handler timeout (default: the class's)",
    )
    parser.set_defaults(handler=handle)


def options_from(args: argparse.Namespace, settings: Settings, app: App) -> WorkerOptions:
    """The worker's options, from flags, the class's declaration and settings (the only
    place they meet). Raises SettingsInvalid for a retention shorter than the replay horizon."""
    check_retention(settings)
    declared = app.job_class(args.workflow)
    owner = args.owner or declared.owner
    journal = args.journal or Path(settings.journal_dir) / f"{owner}.{args.workflow}.journal"
    lease_s = next(
        s for s in (args.lease_s, declared.lease_s, settings.job_lease_s) if s is not None
    )
    config = WorkerConfig(
        owner=owner,
        concurrency=args.concurrency,
        lease_s=lease_s,
        poll_s=args.poll_s,
        claim_linger_s=settings.worker_claim_linger_s,
        rescue_every_s=args.rescue_every_s or None,
        grace_s=args.grace_s,
        prune_every_s=_prune_every_s(getattr(args, "prune_every_s", None), settings),
        prune_batch=settings.jobs_prune_batch,
        prune_retention_s=settings.jobs_retention_s,
        prune_audit_retention_s=settings.audit_retention_s,
    )
    return WorkerOptions(workflow=args.workflow, journal=Path(journal), config=config)


def _prune_every_s(flag: float | None, settings: Settings) -> float | None:
    """The retention call's period: the flag, else the setting; 0 means not in this process."""
    every_s = settings.jobs_prune_every_s if flag is None else flag
    return every_s or None


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = require_app(args, settings)
    options = options_from(args, settings, app)
    registered = app.registered(options.workflow)
    if args.timeout_s is not None:
        registered = dataclasses.replace(registered, timeout_s=args.timeout_s)
    db = checks.Database(settings.pg_dsn)  # one kept connection for both checks
    gate = AuthorityGate()
    ready = [
        checks.postgresql(db, app.migration_chains()),
        checks.registered(db, options.workflow, options.config.owner),
        checks.authority(gate),
    ]
    with runtime.metrics(settings, checks=ready):
        chains = app.migration_chains()
        return int(runtime.run(serve, settings, options, [registered], chains, gate, service=True))


def pool_size(concurrency: int) -> int:
    """The worker's pool: enough that no call ever waits for a connection. Each running job
    holds one for its fenced calls (``Store.hold``) and its heartbeat takes another for a
    renewal (``concurrency`` each at most); the claim, rescue, authority-watch, pruning and
    journal-rotation loops take one each. A renewal must never wait behind held connections."""
    return 2 * concurrency + 5


async def serve(
    settings: Settings,
    options: WorkerOptions,
    handlers: Sequence[Registered],
    app_chains: Sequence[migrate.Chain] = (),
    gate: AuthorityGate | None = None,
) -> int:
    """Run one worker process (the composition root's body; tests' drivers call it too).
    ``gate``: the authority gate its claims wait on (made here when not given; `accord
    worker` makes it first, for its readiness check)."""
    chosen = [h for h in handlers if h.workflow == options.workflow]
    if not chosen:
        raise ConfigError(
            "no job handler for this workflow class",
            workflow=options.workflow,
            known=sorted(h.workflow for h in handlers),
        )
    size = pool_size(options.config.concurrency)
    room = await connection_room(settings.pg_dsn)
    if room is not None and size > room:
        raise ConfigError(
            "the worker opens its whole pool at the start (2 x --concurrency + 5 connections)"
            " and this login may hold fewer at once: raise its CONNECTION LIMIT (role or"
            " database) or max_connections, or lower --concurrency",
            pool=size,
            room=room,
            concurrency=options.config.concurrency,
        )
    # refuse a schema older than the code (accord's and the application's)
    await migrate.require_current_at(settings.pg_dsn, app_chains)
    # Execution authority only: the worker role can claim, renew, publish and record
    # effects through the jobs functions, and cannot repair (grants: jobs/schema.sql).
    role = {"server_settings": {"role": settings.worker_role}} if settings.worker_role else {}
    # Claims wait after a lost or new database connection (a restart, a restore) until the
    # authority watch's next check passes: the pool reports each new connection to the gate.
    gate = gate if gate is not None else AuthorityGate()
    # Every connection opened at the start and kept (no idle expiry): a server that cannot
    # give them is one line now, not heartbeats that fail once the jobs hold the rest (their
    # leases lost, their effects left to reconciliation). A connection is replaced after a
    # loss, or after asyncpg's max_queries; each replacement shuts the gate until the next
    # check (brought forward at once).
    pool = await create_pool(
        settings.pg_dsn,
        min_size=size,
        max_size=size,
        max_inactive_connection_lifetime=0,
        init=gate.connection_opened,
        **role,
    )
    try:
        store = Store(pool)
        await store.require_registration(options.workflow, options.config.owner)
        # A database behind the authority ledger is a restore: its tenants stay frozen and
        # their old-epoch work held until a repair principal advances the epoch (DESIGN §8).
        ledger = ledger_from_settings(settings)
        for restore in await require_authority(pool, ledger):
            log.warning(
                "tenant %s is frozen after a detected restore",
                restore.tenant,
                extra={"tenant": restore.tenant, "reason": "restore_detected"},
            )
        objects = LocalDirStore(settings.object_dir)
        await anyio.to_thread.run_sync(objects.require_writable)
        # Only the live segment is read here; a rotation sealed everything before it.
        segment_bytes = settings.journal_segment_bytes
        with open_journal(
            options.journal, options.runner_id, segment_bytes=segment_bytes
        ) as journal:
            worker = Worker(
                options.config,
                store=store,
                journal=journal,
                objects=objects,
                pool=pool,
                authority=gate,
            )
            worker.register_all(chosen)
            watch = partial(authority_watch, pool, ledger, settings.authority_check_s, gate=gate)
            await _run(worker, options, watch)
    finally:
        await pool.close()
    return 0


async def _run(
    worker: Worker, options: WorkerOptions, watch: Callable[..., Coroutine[Any, Any, None]]
) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(watch)

        async def run_then_stop(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            await worker.run(task_status=task_status)
            tg.cancel_scope.cancel()

        tg.start_soon(runtime.stop_on_signals, worker, "worker")
        await tg.start(run_then_stop)
        runtime.ready(
            log,
            "worker ready: workflow=%s owner=%s runner=%s concurrency=%d lease_s=%g"
            " unrecorded_effects=%d",
            options.workflow,
            options.config.owner,
            options.runner_id,
            options.config.concurrency,
            options.config.lease_s,
            len(worker.unrecorded),
        )
    stats, written = worker.stats, worker.journal.stats
    log.info(
        "worker stopped: claims=%d claimed=%d endings=%s renewals=%d unresolved=%d"
        " journal_records=%d journal_groups=%d journal_rotations=%d",
        stats.claims,
        stats.claimed,
        dict(stats.endings),
        stats.renewals,
        len(stats.unresolved),
        written.records,
        written.groups,
        written.rotations,
    )
