"""`accord demo`: the report workflow end to end on the local services, with a summary.

The orchestrator starts the real processes (`accord relay`, `accord consume` for the
``report`` class and its ``report_projection`` read model, two `accord worker --workflow
report`) and the provider simulator, accepts N
submissions (some in transactions that roll back), shows progress, and prints what the
database says happened. With ``faults`` it also SIGKILLs the relay and a worker mid-run
and makes the provider drop some replies after accepting them: the summary then shows
what was recovered and which effects wait for reconciliation. Exit 0 only if the summary
adds up: every accepted submission has a report or a stated reason.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import asyncpg

from accord.demo import summary as demo_summary
from accord.demo.app import app
from accord.demo.domain import accept_submission, operation_for
from accord.demo.errors import DemoError
from accord.demo.job import DEFAULT_OWNER, WORKFLOW
from accord.demo.provider import Fault, ProviderServer
from accord.jobs.framing import scan_journal
from accord.schemas import migrate
from accord.schemas.db import connect, create_pool, ensure_database
from accord.schemas.settings import Settings

TENANTS = ("acme", "globex")

# The demo's narrative (progress, faults, the summary) is its output, on stdout; what the
# supervisor does to its children is logged (stderr), like any process's.
log = logging.getLogger("accord.demo")


@dataclass(frozen=True, slots=True)
class DemoOptions:
    n: int = 24
    faults: bool = False
    timeout_s: float = 120.0
    workdir: Path = Path("var/demo")
    lease_s: float = 4.0  # short, so a killed worker's jobs are rescued within the demo


class Child:
    """One supervised `accord` subprocess, its output appended to a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.log_path = log_dir / f"{name}.log"
        self.process: anyio.abc.Process | None = None
        self.kills = 0

    async def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.process = await anyio.open_process(
                self.argv, env=self.env, stdout=log, stderr=log, stdin=None
            )
        finally:
            log.close()
        assert self.process is not None
        _log_child("started", self, pid=self.process.pid)

    async def kill(self) -> None:
        """SIGKILL: no drain, no goodbye (what a crash or OOM looks like)."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()
            self.kills += 1
            _log_child("killed", self, signal="SIGKILL")

    async def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after the grace period."""
        if self.process is None:
            return None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(grace_s):
                await self.process.wait()
            if self.process.returncode is None:
                await self.kill()
        _log_child("stopped", self, exit_code=self.process.returncode)
        return self.process.returncode


def _log_child(what: str, child: Child, **fields: object) -> None:
    log.info("child %s: %s", what, child.name, extra={"child": child.name, "event": what, **fields})


def _child_env(settings: Settings, provider_url: str, opts: DemoOptions) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ACCORD_PG_DSN=settings.pg_dsn,
        ACCORD_AMQP_URL=settings.amqp_url,
        ACCORD_APP="accord.demo:app",
        ACCORD_TOPOLOGY_PREFIX=settings.topology_prefix or app.name,
        ACCORD_DEMO_PROVIDER_URL=provider_url,
        ACCORD_CONSUMER_TENANTS=",".join(TENANTS),
        ACCORD_JOURNAL_DIR=str(opts.workdir / "journal"),
        ACCORD_OBJECT_DIR=str(opts.workdir / "objects"),
        ACCORD_LEDGER_PATH=str(opts.workdir / "authority.ledger"),
        ACCORD_RELAY_POLL_S="0.2",
        ACCORD_DEMO_DRAFT_S="0.3",
        # Short relay leases: a killed relay's claimed rows are taken over within seconds.
        ACCORD_RELAY_LEASE_S="5",
        ACCORD_RELAY_PUBLISH_TIMEOUT_S="3",
    )
    return env


def _children(env: dict[str, str], opts: DemoOptions) -> dict[str, Child]:
    accord = [sys.executable, "-m", "accord"]
    logs = opts.workdir / "logs"
    worker = [
        "worker", "--workflow", "report", "--lease-s", str(opts.lease_s),
        "--poll-s", "0.2", "--rescue-every-s", "1", "--grace-s", "5",
    ]  # fmt: skip
    return {
        "relay": Child("relay", [*accord, "relay"], env, logs),
        "consumer": Child("consumer", [*accord, "consume", "--workflow", "report"], env, logs),
        "projection": Child(
            "projection", [*accord, "consume", "--workflow", "report_projection"], env, logs
        ),
        "worker-1": Child(
            "worker-1",
            [*accord, *worker, "--journal", str(opts.workdir / "journal" / "w1.journal")],
            env,
            logs,
        ),
        "worker-2": Child(
            "worker-2",
            [*accord, *worker, "--journal", str(opts.workdir / "journal" / "w2.journal")],
            env,
            logs,
        ),
    }


async def _prepare(settings: Settings) -> None:
    await ensure_database(settings.pg_dsn)
    conn = await connect(settings.pg_dsn)
    try:
        await migrate.migrate(conn, app_chains=app.migration_chains())
    finally:
        await conn.close()


async def _register(env: dict[str, str]) -> None:
    """The integration checkpoint, as an operator does it: `accord register` (audited)."""
    done = await anyio.run_process(
        [sys.executable, "-m", "accord", "register", "--workflow", WORKFLOW,
         "--owner", DEFAULT_OWNER, "--effects", "enabled", "--who", "accord-demo"],
        env=env,
        check=False,
    )  # fmt: skip
    print(done.stdout.decode().rstrip(), flush=True)
    if done.returncode != 0:
        raise DemoError("accord register failed", stderr=done.stderr.decode().strip()[-500:])


async def _accept_all(pool: asyncpg.Pool, run: str, n: int) -> list[str]:
    """Accept n submissions, each in its own transaction; every 7th rolls back instead.

    Returns the operation ids of the rolled-back ones (they must leave no trace).
    """
    rolled_back: list[str] = []
    for i in range(n + n // 6):
        report_id = f"{run}-{i:04d}"
        tenant = TENANTS[i % len(TENANTS)]
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            try:
                await accept_submission(conn, tenant, report_id, f"quarterly figures #{i}")
            except BaseException:
                await tx.rollback()
                raise
            if i % 7 == 6:
                await tx.rollback()  # the domain change is abandoned: its event never leaves
                rolled_back.append(operation_for(report_id))
            else:
                await tx.commit()
        await anyio.sleep(0.1)
    return rolled_back


async def run_demo(settings: Settings, opts: DemoOptions) -> int:
    """Run the demo; returns the process exit code (0: the summary adds up)."""
    for sub in ("logs", "journal", "objects"):
        (opts.workdir / sub).mkdir(parents=True, exist_ok=True)
    await _prepare(settings)
    run = uuid.uuid4().hex[:8]
    print(f"accord demo: run {run}, {opts.n} submissions, faults={'on' if opts.faults else 'off'}")
    pool = await create_pool(settings.pg_dsn, min_size=1, max_size=4)
    # The provider's own evidence for this run: every request it accepted, durably.
    provider = ProviderServer(str(opts.workdir / f"provider-{run}.sqlite3"))
    provider.start()
    try:
        env = _child_env(settings, provider.url, opts)
        await _register(env)
        if opts.faults:
            # The provider accepts and records these requests, then drops the reply.
            provider.set_fault(Fault.DROP_AFTER_ACCEPT, times=2)
        children = _children(env, opts)
        print(f"provider simulator at {provider.url}; logs in {opts.workdir / 'logs'}")
        code = await _supervise(pool, run, opts, children)
        accepted = len(provider.evidence())
        print(f"provider evidence: {accepted} accepted requests (its own durable record)")
    finally:
        provider.stop()
        await pool.close()
    return code


async def _supervise(
    pool: asyncpg.Pool, run: str, opts: DemoOptions, children: dict[str, Child]
) -> int:
    started = time.monotonic()
    for child in children.values():
        await child.start()
    rolled_back: list[str] = []
    await anyio.sleep(2.0)  # let the processes connect before the first submission
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_show_progress, pool, run, started)
            if opts.faults:
                tg.start_soon(_inject_faults, pool, run, opts, children)
            rolled_back = await _accept_all(pool, run, opts.n)
            result = await _wait_settled(pool, run, rolled_back, opts, started)
            tg.cancel_scope.cancel()
        print(demo_summary.render(result, time.monotonic() - started))
        kills = {c.name: c.kills for c in children.values() if c.kills}
        if kills:
            print(f"processes killed with SIGKILL: {kills}")
        if opts.faults and result.waiting:
            result = await _reconcile(pool, run, rolled_back, children["relay"].env, started)
    finally:
        for child in children.values():
            await child.stop()
    if result.waiting and not opts.faults:
        print("without injected faults every submission should have been published")
        return 1
    return 0 if result.adds_up else 1


def _quiet(result: demo_summary.Summary) -> bool:
    """Settled, the relay confirmed every report.published, and the read model caught up."""
    return (
        result.settled
        and result.accepted > 0
        and all(not k.endswith(":pending") for k in result.outbox)
        and result.projected == result.published
    )


async def _reconcile(
    pool: asyncpg.Pool, run: str, rolled_back: list[str], env: dict[str, str], started: float
) -> demo_summary.Summary:
    """Resolve the unknown effects with the provider's evidence, then let the workers finish.

    `accord reconcile` (the repair principal) looks each unknown effect up by its idempotency
    key; a receipt resolves it to succeeded and resumes the job, whose next run reuses the
    recorded receipt instead of calling the provider again.
    """
    print("\n== reconciliation: `accord reconcile` asks the provider for receipts ==", flush=True)
    done = await anyio.run_process(
        [sys.executable, "-m", "accord", "reconcile", "--settle-s", "0"], env=env, check=False
    )
    print(done.stdout.decode().rstrip() or done.stderr.decode().rstrip(), flush=True)
    deadline = time.monotonic() + 60
    while True:
        async with pool.acquire() as conn:
            result = await demo_summary.collect(conn, run, rolled_back)
        if (_quiet(result) and result.published == result.accepted) or time.monotonic() > deadline:
            break
        await anyio.sleep(0.5)
    print(demo_summary.render(result, time.monotonic() - started))
    return result


async def _when(pool: asyncpg.Pool, run: str, ready: Callable[[Any], bool]) -> None:
    """Wait until the run's figures satisfy ``ready``."""
    while True:
        async with pool.acquire() as conn:
            if ready(await demo_summary.collect(conn, run, [])):
                return
        await anyio.sleep(0.05)


async def _inject_faults(
    pool: asyncpg.Pool, run: str, opts: DemoOptions, children: dict[str, Child]
) -> None:
    """SIGKILL the relay while it has events to deliver, then a worker while jobs run."""
    await _when(pool, run, lambda s: s.outbox.get("report.accepted:published", 0) >= 2)
    print("fault: SIGKILL relay mid-stream (a new one takes over)", flush=True)
    await children["relay"].kill()
    await children["relay"].start()
    journals = {f"worker-{i}": opts.workdir / "journal" / f"w{i}.journal" for i in (1, 2)}
    name, held = await _holder(pool, journals)
    print(f"fault: SIGKILL {name} while it holds {held} running job(s)", flush=True)
    await children[name].kill()
    await anyio.sleep(opts.lease_s + 1)
    print(f"fault: {name} restarted; rescue has settled its expired leases", flush=True)
    await children[name].start()


def _claimed_attempts(journal: Path) -> list[str]:
    """The attempt ids a worker journaled as claims (read without its lock: append-only)."""
    if not journal.exists():
        return []
    return [str(r["attempt_id"]) for r in scan_journal(journal).records if r["type"] == "claim"]


async def _holder(pool: asyncpg.Pool, journals: dict[str, Path]) -> tuple[str, int]:
    """Wait until a worker holds running jobs (its journaled claims, still current there)."""
    while True:
        for name, journal in journals.items():
            attempts = await anyio.to_thread.run_sync(_claimed_attempts, journal)
            async with pool.acquire() as conn:
                held: int = await conn.fetchval(demo_summary.RUNNING_ATTEMPTS, attempts)
            if held:
                return name, held
        await anyio.sleep(0.02)


async def _show_progress(pool: asyncpg.Pool, run: str, started: float) -> None:
    """Print a progress line whenever the figures change (until cancelled)."""
    last = ""
    while True:
        async with pool.acquire() as conn:
            result = await demo_summary.collect(conn, run, [])
        line = demo_summary.progress_line(result, time.monotonic() - started)
        figures = line.split("] ", 1)[1]
        if figures != last:
            print(line, flush=True)
            last = figures
        await anyio.sleep(0.5)


async def _wait_settled(
    pool: asyncpg.Pool, run: str, rolled_back: list[str], opts: DemoOptions, started: float
) -> demo_summary.Summary:
    deadline = started + opts.timeout_s
    while True:
        async with pool.acquire() as conn:
            result = await demo_summary.collect(conn, run, rolled_back)
        if _quiet(result):
            return result
        if time.monotonic() > deadline:
            print(f"timed out after {opts.timeout_s:.0f}s; the summary shows where work stands")
            return result
        await anyio.sleep(0.5)
