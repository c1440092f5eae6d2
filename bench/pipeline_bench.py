"""The shipped report pipeline over N unpaced submissions, against the raw limit of the same
stages measured in the same run, and against DBOS Transact running the same job.

    .venv/bin/python -m bench.pipeline_bench [--n 300] [--workers 2] [--concurrency 8]
                                             [--submitters 4] [--rounds 1] [--dbos]
                                             [--no-projection-during] [--prune-backlog R]

Needs PostgreSQL and RabbitMQ (ACCORD_PG_DSN's server, ACCORD_AMQP_URL); every variant runs
on its own scratch database (created and dropped) and broker names under a unique prefix
(deleted). One provider simulator process (``python -m accord.demo.provider``) serves every
variant: its fsynced SQLite evidence is a cost every variant pays per report.

* ``accord``: the real processes, as ``accord demo`` starts them: ``accord relay``, ``accord
  consume --workflow report``, ``accord consume --workflow report_projection`` and
  ``--workers`` x ``accord worker --workflow report --concurrency C`` (``--app
  accord.demo:app``, ACCORD_DEMO_DRAFT_S=0, worker polls 0.05 s; the relay at its default
  poll, as NOTIFY wakes it at each enqueue's commit), after ``accord
  migrate`` and ``accord register``. The bench accepts N submissions through
  ``accord.demo.domain.accept_submission``, each in its own transaction, from
  ``--submitters`` connections, as fast as they go; the clock runs from the first submission
  until N rows are in demo.reports (each written by a fenced publish, in the transaction that
  enqueues its ``report.published``). CPU per process kind (utime + stime from /proc, over
  that window) is reported in ms per submission. The relay also publishes
  ``report.published`` meanwhile. Two variants, the same processes otherwise:

  - ``accord``: the pipeline the issue names, enqueue → relay → consume → job → effect →
    fenced publish. The projection consumer (``report_projection``) starts when the clock
    stops and drains what the relay queued for it; its catch-up time is reported. Neither
    the raw stages nor DBOS project anything, so this is the like-for-like figure and the
    goals are read from it.
  - ``accord+projection``: the projection consumer runs from the start, competing for the
    same two cores; the time until it holds N rows is reported too. Skip it with
    ``--no-projection-during``.
  - ``accord+pruning`` (with ``--prune-backlog R``): ``accord`` again, beside R month-old
    rows in each table a pruner keeps (published outbox rows, the consumer's inbox and
    delivery rows, finished jobs with an effect and a result manifest each) and retentions
    of a day (the replay horizon an hour and five minutes), so that the relay, the consumer
    and the worker prune as they ship (their intervals and batches unchanged) while the
    pipeline runs. Reported: its rate over ``accord``'s of the same round, and the expired
    rows each pruner removed while the clock ran (a count of zero would mean the pruning
    did not overlap the measurement).
* ``raw``: the limit of the same stages written directly (asyncpg, aio-pika, the provider
  client), on the same tables where they exist, each stage measured alone over the same N
  with the same concurrency budget, one after the other:
  (a) enqueue: ``--submitters`` connections, one transaction per submission: the
  demo.submissions INSERT and the bare outbox INSERT (its arguments computed before the
  clock); (b) relay: bench.relay_bench's ``raw_relay`` (claim 200, publish with pipelined
  confirms, mark); (c) consume: aio-pika, prefetch 64, one transaction per batch of what
  arrived (an inbox row and a job row per message), one cumulative ack; (d) job: W x C
  tasks, each: claim one job (``FOR UPDATE SKIP LOCKED``), the provider call with an
  idempotency key, one transaction marking it succeeded and writing the report row.
  The raw pipeline limit is the reciprocal of the sum of the per-item costs:
  ``1 / Σ (1 / rate_stage)``. That is the throughput of doing the stages one after the
  other on this machine; it is a floor for a design that must pay each stage, not a
  ceiling: a pipeline overlapping stages that wait on different things (fsyncs, the
  broker, the provider) on two cores could exceed it, and the raw stages skip what accord
  adds (fences, the effect recorded pending before dispatch, the journal, the object, the
  published event). Goal: accord ≥ 0.5 x raw.
* ``dbos`` (``--dbos``): DBOS Transact 3.4.0 in its own venv (var/bench/dbos-venv, created
  once with pip) running bench/dbos_peer.py: acceptance and enqueue in one transaction, a
  step calling the same provider with an idempotency key, the final write in one datasource
  transaction, a queue with worker concurrency W x C split over 1 or 2 executor processes
  (``--dbos-executors``), polled every 0.05 s. Goal: accord ≥ 2 x the best DBOS
  configuration. ``--dbos-executors 2x16,3x8`` runs other shapes too (executors x each
  one's worker concurrency; a bare count splits W x C, as by default), to look for a
  better-tuned DBOS.

``--worker-metrics`` has each worker serve /metrics, as a deployment's would (spans for the
messaging metrics, the submit-to-finish histogram), and reports the workers' authority checks
by what brought them on.

Beside the rates, the bench counts PostgreSQL commits per submission (pg_stat_database's
``xact_commit`` over the window, the bench's own polls taken out) for accord and raw: a
count, not a timing, so it does not drift with the machine. Each statement outside a
transaction block is a commit of its own, as is each pool reset. It also splits the
PostgreSQL backends' CPU over the same window by the process each serves: every accord
process names its connections (``application_name``: ``accord worker report``, ...), the
bench's own are unnamed (the server must run on this machine: /proc). And it reads the
whole machine's CPU over the window (/proc/stat: every process, RabbitMQ and the kernel
included) with how busy the cores were and how much of their time the virtual machine's host
took (steal: neither busy nor idle, and never counted as a cost), for accord and for DBOS:
once the cores are busy, throughput is what a submission costs the machine, and the report
sets accord's cost beside what 0.5 x raw would allow at the same busyness.

Rounds alternate the order of the variants (the machine drifts); each ratio's figure is its
median over rounds. Prints one JSON document, then a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import anyio
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from accord.demo import demo_topology
from accord.demo import sql as demo_sql
from accord.demo.app import app
from accord.demo.catalog import demo_catalog
from accord.demo.domain import accept_submission
from accord.demo.provider import ProviderClient
from accord.relay import outbox
from accord.relay import sql as relay_sql
from accord.runtime import run
from accord.schemas import migrate
from accord.schemas.events import Event, encode_payload
from accord.schemas.settings import load_settings
from accord.schemas.topology import Topology, WorkflowQueue, declare
from bench import retention_bench
from bench.relay_bench import raw_relay

ROOT = Path(__file__).resolve().parents[1]
DBOS_VENV = ROOT / "var" / "bench" / "dbos-venv"
DBOS_VERSION = "3.4.0"
TENANTS = ("acme", "globex")
POLL_S = 0.05
CATALOG = demo_catalog()

COUNT_REPORTS = "SELECT count(*) FROM demo.reports"
COUNT_PROJECTED = "SELECT count(*) FROM demo_projection.published_reports"

# The raw stages' own tables (the submissions and the outbox are the demo's and accord's).
RAW_SETUP = """
CREATE TABLE raw_inbox (message_id text PRIMARY KEY, received_at timestamptz DEFAULT now());
CREATE TABLE raw_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant text NOT NULL,
    report_id text NOT NULL, operation_id text NOT NULL, payload bytea NOT NULL,
    state text NOT NULL DEFAULT 'queued', owner text, lease_expires_at timestamptz);
CREATE INDEX raw_jobs_queued ON raw_jobs (id) WHERE state = 'queued';
CREATE TABLE raw_reports (
    tenant text NOT NULL, report_id text NOT NULL, job_id bigint NOT NULL,
    provider_receipt text, published_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, report_id),
    FOREIGN KEY (tenant, report_id) REFERENCES demo.submissions (tenant, report_id));
"""
RAW_INBOX = "INSERT INTO raw_inbox (message_id) VALUES ($1) ON CONFLICT DO NOTHING"
RAW_SUBMIT = (
    "INSERT INTO raw_jobs (tenant, report_id, operation_id, payload) VALUES ($1, $2, $3, $4)"
)
RAW_CLAIM = """
UPDATE raw_jobs r SET state = 'running', owner = $1,
       lease_expires_at = now() + interval '60 seconds'
FROM (SELECT id FROM raw_jobs WHERE state = 'queued' ORDER BY id LIMIT 1
      FOR UPDATE SKIP LOCKED) c
WHERE r.id = c.id RETURNING r.id, r.tenant, r.report_id, r.operation_id, r.payload
"""
RAW_SUCCEEDED = "UPDATE raw_jobs SET state = 'succeeded', lease_expires_at = NULL WHERE id = $1"
RAW_REPORT = (
    "INSERT INTO raw_reports (tenant, report_id, job_id, provider_receipt) VALUES ($1, $2, $3, $4)"
)


def with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_s() -> tuple[float, float, float]:
    """The whole machine's CPU so far, every process and the kernel's own work included
    (/proc/stat): (busy, idle, steal) core-seconds; idle counts iowait. Steal is time the
    virtual machine's host ran something else on its cores: no work of this machine's, so
    not busy; it is reported on its own, as the share of the cores' time it took."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, (idle + iowait) / hz, steal / hz


def machine_spent(before: tuple[float, float, float], n: int) -> dict[str, float]:
    """Since ``before``: the machine's CPU per item in ms, how busy its cores were and how
    much of their time the host stole (0..1 of the cores' time)."""
    busy, idle, steal = (b - a for a, b in zip(before, machine_s(), strict=True))
    total = busy + idle + steal
    return {
        "machine_cpu_ms_per_item": 1000 * busy / n,
        "machine_busy": busy / total,
        "machine_steal": steal / total,
    }


async def backends_cpu_s(pool: asyncpg.Pool) -> dict[int, tuple[str, float]]:
    """Each backend of the pool's database: (its application_name or "bench", its CPU s)."""
    rows = await pool.fetch(
        "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
    )
    found = {}
    for row in rows:
        with contextlib.suppress(OSError):  # gone meanwhile
            found[row["pid"]] = (row["application_name"] or "bench", cpu_s(row["pid"]))
    return found


def backends_by_process(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds the backends spent between the two reads, summed by process name (a
    backend that started between them counts whole; one that ended is lost)."""
    spent: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        name = name.removeprefix("accord ")
        spent[name] = spent.get(name, 0.0) + cpu - before.get(pid, (name, 0.0))[1]
    return spent


class Scratch:
    """A scratch database on the admin DSN's server: created on enter, dropped on exit."""

    def __init__(self, admin_dsn: str, kind: str) -> None:
        self.admin_dsn = admin_dsn
        self.name = f"{kind}_{uuid.uuid4().hex[:8]}"
        self.dsn = with_database(admin_dsn, self.name)

    async def __aenter__(self) -> str:
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await admin.close()
        return self.dsn

    async def __aexit__(self, *exc: object) -> None:
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await admin.close()


async def delete_broker_names(url: str, topology: Topology) -> None:
    amqp = await aio_pika.connect(url)
    try:
        channel = await amqp.channel()
        exchanges, queues = topology.names()
        for q in queues:
            await channel.queue_delete(q)
        for x in exchanges:
            await channel.exchange_delete(x)
    finally:
        await amqp.close()


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Provider:
    """The provider simulator as its own process (its CPU is measured like the others')."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (workdir / "provider.log").open("ab")
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "accord.demo.provider"),
                *("--port", str(self.port), "--db", str(workdir / "provider.sqlite3")),
            ],
            stdout=self.log,
            stderr=self.log,
        )

    async def ready(self) -> None:
        client = ProviderClient(self.url, timeout_s=2, connect_timeout_s=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                await client.stats()
                return
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                await anyio.sleep(0.1)

    def stop(self) -> None:
        stop_processes({"provider": self.process})
        self.log.close()


def stop_processes(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM each, then SIGKILL after 15 s."""
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -- pruning beside the pipeline (--prune-backlog) ------------------------------------------------

# Rows a month old, past every retention the pruning variant sets (PRUNING_ENV): published
# outbox rows, the consumer's inbox and delivery rows, and finished jobs (an effect and a
# result manifest each, retention_bench's BACKLOG).
OLD_OUTBOX = """
INSERT INTO relay.outbox (event_id, tenant, operation_id, type, version, digest, body,
                          occurred_at, enqueued_at, state, published_at, publish_id)
SELECT gen_random_uuid(), 'acme', 'old-' || i, 'report.accepted', 1, repeat('0', 64),
       convert_to('{"report_id":"old","subject":"quarterly figures"}', 'UTF8'),
       now() - interval '30 days', now() - interval '30 days', 'published',
       now() - interval '30 days', gen_random_uuid()
FROM generate_series(1, $1) i
"""
OLD_INBOX = """
INSERT INTO consumers.inbox (tenant, consumer, operation_id, event_id, digest, event_type,
                             version, occurred_at, first_seen_at)
SELECT 'acme', 'report', 'old-' || i, gen_random_uuid(), repeat('0', 64), 'report.accepted', 1,
       now() - interval '30 days', now() - interval '30 days'
FROM generate_series(1, $1) i
"""
OLD_DELIVERIES = """
INSERT INTO consumers.deliveries (tenant, consumer, operation_id, event_id, redelivered,
                                  delivery_count, outcome, received_at)
SELECT 'acme', 'report', 'old-' || i, gen_random_uuid(), false, 0, 'new',
       now() - interval '30 days'
FROM generate_series(1, $1) i
"""
# What is still there of that backlog, per table (read outside the clock).
OLD_LEFT = """
SELECT (SELECT count(*) FROM jobs.jobs WHERE updated_at < now() - interval '1 day') AS jobs,
       (SELECT count(*) FROM relay.outbox WHERE published_at < now() - interval '1 day')
           AS outbox,
       (SELECT count(*) FROM consumers.inbox WHERE first_seen_at < now() - interval '1 day')
           AS inbox,
       (SELECT count(*) FROM consumers.deliveries WHERE received_at < now() - interval '1 day')
           AS deliveries
"""
# Retentions a day long (the horizon an hour and 5 minutes): the month-old backlog is due at
# once, nothing the run writes is. The pruning intervals and batches stay as shipped.
PRUNING_ENV = {
    "ACCORD_INBOX_REPLAY_WINDOW_S": "3600",
    "ACCORD_JOBS_RETENTION_S": "86400",
    "ACCORD_POISON_RETENTION_S": "86400",
    "ACCORD_AUDIT_RETENTION_S": "86400",
    "ACCORD_RELAY_RETENTION_S": "86400",
}


async def fill_backlog(dsn: str, rows: int) -> None:
    """``rows`` expired rows in each table the pipeline's pruners keep (see OLD_*)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO jobs.tenants (tenant) VALUES ('acme') ON CONFLICT DO NOTHING"
        )
        for start in range(0, rows, 10_000):
            await conn.execute(retention_bench.BACKLOG, min(10_000, rows - start), str(start))
        for statement in (OLD_OUTBOX, OLD_INBOX, OLD_DELIVERIES):
            await conn.execute(statement, rows)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


# -- accord: the shipped processes -------------------------------------------------------------


def accord_env(
    dsn: str, amqp_url: str, prefix: str, provider_url: str, work: Path
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ACCORD_PG_DSN=dsn,
        ACCORD_AMQP_URL=amqp_url,
        ACCORD_APP="accord.demo:app",
        ACCORD_TOPOLOGY_PREFIX=prefix,
        ACCORD_CONSUMER_TENANTS="*",
        ACCORD_JOURNAL_DIR=str(work / "journal"),
        ACCORD_OBJECT_DIR=str(work / "objects"),
        ACCORD_LEDGER_PATH=str(work / "authority.ledger"),
        ACCORD_DEMO_PROVIDER_URL=provider_url,
        ACCORD_DEMO_DRAFT_S="0",
    )
    return env


ACCORD = [sys.executable, "-m", "accord"]
PROJECTION = [*ACCORD, "consume", "--workflow", "report_projection"]


def accord_argv(
    workers: int, concurrency: int, work: Path, *, projection: bool
) -> dict[str, list[str]]:
    argv = {
        "relay": [*ACCORD, "relay"],
        "consumer": [*ACCORD, "consume", "--workflow", "report"],
    }
    if projection:
        argv["projection"] = PROJECTION
    for k in range(1, workers + 1):
        argv[f"worker-{k}"] = [
            *ACCORD, "worker", "--workflow", "report", "--concurrency", str(concurrency),
            "--poll-s", str(POLL_S), "--journal", str(work / "journal" / f"w{k}.journal"),
        ]  # fmt: skip
    return argv


def start_processes(
    argvs: dict[str, list[str]],
    env: dict[str, str],
    work: Path,
    own_env: dict[str, dict[str, str]] | None = None,
) -> dict[str, subprocess.Popen[bytes]]:
    """``own_env``: variables for some processes only, by name."""
    procs = {}
    for name, argv in argvs.items():
        with (work / "logs" / f"{name}.log").open("ab") as log:
            procs[name] = subprocess.Popen(
                [*argv, "--app", "accord.demo:app"],
                env={**env, **(own_env or {}).get(name, {})},
                stdout=log,
                stderr=log,
            )
    return procs


def authority_checks(ports: dict[str, int]) -> dict[str, float]:
    """accord_authority_checks_total of the workers serving /metrics on ``ports``, summed by
    trigger (what brought each check on)."""
    totals: dict[str, float] = {}
    for port in ports.values():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "accord_authority_checks_total":
                    trigger = sample.labels["trigger"]
                    totals[trigger] = totals.get(trigger, 0.0) + sample.value
    return totals


def accord_command(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([*ACCORD, *args], env=env, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"accord {args[0]} failed: {done.stderr.decode()[-800:]}")


async def wait_ready(procs: dict[str, subprocess.Popen[bytes]], logs: Path) -> None:
    """Until each process logged its ``... ready:`` line."""
    deadline = time.monotonic() + 60
    waiting = set(procs)
    while waiting:
        for name in list(waiting):
            if procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited {procs[name].returncode}; see {logs}")
            if " ready:" in (logs / f"{name}.log").read_text(errors="replace"):
                waiting.discard(name)
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready after 60 s: {sorted(waiting)}; see {logs}")
        await anyio.sleep(0.1)


async def submit_accord(pool: asyncpg.Pool, run_id: str, n: int, submitters: int) -> None:
    async def one(k: int) -> None:
        async with pool.acquire() as conn:
            for i in range(k, n, submitters):
                async with conn.transaction():
                    await accept_submission(
                        conn, TENANTS[i % 2], f"{run_id}-{i:05d}", f"quarterly figures #{i}"
                    )

    async with anyio.create_task_group() as tg:
        for k in range(submitters):
            tg.start_soon(one, k)


async def wait_count(pool: asyncpg.Pool, query: str, n: int, deadline: float) -> tuple[float, int]:
    """Wait until ``query`` counts n; returns perf_counter at that moment and the polls made
    (each one two commits: its query and the pool's reset)."""
    polls = 0
    while True:
        polls += 1
        if await pool.fetchval(query) >= n:
            return time.perf_counter(), polls
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{query!r} below {n} at the deadline")
        await anyio.sleep(0.02)


async def commits(dsn: str) -> int:
    """The database's committed transactions so far (pg_stat_database.xact_commit). A backend
    reports its counts when it ends and, while it lives, at most once a second, so a reading
    is exact only for backends that ended: the bench reads after the processes stopped, and
    before the clock after a pause longer than that second."""
    conn = await asyncpg.connect(dsn)
    try:
        count: int = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    return count


async def bench_accord(
    opts: argparse.Namespace,
    admin: str,
    amqp_url: str,
    provider: Provider,
    *,
    during: bool,
    backlog: int = 0,
) -> dict[str, Any]:
    """One run of the shipped processes; ``during``: the projection consumer runs from the
    start, else it starts when the clock stops (see the module docstring). ``backlog``: that
    many expired rows in each table a pruner keeps, with retentions that make them due
    (PRUNING_ENV): the processes prune them as they ship while the pipeline runs."""
    n = opts.n
    work = Path(tempfile.mkdtemp(prefix="accord-pipe-", dir=opts.workdir))
    for sub in ("logs", "journal", "objects"):
        (work / sub).mkdir()
    prefix = f"pipe{uuid.uuid4().hex[:6]}"
    topology = demo_topology(prefix)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    async with Scratch(admin, "accord_pipe") as dsn:
        env = accord_env(dsn, amqp_url, prefix, provider.url, work)
        if backlog:
            env.update(PRUNING_ENV)
        try:
            accord_command(env, "migrate", "--app", "accord.demo:app")
            accord_command(
                env, "register", "--workflow", "report", "--owner", "accord-worker",
                "--effects", "enabled", "--who", "pipeline-bench", "--app", "accord.demo:app",
            )  # fmt: skip
            if backlog:
                await fill_backlog(dsn, backlog)
            argv = accord_argv(opts.workers, opts.concurrency, work, projection=during)
            metrics_ports = (
                {name: free_port() for name in argv if name.startswith("worker")}
                if opts.worker_metrics
                else {}
            )
            own_env = {name: {"ACCORD_METRICS_PORT": str(p)} for name, p in metrics_ports.items()}
            procs.update(start_processes(argv, env, work, own_env))
            await wait_ready(procs, work / "logs")
            await anyio.sleep(1.5)  # what the processes did so far is reported (see commits)
            commits0 = await commits(dsn)
            pool = await asyncpg.create_pool(
                dsn, min_size=opts.submitters + 1, max_size=opts.submitters + 1
            )
            assert pool is not None
            try:
                left0 = dict(await pool.fetchrow(OLD_LEFT)) if backlog else {}
                everyone = {**procs, "provider": provider.process}
                cpu0 = {name: cpu_s(p.pid) for name, p in everyone.items()}
                pg0 = await backends_cpu_s(pool)
                own0 = time.process_time()
                machine0 = machine_s()
                start = time.perf_counter()
                await submit_accord(pool, uuid.uuid4().hex[:6], n, opts.submitters)
                submitted = time.perf_counter()
                own1 = time.process_time()
                done, polls = await wait_count(pool, COUNT_REPORTS, n, start + opts.timeout_s)
                checks = await anyio.to_thread.run_sync(authority_checks, metrics_ports)
                machine = machine_spent(machine0, n)
                cpu1 = {name: cpu_s(p.pid) for name, p in everyone.items()}
                pg1 = await backends_cpu_s(pool)
                left1 = dict(await pool.fetchrow(OLD_LEFT)) if backlog else {}
                if not during:  # the clock stopped: now the projection drains its queue
                    procs.update(start_processes({"projection": PROJECTION}, env, work))
                projected, more = await wait_count(pool, COUNT_PROJECTED, n, start + opts.timeout_s)
                polls += more
            finally:
                await pool.close()
        finally:
            stop_processes(procs)
            await delete_broker_names(amqp_url, topology)
        # The processes' commits from the clock's start to their exit (the projection's tail
        # and the stop included), less the bench's own polls; the submitters' are the enqueue.
        committed = await commits(dsn) - commits0 - 2 * polls - 1
    kinds: dict[str, float] = {}
    for name in cpu0:
        kind = "worker" if name.startswith("worker-") else name
        kinds[kind] = kinds.get(kind, 0.0) + cpu1[name] - cpu0[name]
    kinds["submitter (bench, in-process)"] = own1 - own0
    elapsed = done - start
    return {
        "elapsed_s": elapsed,
        "submit_s": submitted - start,
        "projection": "during" if during else "after",
        "projected_s": projected - start,
        "projection_catch_up_s": projected - (start if during else done),
        "submissions_per_s": n / elapsed,
        "cpu_ms_per_submission": {k: 1000 * v / n for k, v in kinds.items()},
        "accord_cpu_ms_per_submission": 1000
        * sum(
            v for k, v in kinds.items() if k not in ("provider",) and not k.startswith("submitter")
        )
        / n,
        "commits_per_submission": committed / n,
        "machine_cpu_ms_per_submission": machine["machine_cpu_ms_per_item"],
        "machine_busy": machine["machine_busy"],
        "machine_steal": machine["machine_steal"],
        "postgresql_cpu_ms_per_submission": {
            k: 1000 * v / n for k, v in sorted(backends_by_process(pg0, pg1).items())
        },
        "logs": str(work / "logs"),
        # --worker-metrics: the workers' authority checks by trigger, start to clock stop.
        "authority_checks": checks,
        # Expired rows each pruner removed while the clock ran, and what was left at its end.
        "pruned_during": {k: left0[k] - left1[k] for k in left0},
        "expired_left": left1,
    }


# -- raw: the same stages, written directly -----------------------------------------------------


async def raw_enqueue(dsn: str, n: int, submitters: int) -> float:
    """(a) the domain row and the bare outbox row, one transaction per submission."""
    run_id = uuid.uuid4().hex[:6]
    items = []
    for i in range(n):
        tenant, report_id = TENANTS[i % 2], f"{run_id}-{i:05d}"
        e = Event(
            tenant=tenant,
            operation_id=f"report:{report_id}",
            type="report.accepted",
            version=1,
            payload={"report_id": report_id, "subject": f"quarterly figures #{i}"},
        )
        domain = (
            tenant,
            report_id,
            e.payload["subject"],
            e.operation_id,
            e.event_id,
            e.occurred_at,
        )
        items.append((domain, outbox.enqueue_args(e, CATALOG.digest(e), encode_payload(e), None)))
    pool = await asyncpg.create_pool(dsn, min_size=submitters, max_size=submitters)
    assert pool is not None

    async def one(k: int) -> None:
        async with pool.acquire() as conn:
            for domain, row in items[k::submitters]:
                async with conn.transaction():
                    await conn.execute(demo_sql.INSERT_SUBMISSION, *domain)
                    await conn.execute(relay_sql.ENQUEUE, *row)

    try:
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for k in range(submitters):
                tg.start_soon(one, k)
        return n / (time.perf_counter() - start)
    finally:
        await pool.close()


async def raw_consume(dsn: str, url: str, queue_name: str, n: int) -> float:
    """(c) aio-pika consume, per batch one transaction (inbox row + job row per message), ack."""
    conn = await asyncpg.connect(dsn)
    amqp = await aio_pika.connect(url)
    try:
        channel = await amqp.channel()
        await channel.set_qos(prefetch_count=64)
        queue = await channel.get_queue(queue_name)
        arrived: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        done = 0
        start = time.perf_counter()
        tag = await queue.consume(arrived.put)
        while done < n:
            batch = [await arrived.get()]
            while len(batch) < 64 and not arrived.empty():
                batch.append(arrived.get_nowait())
            async with conn.transaction():
                for m in batch:
                    body = json.loads(m.body)
                    await conn.execute(RAW_INBOX, m.message_id)
                    await conn.execute(
                        RAW_SUBMIT,
                        str(m.headers["ce-tenantid"]),
                        body["report_id"],
                        str(m.headers["ce-operationid"]),
                        m.body,
                    )
            await batch[-1].ack(multiple=True)
            done += len(batch)
        elapsed = time.perf_counter() - start
        await queue.cancel(tag)
        return n / elapsed
    finally:
        await amqp.close()
        await conn.close()


async def raw_job(dsn: str, provider_url: str, n: int, tasks: int) -> float:
    """(d) claim one, the provider call with an idempotency key, succeeded + report row."""
    pool = await asyncpg.create_pool(dsn, min_size=tasks, max_size=tasks)
    assert pool is not None
    provider = ProviderClient(provider_url)
    done: list[int] = []

    async def loop() -> None:
        me = uuid.uuid4().hex
        async with pool.acquire() as conn:
            while row := await conn.fetchrow(RAW_CLAIM, me):
                body = json.loads(row["payload"])
                receipt = await provider.create_report(
                    f"raw:{row['tenant']}:{row['operation_id']}:provider.create_report",
                    {"tenant": row["tenant"], **body},
                )
                async with conn.transaction():
                    await conn.execute(RAW_SUCCEEDED, row["id"])
                    await conn.execute(
                        RAW_REPORT, row["tenant"], row["report_id"], row["id"], receipt.receipt_id
                    )
                done.append(1)

    try:
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(tasks):
                tg.start_soon(loop)
        elapsed = time.perf_counter() - start
    finally:
        await pool.close()
    assert len(done) == n, (len(done), n)
    return n / elapsed


async def bench_raw(
    opts: argparse.Namespace, admin: str, amqp_url: str, provider: Provider
) -> dict[str, Any]:
    n = opts.n
    topology = Topology(
        f"piperaw{uuid.uuid4().hex[:6]}", (WorkflowQueue("report", ("report.accepted.v1",)),)
    )
    async with Scratch(admin, "accord_pipe_raw") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await migrate.migrate(conn, app_chains=app.migration_chains())
            await conn.execute(RAW_SETUP)
        finally:
            await conn.close()
        amqp = await aio_pika.connect(amqp_url)
        try:
            await declare(await amqp.channel(), topology)
        finally:
            await amqp.close()
        try:
            await anyio.sleep(1.5)  # see commits
            commits0 = await commits(dsn)
            rates = {"enqueue": await raw_enqueue(dsn, n, opts.submitters)}
            rates["relay"] = await raw_relay(dsn, amqp_url, topology.exchange, n)
            rates["consume"] = await raw_consume(dsn, amqp_url, topology.queue("report"), n)
            rates["job"] = await raw_job(dsn, provider.url, n, opts.workers * opts.concurrency)
            committed = await commits(dsn) - commits0 - 1
        finally:
            await delete_broker_names(amqp_url, topology)
    limit = 1 / sum(1 / r for r in rates.values())
    return {
        "stage_per_s": rates,
        "submissions_per_s": limit,
        "commits_per_submission": committed / n,
    }


# -- DBOS: the peer, in its own venv ------------------------------------------------------------


def ensure_dbos_venv() -> Path:
    """var/bench/dbos-venv with dbos==3.4.0 (pip, from the package index), created once."""
    python = DBOS_VENV / "bin" / "python"
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('dbos'))"]
    if python.exists():
        done = subprocess.run(probe, capture_output=True, text=True, check=False)
        if done.stdout.strip() == DBOS_VERSION:
            return python
    DBOS_VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(DBOS_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"dbos=={DBOS_VERSION}"], check=True
    )
    return python


def dbos_shape(spec: str, total: int) -> tuple[int, int]:
    """``--dbos-executors`` entry -> (executors, total worker concurrency): ``E`` splits
    ``total`` over E executors, ``ExC`` gives each of E executors C."""
    executors, _, each = spec.partition("x")
    return int(executors), int(each) * int(executors) if each else total


async def bench_dbos(
    opts: argparse.Namespace, admin: str, provider: Provider, python: Path, spec: str
) -> dict[str, Any]:
    executors, concurrency = dbos_shape(spec, opts.workers * opts.concurrency)
    async with Scratch(admin, "dbos_pipe") as dsn:
        argv = [
            str(python), str(ROOT / "bench" / "dbos_peer.py"), "run", "--dsn", dsn,
            "--n", str(opts.n), "--executors", str(executors),
            "--concurrency", str(concurrency),
            "--submitters", str(opts.submitters), "--poll-s", str(POLL_S),
            "--run", uuid.uuid4().hex[:6], "--timeout-s", str(opts.timeout_s),
        ]  # fmt: skip
        env = {**os.environ, "PIPE_PROVIDER_URL": provider.url}
        cpu0 = cpu_s(provider.process.pid)
        done = await anyio.run_process(argv, env=env, check=False, stderr=None)
        cpu1 = cpu_s(provider.process.pid)
    if done.returncode != 0:
        raise RuntimeError(f"dbos_peer failed ({done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    if result["done"] < opts.n:
        raise RuntimeError(f"DBOS published {result['done']} of {opts.n}")
    result["submissions_per_s"] = opts.n / result["elapsed_s"]
    result["executor_cpu_ms_per_submission"] = 1000 * sum(result["executor_cpu_s"]) / opts.n
    result["provider_cpu_ms_per_submission"] = 1000 * (cpu1 - cpu0) / opts.n
    result["machine_cpu_ms_per_submission"] = 1000 * result["machine_busy_s"] / opts.n
    return result


# -- the run ------------------------------------------------------------------------------------


async def main(opts: argparse.Namespace) -> None:
    settings = load_settings()
    admin = with_database(settings.pg_dsn, "postgres")
    python = ensure_dbos_venv() if opts.dbos else None
    opts.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pipeline-", dir=opts.workdir))
    print(
        f"pipeline bench: {opts.n} submissions, {opts.workers} workers x {opts.concurrency},"
        f" {opts.submitters} submitters, rounds {opts.rounds}, dbos={'on' if python else 'off'}",
        flush=True,
    )
    provider = Provider(work)
    rounds: list[dict[str, Any]] = []
    try:
        await provider.ready()
        for rnd in range(1, opts.rounds + 1):
            accord = functools.partial(bench_accord, opts, admin, settings.amqp_url, provider)
            variants: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
                "raw": lambda: bench_raw(opts, admin, settings.amqp_url, provider),
                "accord": functools.partial(accord, during=False),
            }
            if opts.projection_during:
                variants["accord+projection"] = functools.partial(accord, during=True)
            if opts.prune_backlog:
                variants["accord+pruning"] = functools.partial(
                    accord, during=False, backlog=opts.prune_backlog
                )
            if python is not None:
                for spec in opts.dbos_executors:
                    name = f"dbos-{spec}" if "x" in spec else f"dbos-{spec}x"
                    variants[name] = functools.partial(
                        bench_dbos, opts, admin, provider, python, spec
                    )
            order = list(variants) if rnd % 2 else list(reversed(variants))
            results: dict[str, Any] = {}
            for name in order:
                results[name] = await variants[name]()
                print(
                    f"round {rnd}  {name:<17}"
                    f" {results[name]['submissions_per_s']:8.1f} submissions/s",
                    flush=True,
                )
            rounds.append(results)
    finally:
        provider.stop()
    summary = summarize(rounds)
    print(json.dumps({"n": opts.n, "workers": opts.workers, "concurrency": opts.concurrency,
                      "submitters": opts.submitters, "rounds": rounds, "summary": summary},
                     indent=2))  # fmt: skip
    report(summary, rounds)


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ratios: dict[str, list[float]] = {}
    for r in rounds:
        dbos = {k: v["submissions_per_s"] for k, v in r.items() if k.startswith("dbos-")}
        for variant in ("accord", "accord+projection"):
            if variant not in r:
                continue
            rate = r[variant]["submissions_per_s"]
            ratios.setdefault(f"{variant} / raw", []).append(rate / r["raw"]["submissions_per_s"])
            for k, v in dbos.items():
                ratios.setdefault(f"{variant} / {k}", []).append(rate / v)
            if dbos:
                ratios.setdefault(f"{variant} / best dbos", []).append(rate / max(dbos.values()))
        if "accord+pruning" in r:
            ratios.setdefault("accord+pruning / accord", []).append(
                r["accord+pruning"]["submissions_per_s"] / r["accord"]["submissions_per_s"]
            )
    return {
        k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ratios.items()
    }


def report(summary: dict[str, Any], rounds: list[dict[str, Any]]) -> None:
    last = rounds[-1]
    a = last["accord"]
    print("\n== pipeline bench ==")
    print(
        f"accord pipeline: {a['submissions_per_s']:.1f} submissions/s (N reports in"
        f" {a['elapsed_s']:.2f} s, accepted in {a['submit_s']:.2f} s; the projection, started"
        f" then, caught up in {a['projection_catch_up_s']:.2f} s; last round)"
    )
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in a["cpu_ms_per_submission"].items())
    print(
        f"  CPU ms per submission: {cpu};"
        f" accord's processes {a['accord_cpu_ms_per_submission']:.2f}"
    )
    stages = ", ".join(f"{k} {v:.0f}/s" for k, v in last["raw"]["stage_per_s"].items())
    print(f"raw stages: {stages} -> raw limit {last['raw']['submissions_per_s']:.1f}/s")
    print(
        f"PostgreSQL commits per submission: accord {a['commits_per_submission']:.2f},"
        f" raw {last['raw']['commits_per_submission']:.2f}"
    )
    if a.get("authority_checks"):
        by = ", ".join(f"{k} {v:.0f}" for k, v in sorted(a["authority_checks"].items()))
        print(f"  the workers' authority checks (/metrics): {by}")
    # Every process and the kernel: what two cores must pay per submission, against what
    # half the raw limit would allow them if they were as busy as in this run.
    served = a["postgresql_cpu_ms_per_submission"]
    goal_rate = 0.5 * last["raw"]["submissions_per_s"]
    machine = a["machine_cpu_ms_per_submission"]
    rest = machine - sum(a["cpu_ms_per_submission"].values()) - sum(served.values())
    print(
        f"  the whole machine's CPU per submission: {machine:.2f} ms ({a['machine_busy']:.0%}"
        f" of its {os.cpu_count()} cores busy, {a['machine_steal']:.0%} stolen by the host;"
        f" RabbitMQ, the kernel and the rest {rest:.2f}); 0.5 x raw ({goal_rate:.0f}/s) allows"
        f" {1000 * (os.cpu_count() or 1) * a['machine_busy'] / goal_rate:.2f} ms"
    )
    by = ", ".join(f"{k} {v:.2f}" for k, v in served.items())
    print(f"  PostgreSQL backends' CPU ms per submission, by the process served: {by};"
          f" in all {sum(served.values()):.2f}")  # fmt: skip
    if "accord+projection" in last:
        p = last["accord+projection"]
        print(
            f"accord+projection (the projection consuming meanwhile):"
            f" {p['submissions_per_s']:.1f} submissions/s, projected in {p['projected_s']:.2f} s;"
            f" accord's processes {p['accord_cpu_ms_per_submission']:.2f} ms CPU per submission"
        )
    if "accord+pruning" in last:
        p = last["accord+pruning"]
        pruned = ", ".join(f"{k} {v}" for k, v in p["pruned_during"].items())
        left = ", ".join(f"{k} {v}" for k, v in p["expired_left"].items())
        print(
            f"accord+pruning (the shipped pruners working through a month-old backlog):"
            f" {p['submissions_per_s']:.1f} submissions/s; expired rows pruned while the clock"
            f" ran: {pruned}; left at its end: {left}"
        )
    for key, goal in (
        ("accord / raw", 0.5),
        ("accord+pruning / accord", None),
        ("accord / best dbos", 2.0),
        ("accord+projection / raw", None),
        ("accord+projection / best dbos", None),
    ):
        if key in summary:
            s = summary[key]
            wanted = f"; goal >= {goal}" if goal is not None else ""
            print(f"{key}: {s['median']:.2f} (rounds {s['min']:.2f}-{s['max']:.2f}{wanted})")
    dbos = {k: v for k, v in last.items() if k.startswith("dbos-")}
    if dbos:
        best = max(dbos, key=lambda k: dbos[k]["submissions_per_s"])
        for k, v in dbos.items():
            print(
                f"  {k}: {v['submissions_per_s']:.1f}/s, executors' CPU"
                f" {v['executor_cpu_ms_per_submission']:.2f} ms/submission, the whole machine's"
                f" {v['machine_cpu_ms_per_submission']:.2f} ({v['machine_busy']:.0%} busy,"
                f" {v['machine_steal']:.0%} stolen),"
                f" accord / {k} {summary[f'accord / {k}']['median']:.2f}"
            )
        print(f"  best-tuned DBOS configuration: {best}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dbos", action="store_true", help="also run DBOS Transact")
    parser.add_argument(
        "--no-projection-during", dest="projection_during", action="store_false",
        help="skip the variant whose projection consumer runs during the clock",
    )  # fmt: skip
    parser.add_argument(
        "--worker-metrics", action="store_true",
        help="the workers serve /metrics (as a deployment's would), and the run reports"
        " their authority checks by trigger",
    )  # fmt: skip
    parser.add_argument(
        "--dbos-executors", type=lambda s: s.split(","), default=["1", "2"],
        help="DBOS shapes to run, comma-separated: E (E executors sharing workers x"
        " concurrency) or ExC (E executors of C each)",
    )  # fmt: skip
    parser.add_argument(
        "--prune-backlog", type=int, default=0,
        help="also run accord beside this many expired rows per pruned table, its pruners on",
    )  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "bench" / "pipeline")
    run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
