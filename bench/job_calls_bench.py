"""What one job's fenced calls cost PostgreSQL and the client, call by call, against the least
a statement costs on the same connection in the same run.

    .venv/bin/python -m bench.job_calls_bench [--n 2000]

One connection to a fresh migrated database, 2N claimed jobs: N run every call first (then
ANALYZE, the steady state a running service's autovacuum keeps), then each call once per job
of the other N, in sequence: ``begin_effect``, ``finish_effect``, ``publish`` (a no-op
callback and a result row: BEGIN, the fence, ``succeed_with_result``, COMMIT). The baselines
are a bare ``SELECT 1`` and an empty ``BEGIN``/``COMMIT``. The server's CPU is the backend
process's own (utime + stime in ``/proc/<pid>/stat``, so it needs the server on this
machine), the client's is this process's ``time.process_time``; wall is the round trip. Then
``track_functions`` (superuser) splits the fenced functions' server time into their own and
their callees' (fence_check, the effects_count trigger): where a call's cost is, not a guess.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from accord.jobs import Store, sql
from accord.jobs.models import EffectState, Lease
from accord.jobs.runner.objects import key_for
from bench.jobs_bench import drop_database, fresh_database
from bench.pipeline_bench import cpu_s

ADMIN_DSN = os.environ.get("ACCORD_PG_DSN_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
WORKFLOW, OWNER = "bench", "bench-owner"


async def _noop(tx: Any) -> None:
    return None


async def _empty_transaction(conn: asyncpg.Connection) -> None:
    async with conn.transaction():
        pass


async def measure(dsn: str, n: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        store = Store(conn)
        await store.register_workflow(WORKFLOW, OWNER, effects_enabled=True)
        async with conn.transaction():
            await conn.executemany(
                sql.SUBMIT, [("t", WORKFLOW, f"op{i}", "d", "{}", 5) for i in range(2 * n)]
            )
        leases: list[Lease] = []
        while len(leases) < 2 * n:
            leases += await store.claim(WORKFLOW, OWNER, lease_s=3600, limit=100)
        # Steady state: half the jobs run their calls first, then statistics are taken, so
        # the measured half is planned on tables as full as it finds them (statistics of an
        # empty jobs.effects plan its lookups as scans of the whole table; autovacuum would
        # have analyzed it since in a service that ran that long).
        key = key_for(b"the result")
        warm, leases = leases[:n], leases[n:]
        for lease in warm:
            await store.begin_effect(lease, "k", "d" * 64)
            await store.finish_effect(lease, "k", EffectState.SUCCEEDED, receipt="r")
            await store.publish(lease, _noop, result=(key, key.removeprefix("sha256-")))
        await conn.execute("ANALYZE jobs.jobs, jobs.tenants, jobs.effects, jobs.results")
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        await conn.execute("SET track_functions = 'all'")
        calls: dict[str, Callable[[Lease], Awaitable[Any]]] = {
            "SELECT 1 (baseline)": lambda _: conn.fetchval("SELECT 1"),
            "BEGIN + COMMIT (baseline)": lambda _: _empty_transaction(conn),
            "begin_effect": lambda lease: store.begin_effect(lease, "k", "d" * 64),
            "finish_effect": lambda lease: store.finish_effect(
                lease, "k", EffectState.SUCCEEDED, receipt="r"
            ),
            "publish (callback, result)": lambda lease: store.publish(
                lease, _noop, result=(key, key.removeprefix("sha256-"))
            ),
        }
        print(f"job calls bench: {n} jobs, one connection, each call once per job")
        head = ("call", "wall µs", "server µs", "client µs", "server / SELECT 1")
        print(f"{head[0]:28s} {head[1]:>8s} {head[2]:>10s} {head[3]:>10s} {head[4]:>18s}")
        floor = None
        for name, call in calls.items():
            wall, server, client = time.perf_counter(), cpu_s(backend), time.process_time()
            for lease in leases:
                await call(lease)
            wall_us = (time.perf_counter() - wall) / n * 1e6
            server_us = (cpu_s(backend) - server) / n * 1e6
            client_us = (time.process_time() - client) / n * 1e6
            floor = floor if floor is not None else max(server_us, 1.0)
            ratio = server_us / floor
            print(f"{name:28s} {wall_us:8.0f} {server_us:10.0f} {client_us:10.0f} {ratio:18.1f}")
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.fetchval("SELECT 1")  # the flush happens at the end of the statement before
        print("server time inside the functions (track_functions; µs per call):")
        rows = await conn.fetch(
            "SELECT schemaname || '.' || funcname AS name, calls, total_time, self_time"
            " FROM pg_stat_user_functions ORDER BY total_time DESC"
        )
        for row in rows:
            print(f"  {row['name']:28s} calls {row['calls']:6d}"
                  f"  total {1000 * row['total_time'] / row['calls']:6.1f}"
                  f"  own {1000 * row['self_time'] / row['calls']:6.1f}")  # fmt: skip
    finally:
        await conn.close()


async def main(n: int) -> None:
    dsn = await fresh_database(ADMIN_DSN)
    try:
        await measure(dsn, n)
    finally:
        await drop_database(ADMIN_DSN, dsn)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    asyncio.run(main(parser.parse_args().n))
