"""The restore drill: a database restored from a dump taken while work was leased must not
bring the old authority back.

Dump (pg_dump -Fc) while a job is leased → advance the tenant's authority (rotation or
restriction, ledger first) → restore the dump into a new database → start the processes:
the restore is detected, the lease that was valid in the dump can neither publish, renew nor
begin an effect, nothing is claimed until a repair principal advances the epoch past the
ledger, and after that new claims work (the control), once the owner lifted a restriction the
ledger recorded (it survives the restore).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import anyio
import pytest

from accord.jobs import FenceLost, FileLedger, RepairRefused, check_restore, require_authority, sql
from accord.jobs.authority import lift, restrict, rotate
from accord.jobs.repair import audit, release_hold
from tests.integration.authority.conftest import (
    TENANT,
    Principals,
    close_principals,
    open_principals,
)
from tests.support import unavailable

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def pg_tool(name: str) -> str:
    found = shutil.which(name) or (str(PG_BIN / name) if (PG_BIN / name).exists() else None)
    if found is None:
        unavailable(f"{name} not installed (the PostgreSQL client package)")
    return found


async def run(*argv: str, env: dict[str, str] | None = None) -> anyio.abc.Process:
    return await anyio.run_process(list(argv), env=env, check=False)  # type: ignore[return-value]


async def cli(dsn: str, ledger: FileLedger, *args: str) -> tuple[int, str]:
    env = {
        **os.environ,
        "ACCORD_APP": "accord.demo:app",
        "ACCORD_PG_DSN": dsn,
        "ACCORD_LEDGER_PATH": str(ledger.path),
    }
    done = await anyio.run_process([sys.executable, "-m", "accord", *args], env=env, check=False)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def fence_status(p: Principals, lease_args: tuple[object, ...]) -> str | None:
    """What the fence says about a lease, as the worker, without writing anything."""
    async with p.worker.acquire() as conn:
        tr = conn.transaction()
        await tr.start()
        try:
            status: str | None = await conn.fetchval(sql.FENCE, *lease_args)
        finally:
            await tr.rollback()
    return status


@pytest.mark.timeout(120)
@pytest.mark.parametrize("advance", ["rotation", "restriction"])
async def test_restore_drill(
    pg_dsn: str, empty_pg_dsn: str, ledger: FileLedger, tmp_path: Path, advance: str
) -> None:
    live = await open_principals(pg_dsn)
    try:
        assert await require_authority(live.worker, ledger) == []  # a process started
        await live.submit("a")
        await live.submit("b")
        lease = await live.claim_one(lease_s=600.0)
        await check_restore(live.worker, ledger)  # the periodic check records epoch 1
        # 1. the dump, taken while `lease` is valid
        dump = tmp_path / "accord.dump"
        done = await anyio.run_process(
            [pg_tool("pg_dump"), "-Fc", "-f", str(dump), "-d", pg_dsn], check=False
        )
        assert done.returncode == 0, done.stderr
        # 2. the authority moves on (ledger first)
        async with live.owner.acquire() as conn, conn.transaction():
            if advance == "rotation":
                assert await rotate(conn, ledger, TENANT, who="ops") == 2
            else:
                assert await restrict(conn, ledger, TENANT, who="ops", evidence="inc-1") == 2
        with pytest.raises(FenceLost):  # control: on the live database the lease is dead
            await live.store.publish(lease)
    finally:
        await close_principals(live)

    # 3. restore the dump into a fresh database: the old authority is back in it
    done = await anyio.run_process(
        [pg_tool("pg_restore"), "--exit-on-error", "-d", empty_pg_dsn, str(dump)], check=False
    )
    assert done.returncode == 0, done.stderr
    p = await open_principals(empty_pg_dsn)
    try:
        # The hazard is real: in the restored database the old lease passes the fence.
        assert await fence_status(p, lease.fence_args()) is None

        # 4. start the processes: the restore is detected at start-up
        code, out = await cli(empty_pg_dsn, ledger, "repair", "restore-check")
        assert code == 1, out
        assert f"restore tenant={TENANT} db_epoch=1 ledger_epoch=2 held=2" in out
        [restore] = await require_authority(p.worker, ledger)
        assert (restore.tenant, restore.db_epoch, restore.ledger_epoch) == (TENANT, 1, 2)

        # ... and nothing runs: the old lease cannot publish, renew or begin an effect
        assert await fence_status(p, lease.fence_args()) is not None
        with pytest.raises(FenceLost):
            await p.store.publish(lease)
        with pytest.raises(FenceLost):
            await p.store.begin_effect(lease, "charge", "intent")
        with pytest.raises(FenceLost):
            await p.store.renew(lease, 60.0)
        fresh = await p.submit("c")
        assert await p.claim() == []  # held work and new work alike
        assert {await p.state(j) for j in (lease.job_id, lease.job_id + 1)} == {"held"}
        async with p.repair.acquire() as conn:
            with pytest.raises(RepairRefused) as refused:
                async with conn.transaction():
                    await release_hold(conn, lease.job_id, who="alice", evidence="drill")
            assert refused.value.reason == "restore_unresolved"

        # 5. the repair principal validates and advances the epoch past the ledger
        code, out = await cli(
            empty_pg_dsn, ledger, "repair", "advance-epoch", "--tenant", TENANT,
            "--evidence", "restore drill: ledger epoch 2", "--who", "alice",
        )  # fmt: skip
        assert code == 0, out
        assert f"advanced tenant={TENANT} epoch=3 (ledger was 2)" in out
        assert (await ledger.read())[TENANT].epoch == 3
        assert await check_restore(p.worker, ledger) == []

        # 6. control: new claims work, under the new epoch; the old lease stays dead. A
        # restriction the ledger recorded survived the restore: the owner lifts it first.
        if advance == "restriction":
            assert await p.claim() == []
            async with p.owner.acquire() as conn, conn.transaction():
                assert await lift(conn, ledger, TENANT, who="ops", evidence="inc-1 closed") == 4
        [claimed] = await p.claim()
        epoch = 3 if advance == "rotation" else 4
        assert (claimed.job_id, claimed.epoch) == (fresh, epoch)
        await p.store.publish(claimed)
        with pytest.raises(FenceLost):
            await p.store.publish(lease)
        # held work runs only once a person releases it
        code, out = await cli(
            empty_pg_dsn, ledger, "repair", "release-hold", "--job", str(lease.job_id),
            "--evidence", "no effect was begun after the dump", "--who", "alice",
        )  # fmt: skip
        assert code == 0, out
        again = await p.claim_one()
        assert (again.job_id, again.epoch) == (lease.job_id, epoch)
        assert again.generation > lease.generation
        async with p.repair.acquire() as conn:
            trail = await audit(conn, tenant=TENANT)
        assert [(a.action, a.who, a.db_role) for a in trail] == [
            ("advance_epoch", "alice", "accord_repair"),
            ("release_hold", "alice", "accord_repair"),
        ]
    finally:
        await close_principals(p)
