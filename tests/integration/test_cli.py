"""`accord migrate [--check]` as a user runs it, against a real database."""

from __future__ import annotations

import os
import subprocess
import sys

import asyncpg


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
