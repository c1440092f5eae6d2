"""A worker paused (SIGSTOP) past its lease, then resumed, cannot publish; the worker that
re-claimed the job can. The oracle is the database (demo.reports, jobs.*, relay.outbox) and
the provider's own evidence, never the workers' logs.

Both workers are real processes running `accord worker`'s composition (tests/faults/
worker_proc.py) with a handler that finishes its work even after losing the lease, so the
stale worker really does attempt its effect (``effect`` mode) or its publish (``publish``
mode) after it resumes: only the fence stands in its way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import asyncpg
import pytest

from accord.demo import DEFAULT_OWNER, accept_submission, report
from accord.demo.catalog import demo_catalog
from accord.demo.provider import ProviderServer
from accord.jobs import Store, submit
from accord.jobs.runner import LocalDirStore, scan_journal
from tests.faults.worker_proc import WORKFLOW

ROOT = Path(__file__).resolve().parents[2]
TENANT = "acme"
LEASE_S = 2.0
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def provider(tmp_path: Path) -> AsyncIterator[ProviderServer]:
    async with ProviderServer(tmp_path / "provider.db") as server:
        yield server


async def _submit(pg_dsn: str) -> int:
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            event = await accept_submission(conn, TENANT, "r-pause", "paused numbers")
            done = await submit(
                conn,
                tenant=TENANT,
                workflow=WORKFLOW,
                operation_id=event.operation_id,
                digest=demo_catalog().digest(event),
                payload=dict(event.payload),
            )
    finally:
        await conn.close()
    return done.job_id


async def _start(
    env: dict[str, str], tmp: Path, name: str, mode: str, *args: str
) -> anyio.abc.Process:
    command = [
        sys.executable,
        "-m",
        "tests.faults.worker_proc",
        "--journal",
        str(tmp / f"{name}.journal"),
        "--mode",
        mode,
        "--lease-s",
        str(LEASE_S),
        *args,
    ]
    with (tmp / f"{name}.log").open("ab") as log:  # the child keeps its own descriptor
        return await anyio.open_process(
            command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=log
        )


async def _read_until(
    process: anyio.abc.Process, marker: str, log: Path, within: float = 30
) -> str:
    assert process.stdout is not None
    seen = ""
    with anyio.fail_after(within):
        while marker not in seen:
            try:
                seen += (await process.stdout.receive()).decode()
            except anyio.EndOfStream:
                tail = log.read_text()[-3000:]  # noqa: ASYNC240 - a small log, on failure only
                pytest.fail(f"the worker exited early:\n{seen}\n{tail}")
    return seen


async def _stop(process: anyio.abc.Process) -> int:
    process.send_signal(signal.SIGTERM)
    with anyio.fail_after(30):
        return await process.wait()


@pytest.mark.parametrize("mode", ["effect", "publish"])
async def test_paused_worker_cannot_publish_the_reclaiming_worker_can(
    pg_dsn: str, provider: ProviderServer, tmp_path: Path, mode: str
) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    assert pool is not None
    try:
        await Store(pool).register_workflow(WORKFLOW, DEFAULT_OWNER, effects_enabled=True)
        job_id = await _submit(pg_dsn)
        env = {
            **os.environ,
            "ACCORD_APP": "accord.demo:app",
            "ACCORD_PG_DSN": pg_dsn,
            "ACCORD_DEMO_PROVIDER_URL": provider.url,
            "ACCORD_OBJECT_DIR": str(tmp_path / "objects"),
            "ACCORD_LEDGER_PATH": str(tmp_path / "authority.ledger"),
        }
        stale = await _start(env, tmp_path, "stale", mode, "--compute-s", "1.5")
        try:
            await _read_until(stale, f"computing job={job_id} generation=1", tmp_path / "stale.log")
            stale.send_signal(signal.SIGSTOP)  # paused mid-computation, holding the lease
            fresh = await _start(
                env, tmp_path, "fresh", mode, "--compute-s", "0.2", "--rescue-every-s", "0.2"
            )
            try:
                # control: after the lease ran out, rescue and a re-claim let the fresh one publish
                await _read_until(
                    fresh, f"published job={job_id} generation=3", tmp_path / "fresh.log"
                )
            finally:
                stale.send_signal(signal.SIGCONT)
                fresh_code = await _stop(fresh)
        finally:
            stale.send_signal(signal.SIGCONT)
            stale_code = await _stop(stale)
        assert (stale_code, fresh_code) == (0, 0)
        await _check_oracle(pool, provider, tmp_path, job_id, mode)
    finally:
        await pool.close()


async def _check_oracle(
    pool: asyncpg.Pool, provider: ProviderServer, tmp: Path, job_id: int, mode: str
) -> None:
    published = await report(pool, TENANT, "r-pause")
    assert published is not None and (published.job_id, published.generation) == (job_id, 3)
    job = await pool.fetchrow("SELECT state, generation FROM jobs.jobs WHERE job_id = $1", job_id)
    assert (job["state"], job["generation"]) == ("succeeded", 3)
    assert await pool.fetchval("SELECT count(*) FROM demo.reports") == 1
    results = await pool.fetch("SELECT object_key FROM jobs.results")
    assert [r["object_key"] for r in results] == [published.object_key]
    assert (
        await pool.fetchval("SELECT count(*) FROM relay.outbox WHERE type = 'report.published'")
        == 1
    )
    effects = await pool.fetch("SELECT seq, state, generation, receipt FROM jobs.effects")
    evidence = provider.evidence()
    if mode == "effect":
        # the stale worker's begin was refused by the fence, so it never called the provider
        assert [tuple(r) for r in effects] == [(1, "succeeded", 3, published.provider_receipt)]
        assert [e.receipt_id for e in evidence] == [published.provider_receipt]
    else:
        assert effects == [] and evidence == []
        # the stale worker did render and store its report: that object stays unreferenced
        objects = LocalDirStore(tmp / "objects")
        keys = {info.key for info in objects.iter()}
        assert len(keys) == 2 and published.object_key in keys
        [orphan] = keys - {published.object_key}
        assert json.loads(objects.get(orphan))["generation"] == 1
    # the journals agree: the stale worker claimed and never published
    stale = [(r["type"], r["generation"]) for r in scan_journal(tmp / "stale.journal").records]
    fresh = [(r["type"], r["generation"]) for r in scan_journal(tmp / "fresh.journal").records]
    assert stale == [("claim", 1)]
    assert ("publish", 3) in fresh
