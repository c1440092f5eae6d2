"""`accord jobs list|show` and the ids `accord status` points at, through the real command.

The subject: a job of the demo's ``report`` class whose provider reply was lost (its effect
finished ``unknown``, the job ``unknown``). `accord jobs show ID --app accord.demo:app` must
name the effect, the idempotency key the runner sent (computed here with the runner's own
function, not the command's) and the provider reconcile asks; without an application it
still names the key and the repair command. Payloads never appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
import pytest

from accord.demo.job import DEFAULT_OWNER, EFFECT_KEY, WORKFLOW
from accord.jobs import EffectState, Lease, Store, repair, submit
from accord.jobs.runner.effects import idempotency_key
from accord.ops import collect_status

SECRET = "SECRET-payload-never-printed"
TENANT = "acme"


def accord(dsn: str, *args: str, app: str = "accord.demo:app") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ACCORD_PG_DSN": dsn, "ACCORD_APP": app}
    return subprocess.run(
        [sys.executable, "-m", "accord", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


class Rig(Store):
    """The jobs store, with the pool it runs on."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool, backoff_base_s=3600.0)
        self.pool = pool


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[Rig]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    assert pool is not None
    store = Rig(pool)
    await store.register_workflow(WORKFLOW, DEFAULT_OWNER, effects_enabled=True)
    yield store
    await pool.close()


async def new_job(store: Rig, op: str, max_attempts: int = 5) -> Lease:
    async with store.pool.acquire() as conn, conn.transaction():
        await submit(
            conn, tenant=TENANT, workflow=WORKFLOW, operation_id=op, digest=f"d-{op}",
            payload={"report_id": op, "subject": SECRET}, max_attempts=max_attempts,
        )  # fmt: skip
    (lease,) = await store.claim(WORKFLOW, DEFAULT_OWNER, lease_s=600.0)
    return lease


async def lost_reply(store: Rig, op: str) -> Lease:
    """The provider accepted the request and its reply was lost: the effect is unknown, and
    the worker gives the job up as unknown (what the runner does for a lost reply)."""
    lease = await new_job(store, op)
    await store.begin_effect(lease, EFFECT_KEY, "intent-digest")
    await store.finish_effect(lease, EFFECT_KEY, EffectState.UNKNOWN)
    assert await store.fail(lease, "effect_outcome_unknown", retry=True) == "unknown"
    return lease


async def test_jobs_show_names_the_unknown_effect_its_key_and_the_evidence_needed(
    pg_dsn: str, store: Rig
) -> None:
    lease = await lost_reply(store, "report:lost")
    key = idempotency_key(lease, EFFECT_KEY)  # the key the runner sends the provider
    job = str(lease.job_id)

    shown = accord(pg_dsn, "jobs", "show", job, "--app", "accord.demo:app")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert f"job {job}  tenant={TENANT}  workflow={WORKFLOW}  operation=report:lost" in out
    assert "state: unknown  waits: unresolved_effect" in out
    assert "attempts: 1 of 5  generation: 1  last error: effect_outcome_unknown" in out
    assert f"{EFFECT_KEY} #1 unknown" in out
    assert f"outcome unknown: idempotency key {key}  provider: report_provider" in out
    assert f"reconcile asks provider report_provider for idempotency key {key}" in out
    # Given up just now: a "never seen" is no evidence for ACCORD_RECONCILE_SETTLE_S yet.
    assert 'a provider\'s "never seen" is evidence only from' in out
    resolve = (
        f"`accord repair resolve-effect --job {job} --key {EFFECT_KEY}"
        " --outcome succeeded|failed_before_dispatch --who NAME --evidence REF`"
    )
    assert resolve in out
    assert "registration audit of class report (1):" in out and f"owner={DEFAULT_OWNER}" in out
    assert SECRET not in out

    # The same as JSON, for scripts.
    data = json.loads(accord(pg_dsn, "jobs", "show", job, "--json").stdout)
    assert data["job_id"] == lease.job_id and data["waiting_reason"] == "unresolved_effect"
    assert data["unresolved"] == [
        {"effect_key": EFFECT_KEY, "seq": 1, "idempotency_key": key,
         "provider": "report_provider", "evidence": data["next_steps"][0],
         "never_seen_from": data["unresolved"][0]["never_seen_from"]},
    ]  # fmt: skip
    assert data["unresolved"][0]["never_seen_from"] > data["effects"][0]["begun_at"]
    assert SECRET not in json.dumps(data)

    # Control: the attempt ended two minutes ago, past the settle: no such note.
    owner = await asyncpg.connect(pg_dsn)
    try:
        async with owner.transaction():
            await owner.execute("SET LOCAL session_replication_role = replica")
            for table, columns in (
                ("jobs.jobs", ("updated_at", "lease_granted_until")),
                ("jobs.effects", ("begun_at", "finished_at")),
            ):
                moved = ", ".join(f"{c} = {c} - interval '120 s'" for c in columns)
                await owner.execute(f"UPDATE {table} SET {moved} WHERE job_id = $1", lease.job_id)
    finally:
        await owner.close()
    settled = accord(pg_dsn, "jobs", "show", job, "--app", "accord.demo:app").stdout
    assert f"reconcile asks provider report_provider for idempotency key {key}" in settled
    assert "is evidence only from" not in settled

    # Without an application: the key and the repair command, no provider named.
    bare = accord(pg_dsn, "jobs", "show", job, app="")
    assert bare.returncode == 0, bare.stderr
    assert f"ask it for idempotency key {key} (pass --app to name it); or {resolve}" in bare.stdout
    assert "report_provider" not in bare.stdout

    # Resolved with evidence: the evidence shows beside the effect, and the next step is resume.
    conn = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_repair"})
    try:
        async with conn.transaction():
            await repair.resolve_effect(
                conn, lease.job_id, EFFECT_KEY, EffectState.SUCCEEDED,
                who="ops-anna", evidence="provider receipt rcpt-9", receipt="rcpt-9",
            )  # fmt: skip
    finally:
        await conn.close()
    after = accord(pg_dsn, "jobs", "show", job).stdout
    assert f"{EFFECT_KEY} #1 succeeded" in after and "receipt=rcpt-9" in after
    assert "resolved by ops-anna (audit #" in after and "evidence: provider receipt rcpt-9" in after
    assert "resolve_effect key=provider.create_report outcome=succeeded who=ops-anna" in after
    assert "waits: awaiting_resume" in after and f"`accord repair resume --job {job}" in after
    assert "outcome unknown" not in after

    missing = accord(pg_dsn, "jobs", "show", "999999")
    assert missing.returncode == 2 and "JobNotFound" in missing.stderr


async def test_jobs_list_newest_first_with_filters_and_no_payload(pg_dsn: str, store: Rig) -> None:
    first = await lost_reply(store, "report:one")
    second = await new_job(store, "report:two", max_attempts=1)
    assert await store.fail(second, "provider_refused", retry=True) == "poison"

    listed = accord(pg_dsn, "jobs", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "id", "tenant", "workflow", "operation", "state", "attempts", "gen", "updated",
        "last_error",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == [str(second.job_id), str(first.job_id)]
    assert lines[1].split()[1:7] == [TENANT, WORKFLOW, "report:two", "poison", "1/1", "1"]
    assert lines[1].split()[-1] == "provider_refused"
    assert SECRET not in listed.stdout

    only = json.loads(accord(pg_dsn, "jobs", "list", "--state", "unknown", "--json").stdout)
    assert [j["job_id"] for j in only] == [first.job_id]
    assert (
        only[0]["operation_id"] == "report:one"
        and only[0]["last_error"] == "effect_outcome_unknown"
    )
    assert accord(pg_dsn, "jobs", "list", "--tenant", "nobody").stdout.strip() == "jobs: none"
    assert len(accord(pg_dsn, "jobs", "list", "--limit", "1").stdout.splitlines()) == 2


async def test_status_counts_finished_work_in_its_window_and_names_ids_to_act_on(
    pg_dsn: str, store: Rig
) -> None:
    unknown = await lost_reply(store, "report:unknown")
    done = await new_job(store, "report:done")
    await store.publish(done)
    old = await new_job(store, "report:old")
    await store.publish(old)
    poison = await new_job(store, "report:poison", max_attempts=1)
    assert await store.fail(poison, "x", retry=True) == "poison"
    async with store.pool.acquire() as conn:
        # Test-only direct write: this job finished two days ago.
        await conn.execute(
            "UPDATE jobs.jobs SET updated_at = now() - interval '2 days' WHERE job_id = $1",
            old.job_id,
        )
        report = await collect_status(conn)  # the default window: 24 hours
        week = await collect_status(conn, 7 * 86_400.0)
    finished = {(g.state, g.tenant, g.workflow): (g.jobs, g.example_ids) for g in report.finished}
    assert finished == {
        ("succeeded", TENANT, WORKFLOW): (1, ()),  # no ids for healthy work
        ("poison", TENANT, WORKFLOW): (1, (poison.job_id,)),
    }
    assert week.finished_count("succeeded") == 2 and week.finished_count("poison") == 1
    (waiting,) = [w for w in report.waiting if w.reason == "unresolved_effect"]
    assert waiting.example_ids == (unknown.job_id,)

    shown = accord(pg_dsn, "status")
    assert shown.returncode == 0, shown.stderr
    assert f"e.g. jobs {unknown.job_id}" in shown.stdout
    assert f"e.g. jobs {poison.job_id}" in shown.stdout
    assert "finished since " in shown.stdout
    data = json.loads(accord(pg_dsn, "status", "--since", "7d", "--json").stdout)
    assert data["totals"]["finished"] == {"succeeded": 2, "failed": 0, "poison": 1, "canceled": 0}
    refused = accord(pg_dsn, "status", "--since", "yesterday")
    assert refused.returncode == 2 and "InvalidSince" in refused.stderr


async def test_jobs_show_says_a_job_refused_for_disabled_effects_is_parked(
    pg_dsn: str, store: Rig
) -> None:
    """A job given up for effects_disabled while its class's effects are off is parked
    (run_after = 'infinity', 0038): `accord jobs show` says when it can run instead of a date
    in the year 9999, and its JSON says "infinity". Control: a job given up for another
    reason shows its backoff's date, with its zone."""
    await store.register_workflow(WORKFLOW, DEFAULT_OWNER, effects_enabled=False)
    refused = await new_job(store, "report:refused")
    assert await store.fail(refused, "effects_disabled", retry=True) == "queued"
    other = await new_job(store, "report:other")
    assert await store.fail(other, "handler:RuntimeError", retry=True) == "queued"
    shown = accord(pg_dsn, "jobs", "show", str(refused.job_id))
    assert shown.returncode == 0, shown.stderr
    assert "run after: never, parked until its class's effects are enabled" in shown.stdout
    assert "effects_disabled" in shown.stdout and "9999" not in shown.stdout
    as_json = json.loads(accord(pg_dsn, "jobs", "show", str(refused.job_id), "--json").stdout)
    assert as_json["run_after"] == "infinity"  # PostgreSQL's spelling, not a naive 9999 date
    control = accord(pg_dsn, "jobs", "show", str(other.job_id))
    assert control.returncode == 0, control.stderr
    assert "parked" not in control.stdout and "run after: 20" in control.stdout
    control_json = json.loads(accord(pg_dsn, "jobs", "show", str(other.job_id), "--json").stdout)
    assert datetime.fromisoformat(control_json["run_after"]).tzinfo is not None


async def test_jobs_show_says_a_job_given_up_for_good_will_not_run_again(
    pg_dsn: str, store: Rig
) -> None:
    """Migration 0055: a job whose handler gave it up without a retry while an effect was
    unknown is failed once the effect is resolved; `accord jobs show` says so before a person
    resolves it. Control: the job given up with a retry (lost_reply) says nothing of it."""
    retried = await lost_reply(store, "report:again")
    lease = await new_job(store, "report:final")
    await store.begin_effect(lease, EFFECT_KEY, "intent-digest")
    await store.finish_effect(lease, EFFECT_KEY, EffectState.UNKNOWN)
    assert await store.fail(lease, "handler_defect", retry=False) == "unknown"
    line = "given up without a retry: once its effects are resolved it is failed"
    final = accord(pg_dsn, "jobs", "show", str(lease.job_id))
    assert final.returncode == 0, final.stderr
    assert "state: unknown" in final.stdout and line in final.stdout
    assert json.loads(accord(pg_dsn, "jobs", "show", str(lease.job_id), "--json").stdout)[
        "final_failure"
    ]
    control = accord(pg_dsn, "jobs", "show", str(retried.job_id)).stdout
    assert "state: unknown" in control and line not in control
