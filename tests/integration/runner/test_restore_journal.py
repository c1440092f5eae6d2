"""The runner journal across a real restore (pg_dump -Fc, pg_restore): what it holds of calls
the restored database lost stays evidence, noted and shown, until a person acknowledges it,
however retention treats the job ids the restore rewound (migration 0054)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from accord.demo import DEFAULT_OWNER
from accord.jobs import JobState, Store
from accord.jobs.runner import JobContext, Success, scan_journal
from tests.integration.authority.test_restore_drill import pg_tool
from tests.integration.runner.conftest import Rig, running, wait_for

pytestmark = pytest.mark.timeout(120)


def pay_handler(calls: dict[int, str]) -> Any:
    """The job's one provider call, by job id (the order jobs run in is the worker's)."""

    async def pay(ctx: JobContext) -> None:
        key = ctx.idempotency_key("pay")

        async def send() -> Success:
            calls[ctx.lease.job_id] = key
            return Success(f"rcpt-{key}")

        await ctx.effect("pay", {"amount": 5}, send, idempotency_key=key)
        await ctx.publish()

    return pay


async def run_jobs(rig: Rig, journal: str, jobs: list[int], calls: dict[int, str]) -> None:
    """A shipped worker with its own journal runs ``jobs`` to success, then stops."""
    worker = rig.worker({"pay": (pay_handler(calls), 30.0)}, journal=journal, lease_s=30.0)
    async with running(worker):

        async def done() -> bool:
            return all([await rig.state(j) == JobState.SUCCEEDED for j in jobs])

        await wait_for(done)


async def accord(dsn: str, *argv: str) -> tuple[int, str]:
    env = {**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": dsn}
    done = await anyio.run_process([sys.executable, "-m", "accord", *argv], env=env, check=False)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_a_restore_s_lost_calls_stay_evidence_through_retention_until_acknowledged(
    rig: Rig, empty_pg_dsn: str, tmp_path: Path
) -> None:
    """Live: job X is queued when the dump is taken; then a worker (journal w1) runs X and a
    new job Y, each calling the provider once. The dump is restored: X is queued again, Y is
    gone and its id free. There a second worker runs X again (another attempt, the same
    idempotency key) and a new job Z, which takes Y's id; retention then removes both. w1's
    journal still holds the first run's begins: X's by an attempt this database never saw,
    Y's under an id a pruned job of this database had. Before 0054 the prune mark covered
    both ids with no job left, so w1's start let both go, the only record of Y's call (its
    operation exists nowhere else). Now its start reports both, notes them (`accord status`
    lists them), and keeps them at every start until `accord repair acknowledge-evidence`;
    then the next start lets them go. Control: the second worker's own journal, whose
    attempts this database recorded and pruned (tombstones), has nothing to report."""
    await rig.store.register_workflow("pay", DEFAULT_OWNER, effects_enabled=True)
    x = await rig.submit_job("op-x", "pay")
    dump = tmp_path / "accord.dump"
    done = await anyio.run_process(
        [pg_tool("pg_dump"), "-Fc", "-f", str(dump), "-d", rig.pg_dsn], check=False
    )
    assert done.returncode == 0, done.stderr
    y = await rig.submit_job("op-y", "pay")
    first_calls: dict[int, str] = {}
    await run_jobs(rig, "w1", [x, y], first_calls)
    assert sorted(first_calls) == [x, y]

    done = await anyio.run_process(
        [pg_tool("pg_restore"), "--exit-on-error", "-d", empty_pg_dsn, str(dump)], check=False
    )
    assert done.returncode == 0, done.stderr
    pool = await asyncpg.create_pool(empty_pg_dsn, min_size=1, max_size=8)
    assert pool is not None
    restored = dataclasses.replace(
        rig, pg_dsn=empty_pg_dsn, pool=pool, store=Store(pool, backoff_base_s=0.0), workers=[]
    )
    try:
        assert await restored.state(x) == JobState.QUEUED
        z = await restored.submit_job("op-z", "pay")
        assert z == y  # the restore rewound the job ids
        second_calls: dict[int, str] = {}
        await run_jobs(restored, "w2", [x, z], second_calls)
        assert (await restored.prune_past_retention([x, z])).jobs == 2
        assert await pool.fetchval("SELECT count(*) FROM jobs.pruned_attempts") == 2

        async def start(journal: str) -> list[Any]:
            """A worker's start on the restored database (then it stops: no work)."""
            worker = restored.worker({"pay": (pay_handler({}), 30.0)}, journal=journal)
            async with running(worker):
                pass
            return list(worker.unrecorded)

        assert await start("w2") == []  # control: recorded, then pruned with tombstones
        found = await start("w1")
        assert sorted((e.ref.job_id, e.begin.idempotency_key) for e in found) == sorted(
            first_calls.items()
        )
        assert all(e.evidence_id is not None for e in found)
        code, out = await accord(empty_pg_dsn, "status", "--json")
        assert code == 0, out
        listed = json.loads(out)["journal_evidence"]
        assert sorted(v["evidence_id"] for v in listed) == sorted(e.evidence_id for e in found)
        assert {v["runner_id"] for v in listed} == {"w1"}
        assert [e.evidence_id for e in await start("w1")] == [e.evidence_id for e in found]
        for entry in found:
            code, out = await accord(
                empty_pg_dsn, "repair", "acknowledge-evidence", "--id", str(entry.evidence_id),
                "--who", "alice", "--evidence", f"provider: {entry.begin.idempotency_key} once",
            )  # fmt: skip
            assert code == 0, out
        assert await start("w1") == []
        assert scan_journal(restored.journal_path("w1")).records == ()
    finally:
        await pool.close()
