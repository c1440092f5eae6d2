"""The DBOS Transact side of bench/pipeline_bench: the same report job, run in DBOS's own venv.

    var/bench/dbos-venv/bin/python bench/dbos_peer.py run --dsn DSN --provider-url URL \
        --n 300 --executors 2 --concurrency 16 --submitters 4 --poll-s 0.05

Runs only in var/bench/dbos-venv (``pip install dbos==3.4.0``; pipeline_bench creates it),
never in the project's venv: ``dbos`` and ``sqlalchemy`` are imported untyped here. The DSN
names an empty scratch database (pipeline_bench creates and drops it); DBOS's system tables
(schema ``dbos``), its datasource checkpoints and the job's own tables (schema ``pipe``) all
live in it, which is what makes acceptance atomic:

* acceptance and scheduling in one transaction: the submission row is inserted and the
  workflow enqueued (``DBOSClient.enqueue_in_transaction``, workflow id = the operation id)
  in one SQLAlchemy transaction on that database, committed by the submitter;
* a step (``DBOS.step``) calls the same provider simulator as accord's job
  (``POST /reports``, one connection per call) with an idempotency key derived from the
  workflow id, so a re-executed workflow asks for the same thing;
* the final write, the report row and the submission marked published, is one
  ``SQLAlchemyDatasource.transaction`` (READ COMMITTED, like accord's publish; DBOS's
  default is SERIALIZABLE), checkpointed in the same transaction.

``run`` starts ``--executors`` executor processes (this file, ``executor``), each with a
Queue of ``worker_concurrency = concurrency / executors`` polled every ``--poll-s``, waits
until they are ready, submits N from ``--submitters`` threads without pacing, waits until
N report rows exist, and prints one JSON line: elapsed seconds and each executor's CPU.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa  # type: ignore[import-not-found]
from dbos import (  # type: ignore[import-not-found]
    DBOS,
    DBOSClient,
    SQLAlchemyDatasource,
)

APP = "dbos_pipe"
VERSION = "bench"
QUEUE = "reports"
WORKFLOW = "report_workflow"

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS pipe;
CREATE TABLE IF NOT EXISTS pipe.submissions (
    tenant text NOT NULL, report_id text NOT NULL, subject text NOT NULL,
    operation_id text NOT NULL,
    state text NOT NULL DEFAULT 'accepted' CHECK (state IN ('accepted', 'published')),
    accepted_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tenant, report_id));
CREATE TABLE IF NOT EXISTS pipe.reports (
    tenant text NOT NULL, report_id text NOT NULL, provider_receipt text,
    published_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tenant, report_id),
    FOREIGN KEY (tenant, report_id) REFERENCES pipe.submissions (tenant, report_id));
"""
INSERT_SUBMISSION = sa.text(
    "INSERT INTO pipe.submissions (tenant, report_id, subject, operation_id)"
    " VALUES (:tenant, :report_id, :subject, :operation_id)"
)
# The report row and its submission marked published in one statement, as accord's demo
# writes them (its PUBLISH_REPORT, without the outbox row DBOS has no use for).
PUBLISH_REPORT = sa.text(
    "WITH report AS (INSERT INTO pipe.reports (tenant, report_id, provider_receipt)"
    " VALUES (:tenant, :report_id, :receipt))"
    " UPDATE pipe.submissions SET state = 'published'"
    " WHERE tenant = :tenant AND report_id = :report_id"
)
COUNT_REPORTS = sa.text("SELECT count(*) FROM pipe.reports")


def sa_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


def configure(dsn: str, executor_id: str) -> Any:
    """The DBOS instance and the job's datasource (the same database); workflow registered."""
    DBOS(
        config={
            "name": APP,
            "system_database_url": dsn,
            "application_version": VERSION,
            "executor_id": executor_id,
            "log_level": "WARNING",
        }
    )
    ds = SQLAlchemyDatasource.create(sa_url(dsn))
    provider = urlsplit(os.environ["PIPE_PROVIDER_URL"])

    def create_at_provider(tenant: str, report_id: str, subject: str, key: str) -> str:
        body = json.dumps(
            {"tenant": tenant, "report_id": report_id, "subject": subject},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
        conn = http.client.HTTPConnection(
            provider.hostname or "127.0.0.1", provider.port, timeout=10
        )
        try:
            conn.request(
                "POST",
                "/reports",
                body,
                {"Idempotency-Key": key, "Content-Type": "application/json"},
            )
            answer = conn.getresponse()
            data = json.loads(answer.read())
        finally:
            conn.close()
        if answer.status not in (200, 201):
            raise RuntimeError(f"provider answered {answer.status}: {data}")
        return str(data["receipt_id"])

    def publish(tenant: str, report_id: str, receipt: str) -> None:
        session = ds.sql_session()
        args = {"tenant": tenant, "report_id": report_id, "receipt": receipt}
        session.execute(PUBLISH_REPORT, args)

    step = DBOS.step(name="create_at_provider")(create_at_provider)
    tx = ds.transaction(name="publish", isolation_level="READ COMMITTED")(publish)

    def report_workflow(tenant: str, report_id: str, subject: str) -> None:
        key = f"{DBOS.workflow_id}:provider.create_report"
        tx(tenant, report_id, step(tenant, report_id, subject, key))

    DBOS.workflow(name=WORKFLOW)(report_workflow)
    return ds


def setup(dsn: str, worker_concurrency: int, poll_s: float) -> None:
    """Migrate DBOS's system tables and datasource, create the job's tables, and register
    the queue (its configuration lives in the system database; executors read it)."""
    ds = configure(dsn, "setup")
    DBOS.launch()
    with ds.engine.begin() as conn:
        conn.exec_driver_sql(SCHEMA)
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=worker_concurrency,
        polling_interval_sec=poll_s,
        on_conflict="always_update",
    )
    DBOS.destroy()


def executor(dsn: str, executor_id: str) -> None:
    configure(dsn, executor_id)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS.launch()
    print("ready", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_s() -> tuple[float, float, float]:
    """The machine's (busy, idle, steal) core-seconds so far (/proc/stat; as pipeline_bench's,
    this file runs in DBOS's venv and imports nothing of accord's)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, (idle + iowait) / hz, steal / hz


def submit_all(dsn: str, run: str, n: int, submitters: int) -> None:
    """N submissions without pacing, from ``submitters`` threads, each in its own transaction
    that inserts the row and enqueues its workflow."""
    client = DBOSClient(system_database_url=dsn, application_name=APP)
    engine = sa.create_engine(sa_url(dsn), pool_size=submitters, max_overflow=0)
    try:

        def one(k: int) -> None:
            for i in range(k, n, submitters):
                tenant, report_id = ("acme", "globex")[i % 2], f"{run}-{i:05d}"
                operation_id = f"report:{tenant}:{report_id}"
                with engine.begin() as conn:
                    conn.execute(
                        INSERT_SUBMISSION,
                        {
                            "tenant": tenant,
                            "report_id": report_id,
                            "subject": f"quarterly figures #{i}",
                            "operation_id": operation_id,
                        },
                    )
                    client.enqueue_in_transaction(
                        conn,
                        {
                            "workflow_name": WORKFLOW,
                            "queue_name": QUEUE,
                            "workflow_id": operation_id,
                            "app_version": VERSION,
                        },
                        tenant,
                        report_id,
                        f"quarterly figures #{i}",
                    )

        threads = [threading.Thread(target=one, args=(k,)) for k in range(submitters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        client.destroy()
        engine.dispose()


def run(args: argparse.Namespace) -> dict[str, Any]:
    me = [sys.executable, str(Path(__file__).resolve())]
    per = max(1, args.concurrency // args.executors)
    queue = ["--worker-concurrency", str(per), "--poll-s", str(args.poll_s)]
    subprocess.run([*me, "setup", "--dsn", args.dsn, *queue], check=True)
    procs = [
        subprocess.Popen(
            [*me, "executor", "--dsn", args.dsn, "--id", f"exec-{k}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(args.executors)
    ]
    engine = sa.create_engine(sa_url(args.dsn), pool_size=1)
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a DBOS executor did not start")
        cpu0 = [cpu_s(p.pid) for p in procs]
        machine0 = machine_s()
        start = time.perf_counter()
        submit_all(args.dsn, args.run, args.n, args.submitters)
        submitted = time.perf_counter() - start
        deadline = start + args.timeout_s
        done = 0
        while time.perf_counter() < deadline:
            with engine.connect() as conn:
                done = conn.execute(COUNT_REPORTS).scalar_one()
            if done >= args.n:
                break
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
        busy, idle, steal = (b - a for a, b in zip(machine0, machine_s(), strict=True))
        cpu = [cpu_s(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        engine.dispose()
    return {
        "n": args.n,
        "done": done,
        "executors": args.executors,
        "worker_concurrency": per,
        "poll_s": args.poll_s,
        "elapsed_s": elapsed,
        "submit_s": submitted,
        "executor_cpu_s": cpu,
        "machine_busy_s": busy,
        "machine_busy": busy / (busy + idle + steal),
        "machine_steal": steal / (busy + idle + steal),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--dsn", required=True)
    s.add_argument("--worker-concurrency", type=int, required=True)
    s.add_argument("--poll-s", type=float, required=True)
    e = sub.add_parser("executor")
    e.add_argument("--dsn", required=True)
    e.add_argument("--id", required=True)
    r = sub.add_parser("run")
    r.add_argument("--dsn", required=True)
    r.add_argument("--run", default="r")
    r.add_argument("--n", type=int, default=300)
    r.add_argument("--executors", type=int, default=2)
    r.add_argument("--concurrency", type=int, default=16)
    r.add_argument("--submitters", type=int, default=4)
    r.add_argument("--poll-s", type=float, default=0.05)
    r.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    if args.command == "setup":
        setup(args.dsn, args.worker_concurrency, args.poll_s)
    elif args.command == "executor":
        executor(args.dsn, args.id)
    else:
        print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
