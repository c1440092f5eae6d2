"""`accord gc-objects` end to end: the keep set comes from jobs.results in a real database."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

from accord.commands import gc_objects
from accord.jobs.runner.objects import LocalDirStore

ROOT = Path(__file__).resolve().parents[2]


def run_cli(
    dsn: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "ACCORD_APP": "accord.demo:app",
        "ACCORD_PG_DSN": dsn,
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "accord", "gc-objects", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def make_old(store: LocalDirStore, key: str) -> None:
    then = time.time() - 7200
    os.utime(store.root / key[7:9] / key, (then, then))


async def reference(pg: asyncpg.Connection, key: str, operation: str) -> None:
    job_id = await pg.fetchval(
        "SELECT job_id FROM jobs.submit('t', 'report', $1, 'd', '{}', 5)", operation
    )
    await pg.execute(
        "INSERT INTO jobs.results (job_id, tenant, object_key, content_digest)"
        " VALUES ($1, 't', $2, 'd')",
        job_id,
        key,
    )


async def test_the_keep_set_statement_prepares(pg: asyncpg.Connection) -> None:
    await pg.prepare(gc_objects.REFERENCED_KEYS)


async def test_gc_objects_keeps_referenced_and_young_objects(
    pg_dsn: str, pg: asyncpg.Connection, tmp_path: Path
) -> None:
    store = LocalDirStore(tmp_path / "objects")
    referenced_old = store.put(b"published result")
    unreferenced_old = store.put(b"abandoned result")
    unreferenced_young = store.put(b"result of a job still running")
    make_old(store, referenced_old)
    make_old(store, unreferenced_old)
    await reference(pg, referenced_old, "op-1")

    done = run_cli(pg_dsn, "--dir", str(store.root), "--retention-s", "3600")
    assert done.returncode == 0, done.stderr
    assert f"deleted {unreferenced_old}" in done.stdout
    assert "deleted 1 unreferenced objects" in done.stdout
    assert sorted(i.key for i in store.iter()) == sorted([referenced_old, unreferenced_young])

    make_old(store, unreferenced_young)  # its job never published: now it is garbage too
    again = run_cli(pg_dsn, "--dir", str(store.root), "--retention-s", "3600")
    assert again.returncode == 0, again.stderr
    assert [i.key for i in store.iter()] == [referenced_old]

    refused = run_cli(pg_dsn, "--dir", str(store.root), "--retention-s", "-1")
    assert refused.returncode == 2 and "retention" in refused.stderr


async def test_gc_objects_refuses_a_retention_shorter_than_a_job_s_lease(
    pg_dsn: str, tmp_path: Path
) -> None:
    store = LocalDirStore(tmp_path / "objects")
    key = store.put(b"the result of a publish still in flight")
    make_old(store, key)
    for retention in ("0", "59"):  # the lease is 60 s by default
        refused = run_cli(pg_dsn, "--dir", str(store.root), "--retention-s", retention)
        assert refused.returncode == 2, refused.stdout
        assert "shorter than a job's lease (ACCORD_JOB_LEASE_S=60)" in refused.stderr
        assert store.exists(key)  # nothing removed
    done = run_cli(pg_dsn, "--dir", str(store.root), "--retention-s", "60")  # control
    assert done.returncode == 0 and not store.exists(key), done.stderr


LONG_LEASE_APP = """
from pydantic import BaseModel
from accord import App, Catalog, EventType

class Placed(BaseModel):
    order_id: str

app = App("long_lease", catalog=Catalog([EventType("order.placed", 1, Placed)]))

@app.job("orders", owner="w", lease_s=600)
async def orders(ctx):
    return None
"""


async def test_gc_objects_refuses_a_retention_shorter_than_the_application_s_longest_lease(
    pg_dsn: str, tmp_path: Path
) -> None:
    """An application whose job declares a lease of 600 s: a retention of 60 s (ACCORD_JOB_LEASE_S,
    which alone let it pass before) could take the object of that job's publish in flight."""
    (tmp_path / "long_lease.py").write_text(LONG_LEASE_APP)
    store = LocalDirStore(tmp_path / "objects")
    key = store.put(b"the result of a long job's publish still in flight")
    make_old(store, key)
    app = ("--app", "long_lease:app")
    path = {"PYTHONPATH": f"{tmp_path}:{ROOT}"}
    refused = run_cli(pg_dsn, *app, "--dir", str(store.root), "--retention-s", "60", env=path)
    assert refused.returncode == 2, refused.stdout
    assert "shorter than a job's lease (the orders job's lease_s=600)" in refused.stderr
    assert store.exists(key)
    done = run_cli(pg_dsn, *app, "--dir", str(store.root), "--retention-s", "600", env=path)
    assert done.returncode == 0 and not store.exists(key), done.stderr  # control


async def test_gc_objects_refuses_a_schema_behind_the_code(
    empty_pg_dsn: str, tmp_path: Path
) -> None:
    store = LocalDirStore(tmp_path)
    key = store.put(b"x")
    make_old(store, key)
    done = run_cli(empty_pg_dsn, "--dir", str(tmp_path), "--retention-s", "3600")
    assert done.returncode == 2
    assert "SchemaBehind" in done.stderr or "MigrationError" in done.stderr
    assert store.exists(key)  # nothing collected without knowing the references
