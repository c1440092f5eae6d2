"""`accord worker` as a process: refusals at start, then the report workflow until SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from accord.demo import DEFAULT_OWNER, report
from jobs import JobState
from jobs.runner import scan_journal
from tests.integration.runner.conftest import TENANT, Rig, wait_for

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "accord", "worker", "--workflow", "report"]
pytestmark = pytest.mark.timeout(90)


def _env(pg_dsn: str, tmp: Path, provider_url: str = "http://127.0.0.1:9") -> dict[str, str]:
    return {
        **os.environ,
        "ACCORD_PG_DSN": pg_dsn,
        "ACCORD_PROVIDER_URL": provider_url,
        "ACCORD_JOURNAL_DIR": str(tmp / "journal"),
        "ACCORD_OBJECT_DIR": str(tmp / "objects"),
        "ACCORD_LEDGER_PATH": str(tmp / "authority.ledger"),
    }


async def test_accord_worker_refuses_to_start_when_it_should_not_serve(
    rig: Rig, empty_pg_dsn: str, tmp_path: Path
) -> None:
    behind = await anyio.run_process(CLI, env=_env(empty_pg_dsn, tmp_path), cwd=ROOT, check=False)
    assert behind.returncode == 2 and b"SchemaBehind" in behind.stderr
    env = _env(rig.pg_dsn, tmp_path)
    elsewhere = await anyio.run_process(
        [*CLI, "--owner", "someone-else"], env=env, cwd=ROOT, check=False
    )
    assert elsewhere.returncode == 2 and b"WorkflowOwnedElsewhere" in elsewhere.stderr
    unknown = await anyio.run_process([*CLI[:-1], "no-such-class"], env=env, cwd=ROOT, check=False)
    assert unknown.returncode == 2 and b"ConfigError" in unknown.stderr
    # a class this worker knows, with no queue owner registered in the database (test-only)
    await rig.pool.execute("DELETE FROM jobs.workflows WHERE workflow = $1", CLI[-1])
    unregistered = await anyio.run_process(CLI, env=env, cwd=ROOT, check=False)
    assert unregistered.returncode == 2 and b"WorkflowNotRegistered" in unregistered.stderr
    # none of them opened a journal or claimed anything
    assert not (tmp_path / "journal").exists()
    assert await rig.pool.fetchval("SELECT count(*) FROM jobs.jobs WHERE attempts > 0") == 0


async def test_accord_worker_runs_the_report_job_and_stops_on_sigterm(
    rig: Rig, tmp_path: Path
) -> None:
    job_id = await rig.submit_report("r-cli")
    env = _env(rig.pg_dsn, tmp_path, rig.provider.url)
    process = await anyio.open_process(
        [*CLI, "--lease-s", "5", "--poll-s", "0.1"], env=env, cwd=ROOT, stderr=subprocess.PIPE
    )
    try:

        async def succeeded() -> bool:
            return await rig.state(job_id) == JobState.SUCCEEDED

        await wait_for(succeeded, within=30)
    finally:
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            code = await process.wait()
    assert code == 0
    done = await report(rig.pool, TENANT, "r-cli")
    assert done is not None and done.provider_receipt == rig.provider.evidence()[0].receipt_id
    assert (tmp_path / "objects").is_dir()
    records = scan_journal(tmp_path / "journal" / f"{DEFAULT_OWNER}.report.journal").records
    assert [r["type"] for r in records] == ["claim", "effect_begin", "effect_outcome", "publish"]
