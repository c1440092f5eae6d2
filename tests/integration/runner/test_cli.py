"""`accord worker` as a process: refusals at start, then the report workflow until SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from accord.commands.worker import pool_size
from accord.demo import DEFAULT_OWNER, report
from accord.jobs import JobState
from accord.jobs.ledger import PgLedger
from accord.jobs.runner import scan_journal
from tests.integration.runner.conftest import TENANT, Rig, wait_for
from tests.support import free_port, scrape

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "accord", "worker", "--workflow", "report"]
pytestmark = pytest.mark.timeout(90)


async def _succeeded(rig: Rig, job_id: int) -> bool:
    return await rig.state(job_id) == JobState.SUCCEEDED


async def _stopped(process: Process) -> int:
    """SIGTERM, then the exit status (within 30 s)."""
    process.send_signal(signal.SIGTERM)
    with anyio.fail_after(30):
        return await process.wait()


def _env(pg_dsn: str, tmp: Path, provider_url: str = "http://127.0.0.1:9") -> dict[str, str]:
    return {
        **os.environ,
        "ACCORD_APP": "accord.demo:app",
        "ACCORD_PG_DSN": pg_dsn,
        "ACCORD_DEMO_PROVIDER_URL": provider_url,
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
    assert unknown.returncode == 2 and b"AppInvalid" in unknown.stderr
    # a class this worker knows, with no queue owner registered in the database (test-only)
    await rig.pool.execute("DELETE FROM jobs.workflows WHERE workflow = $1", CLI[-1])
    unregistered = await anyio.run_process(CLI, env=env, cwd=ROOT, check=False)
    assert unregistered.returncode == 2 and b"WorkflowNotRegistered" in unregistered.stderr
    # none of them opened a journal or claimed anything
    assert not (tmp_path / "journal").exists()
    assert await rig.pool.fetchval("SELECT count(*) FROM jobs.jobs WHERE attempts > 0") == 0


async def test_a_worker_whose_ledger_database_is_down_exits_75_not_2(
    rig: Rig, tmp_path: Path
) -> None:
    """The authority ledger's database does not answer at the start (LedgerUnavailable, caused
    by ServiceUnavailable): a restart may cure it, so the worker exits 75, which a supervisor
    restarts on; a refusal exits 2, which it should not (docs/operations.md, Exit status).
    Control: the same worker with a ledger database that answers runs a job."""
    env = _env(rig.pg_dsn, tmp_path, rig.provider.url)
    down = {**env, "ACCORD_LEDGER_PG_DSN": f"postgresql://postgres@127.0.0.1:{free_port()}/x"}
    done = await anyio.run_process(CLI, env=down, cwd=ROOT, check=False)
    last = done.stderr.decode().strip().splitlines()[-1]
    assert done.returncode == 75, done.stderr.decode()[-2000:]
    assert last.startswith("accord: LedgerUnavailable: "), last
    await PgLedger(rig.pg_dsn).ensure()
    job_id = await rig.submit_report("r-ledger")
    process = await anyio.open_process(
        [*CLI, "--poll-s", "0.1"], env={**env, "ACCORD_LEDGER_PG_DSN": rig.pg_dsn}, cwd=ROOT
    )
    try:
        await wait_for(partial(_succeeded, rig, job_id), within=30)
    finally:
        code = await _stopped(process)
    assert code == 0


async def test_accord_worker_runs_the_report_job_and_stops_on_sigterm(
    rig: Rig, tmp_path: Path
) -> None:
    job_id = await rig.submit_report("r-cli")
    env = _env(rig.pg_dsn, tmp_path, rig.provider.url)
    process = await anyio.open_process(
        [*CLI, "--lease-s", "5", "--poll-s", "0.1"], env=env, cwd=ROOT, stderr=subprocess.PIPE
    )
    try:
        await wait_for(partial(_succeeded, rig, job_id), within=30)
        # its connections carry its name in PostgreSQL; the test's own pool does not
        names = await rig.pool.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
        )
        assert "accord worker report" in {row["application_name"] for row in names}
        # its pool opened every connection at its start and keeps them: a server that cannot
        # give them is refused then, not found out by heartbeats that fail mid-job
        theirs = [row for row in names if row["application_name"] == "accord worker report"]
        assert len(theirs) >= pool_size(4)
        mine = await rig.pool.fetchval("SELECT current_setting('application_name')")
        assert mine != "accord worker report"
    finally:
        code = await _stopped(process)
    assert code == 0
    done = await report(rig.pool, TENANT, "r-cli")
    assert done is not None and done.provider_receipt == rig.provider.evidence()[0].receipt_id
    assert (tmp_path / "objects").is_dir()
    records = scan_journal(tmp_path / "journal" / f"{DEFAULT_OWNER}.report.journal").records
    assert [r["type"] for r in records] == ["claim", "effect_begin", "effect_outcome", "publish"]


@pytest.mark.parametrize("exporter", ["none", "console"])
async def test_a_worker_keeps_trace_contexts_only_while_its_spans_leave_it(
    rig: Rig, tmp_path: Path, exporter: str
) -> None:
    """A worker serving /metrics records spans for its messaging metrics. Without tracing
    (OTEL_TRACES_EXPORTER=none) nothing exports them, so it writes no attempt or effect
    trace context for a later span to link to (two round trips per job, each a commit).
    Control: with an exporter (console) it keeps both, as before."""
    job_id = await rig.submit_report(f"r-{exporter}")
    port = free_port()
    env = {
        **_env(rig.pg_dsn, tmp_path, rig.provider.url),
        "ACCORD_METRICS_PORT": str(port),
        "OTEL_TRACES_EXPORTER": exporter,
    }
    process = await anyio.open_process(
        [*CLI, "--lease-s", "5", "--poll-s", "0.1"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await wait_for(partial(_succeeded, rig, job_id), within=30)
        figures = await anyio.to_thread.run_sync(scrape, port)
    finally:
        assert await _stopped(process) == 0
    assert figures is not None and figures["accord_jobs_finished_total"] >= 1  # measuring
    kept = await rig.pool.fetchrow(
        "SELECT j.attempt_trace IS NOT NULL AS attempt,"
        " (SELECT count(*) FROM jobs.effect_traces e WHERE e.job_id = j.job_id) AS effects"
        " FROM jobs.jobs j WHERE j.job_id = $1",
        job_id,
    )
    exported = exporter != "none"
    assert (kept["attempt"], kept["effects"]) == (exported, int(exported))


async def _accord(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process(
        [sys.executable, "-m", "accord", *args], env=env, cwd=ROOT, check=False
    )


async def test_registration_with_effects_disabled_keeps_the_effect_from_beginning(
    rig: Rig, tmp_path: Path
) -> None:
    """The integration checkpoint. Control: registered with effects enabled (the rig's own
    registration), a job runs its effect and publishes (the test above). Then `accord
    register --effects disabled`, an audited act: the worker still claims the class, its
    job is refused at begin_effect (nothing dispatched, no effect record) and parked, and
    `accord status` says the work waits for that."""
    env = _env(rig.pg_dsn, tmp_path, rig.provider.url)
    again = await _accord(
        env, "register", "--workflow", "report", "--owner", DEFAULT_OWNER, "--who", "test-operator"
    )  # fmt: skip
    assert b"effects=enabled" in again.stdout, again.stderr  # no --effects: kept as it was
    done = await _accord(
        env, "register", "--workflow", "report", "--owner", DEFAULT_OWNER,
        "--effects", "disabled", "--who", "test-operator",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert b"effects=disabled who=test-operator" in done.stdout
    audit = await rig.pool.fetch(
        "SELECT action, owner, effects_enabled, previous_effects_enabled, who"
        " FROM jobs.registration_audit WHERE workflow = 'report' ORDER BY audit_id"
    )
    assert tuple(audit[-1]) == ("register", DEFAULT_OWNER, False, True, "test-operator")
    job_id = await rig.submit_report("r-off")
    process = await anyio.open_process(
        [*CLI, "--lease-s", "5", "--poll-s", "0.1"], env=env, cwd=ROOT, stderr=subprocess.PIPE
    )
    try:

        async def refused() -> bool:
            last = await rig.pool.fetchval(
                "SELECT last_error FROM jobs.jobs WHERE job_id = $1", job_id
            )
            return bool(last == "effects_disabled")

        await wait_for(refused, within=30)
    finally:
        await _stopped(process)
    assert (
        await rig.pool.fetchval("SELECT count(*) FROM jobs.effects WHERE job_id = $1", job_id) == 0
    )
    assert rig.provider.evidence() == []  # nothing reached the provider
    status = await _accord(env, "status")
    assert status.returncode == 0, status.stderr
    [line] = [ln for ln in status.stdout.decode().splitlines() if "effects_disabled" in ln]
    assert "report" in line and TENANT in line
    # It waits, parked out of every claim's range (0038), spending no attempt, while effects
    # stay disabled ...
    assert await rig.pool.fetchval(
        "SELECT run_after = 'infinity' FROM jobs.jobs WHERE job_id = $1", job_id
    )
    process = await anyio.open_process(
        [*CLI, "--lease-s", "5", "--poll-s", "0.1"], env=env, cwd=ROOT, stderr=subprocess.PIPE
    )
    try:
        await anyio.sleep(1.5)
        attempts = await rig.pool.fetchval(
            "SELECT attempts FROM jobs.jobs WHERE job_id = $1", job_id
        )
        assert attempts == 1
        # ... and runs once effects are enabled again, the enabling bringing it back (control:
        # the same worker serves it)
        done = await _accord(
            env, "register", "--workflow", "report", "--owner", DEFAULT_OWNER,
            "--effects", "enabled", "--who", "test-operator",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

        await wait_for(partial(_succeeded, rig, job_id), within=30)
    finally:
        await _stopped(process)
