"""The jobs claim beside a backlog of jobs that are not due yet, against the same run on an
empty table, same machine, same run.

    .venv/bin/python -m bench.claim_backlog_bench [--backlog 1000000] [--jobs 20000]
                                                  [--frozen | --refused [--unparked]]

A backlog of queued jobs whose ``run_after`` lies in the future (what a retry storm with
backoff, or jobs scheduled for later, leaves behind) must cost the claim nothing: the claim
reads eligible rows in ``run_after`` order through ``jobs_claimable_idx`` and stops at the
first row not yet due. Each round drains ``--jobs`` due no-op jobs with ``Store.claim`` and the
fenced ``Store.publish`` (bench.jobs_bench's ``accord`` variant), once on a database with no
other row and once on one holding ``--backlog`` future jobs of the same class, analyzed as
autovacuum leaves them. Rounds alternate the order; the figure is the best rate of each side
and their ratio (goal >= 0.9).

``--frozen``: the backlog is instead due a day ago and belongs to another tenant, frozen
(what a tenant frozen while its producers kept submitting leaves behind). Its jobs carry the
frozen flag (0037) that keeps them out of the claim's index range; before 0037 each claim
read all of them and dropped them at the join.

``--refused``: the backlog is instead the same class's jobs refused for effects_disabled while
its effects stay disabled (the bench's class is registered with effects disabled, and its
no-op jobs call no effect), as ``jobs.fail`` leaves them: parked, ``run_after = 'infinity'``
(0038). ``--unparked`` writes them as ``jobs.fail`` left them before 0038, due again after
their backoff (a day ago): each claim then reads them and drops them at its filter.
"""

from __future__ import annotations

import argparse
import os
import time

import asyncpg

from accord.runtime import run
from bench.jobs_bench import WORKFLOW, bench_accord, drop_database, fresh_database

# $1 queued jobs of the bench's class for tenant $3, due $4 from now (or never), last error
# $5, each with its operation key (the key row first: jobs_operation_fkey is checked at once,
# operations_job_fkey at commit).
BACKLOG_KEYS = """
INSERT INTO jobs.operations (tenant, workflow, operation_id, job_id)
SELECT $3, $2, 'later-' || i, 1000000000 + i FROM generate_series(1, $1) i
"""
BACKLOG_JOBS = """
INSERT INTO jobs.jobs (job_id, tenant, workflow, operation_id, digest, run_after, last_error)
OVERRIDING SYSTEM VALUE
SELECT 1000000000 + i, $3, $2, 'later-' || i, 'd',
       CASE WHEN $4 = 'infinity' THEN 'infinity'::timestamptz ELSE now() + $4::interval END, $5
FROM generate_series(1, $1) i
"""


BACKLOGS = {
    # kind: (tenant, run_after, last_error, what the backlog is)
    "future": ("t", "1 day", None, "future"),
    "frozen": ("ice", "-1 day", None, "frozen tenant's due"),
    "refused": ("t", "infinity", "effects_disabled", "parked refused"),
    "unparked": ("t", "-1 day", "effects_disabled", "due refused (as before 0038)"),
}


async def with_backlog(admin: str, backlog: int, kind: str) -> str:
    dsn = await fresh_database(admin)
    conn = await asyncpg.connect(dsn)
    tenant, due, error, what = BACKLOGS[kind]
    try:
        started = time.perf_counter()
        async with conn.transaction():
            await conn.execute("INSERT INTO jobs.tenants (tenant) VALUES ($1)", tenant)
            await conn.execute(BACKLOG_KEYS, backlog, WORKFLOW, tenant)
            await conn.execute(BACKLOG_JOBS, backlog, WORKFLOW, tenant, due, error)
            if kind == "frozen":  # its trigger flags every queued job of the tenant (0037)
                await conn.execute("SELECT jobs.set_frozen($1, true)", tenant)
        await conn.execute("VACUUM ANALYZE jobs.jobs, jobs.operations")
        print(f"  backlog of {backlog} {what} jobs written in {time.perf_counter() - started:.0f}s")
    finally:
        await conn.close()
    return dsn


def backlog_kind(args: argparse.Namespace) -> str:
    if args.refused:
        return "unparked" if args.unparked else "refused"
    return "frozen" if args.frozen else "future"


async def main(args: argparse.Namespace) -> None:
    admin = os.environ.get("ACCORD_PG_DSN_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
    n, w, b = args.jobs, args.workers, args.batch
    print(
        f"claim backlog bench: {n} due jobs, {w} workers, batch {b},"
        f" beside {args.backlog} {backlog_kind(args)} jobs, rounds {args.rounds}"
    )
    backlog_dsn = await with_backlog(admin, args.backlog, backlog_kind(args))
    empty: list[float] = []
    beside: list[float] = []
    try:
        for rnd in range(1, args.rounds + 1):
            sides = [("empty", empty), ("backlog", beside)]
            for label, sink in sides if rnd % 2 else reversed(sides):
                dsn = backlog_dsn if label == "backlog" else await fresh_database(admin)
                try:
                    elapsed, done = await bench_accord(dsn, n, w, b, mode="callback")
                finally:
                    if label == "empty":
                        await drop_database(admin, dsn)
                if label == "backlog":
                    # The drained jobs leave the backlog as it was for the next round.
                    conn = await asyncpg.connect(backlog_dsn)
                    try:
                        # One transaction: operations_job_fkey is checked at commit.
                        async with conn.transaction():
                            await conn.execute("DELETE FROM jobs.jobs WHERE state = 'succeeded'")
                            await conn.execute(
                                "DELETE FROM jobs.operations WHERE operation_id NOT LIKE 'later-%'"
                            )
                        await conn.execute("VACUUM ANALYZE jobs.jobs, jobs.operations")
                    finally:
                        await conn.close()
                sink.append(done / elapsed)
                print(f"round {rnd}  {label:<8} {done / elapsed:8.0f} jobs/s")
    finally:
        await drop_database(admin, backlog_dsn)
    kind = backlog_kind(args)
    print(
        f"claim beside {args.backlog} {kind} jobs / empty: {max(beside) / max(empty):.2f}"
        f" ({max(beside):.0f}/s vs {max(empty):.0f}/s)"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    kinds = parser.add_mutually_exclusive_group()
    kinds.add_argument(
        "--frozen", action="store_true", help="the backlog: a frozen tenant's due jobs"
    )
    kinds.add_argument(
        "--refused", action="store_true",
        help="the backlog: the class's jobs refused for effects_disabled, parked (0038)",
    )  # fmt: skip
    parser.add_argument(
        "--unparked", action="store_true",
        help="with --refused: due again, as jobs.fail left them before 0038",
    )  # fmt: skip
    args = parser.parse_args()
    if args.unparked and not args.refused:
        parser.error("--unparked goes with --refused")
    run(main, args)


if __name__ == "__main__":
    cli()
