"""`accord migrate [--check]` as a user runs it, against a real database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio
import asyncpg

from accord.schemas import sql


def run_cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": dsn}
    return subprocess.run(
        [sys.executable, "-m", "accord", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_migrate_check_exit_codes(empty_pg_dsn: str) -> None:
    behind = run_cli(empty_pg_dsn, "migrate", "--check")
    assert behind.returncode == 1, behind.stderr
    assert "behind" in behind.stdout
    done = run_cli(empty_pg_dsn, "migrate")
    assert done.returncode == 0, done.stderr
    current = run_cli(empty_pg_dsn, "migrate", "--check")
    assert current.returncode == 0, current.stderr
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await conn.execute("UPDATE schemas.migrations SET checksum = 'x' WHERE version = 1")
    finally:
        await conn.close()
    tampered = run_cli(empty_pg_dsn, "migrate")
    assert tampered.returncode == 2
    assert "MigrationTampered" in tampered.stderr


async def test_a_one_shot_command_stopped_by_sigterm_says_so_and_exits_143(
    empty_pg_dsn: str,
) -> None:
    """`accord migrate` stopped by SIGTERM (here while it waits for another migrator's lock)
    did not finish: exit 143 and a line saying to run it again, so `accord migrate && start`
    does not go on. Before, every command exited 0 on a SIGTERM before it served. Control:
    with the lock free the same command completes, exit 0."""
    holder = await asyncpg.connect(empty_pg_dsn)
    try:
        await holder.execute(sql.LOCK, sql.MIGRATION_LOCK_KEY)  # another migrator at work
        env = {**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": empty_pg_dsn}
        process = await anyio.open_process([sys.executable, "-m", "accord", "migrate"], env=env)
        async with process:
            waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            for _ in range(200):
                if await holder.fetchval(waiting):
                    break
                await anyio.sleep(0.05)
            else:
                raise AssertionError("accord migrate never waited for the lock")
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                assert process.stderr is not None
                err = b"".join([chunk async for chunk in process.stderr]).decode()
                code = await process.wait()
        assert code == 143, err
        assert "stopped by SIGTERM" in err and "run it again" in err
    finally:
        await holder.close()
    done = run_cli(empty_pg_dsn, "migrate")
    assert done.returncode == 0, done.stderr
