"""A job whose effect succeeded is never rerun by an automatic loop; only the repair role's
audited resume lets it run again, and that run reuses the recorded outcome.

Each way a job ends up ``unknown`` with every effect outcome known (a failure after the
effect, a lost lease, a reconciled lost reply) is stuck for every loop until a resume;
every refusal of the resume comes after its control.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
import asyncpg
import pytest

from accord.jobs import (
    EffectAlreadyBegun,
    EffectConflict,
    EffectState,
    JobState,
    Lease,
    RepairRefused,
    repair_sql,
)
from accord.jobs.repair import audit, resolve_effect, resume
from accord.ops import collect_status
from tests.integration.authority.conftest import Principals

KEY = "deliver"
INTENT = "intent-digest"
DENIED = asyncpg.InsufficientPrivilegeError


async def succeeded_then(p: Principals, how: str, operation_id: str = "a") -> Lease:
    """A job whose effect succeeded (receipt r-1), left ``unknown`` by ``how``."""
    job_id = await p.submit(operation_id)
    lease = await p.claim_one()
    await p.store.begin_effect(lease, KEY, INTENT)
    if how == "resolved_unknown":  # the reply was lost; a person/reconciler found the receipt
        await p.store.finish_effect(lease, KEY, EffectState.UNKNOWN)
        assert await p.store.fail(lease, "effect_unknown", retry=True) is JobState.UNKNOWN
        await repaired(p, resolve_effect, job_id, KEY, EffectState.SUCCEEDED, receipt="r-1")
    else:
        await p.store.finish_effect(lease, KEY, EffectState.SUCCEEDED, receipt="r-1")
        if how == "fail_retry":  # a later step of the handler failed
            assert await p.store.fail(lease, "render", retry=True) is JobState.UNKNOWN
        else:  # the worker vanished after the effect: its lease ran out
            await p.expire(job_id)
            assert (await p.store.rescue()).unknown == [job_id]
    return lease


async def repaired(p: Principals, repair: Any, *args: object, **kwargs: object) -> Any:
    """``repair`` as the repair principal, with evidence, in its own transaction."""
    async with p.repair.acquire() as conn, conn.transaction():
        return await repair(conn, *args, who="alice", evidence="ticket-7", **kwargs)


async def refused(p: Principals, job_id: int, *, who: str = "a", evidence: str = "e") -> str:
    async with p.repair.acquire() as conn:
        with pytest.raises(RepairRefused) as info:
            async with conn.transaction():
                await resume(conn, job_id, who=who, evidence=evidence)
    return str(info.value.reason)


async def stuck_for_every_loop(p: Principals, job_id: int) -> None:
    """Nothing automatic touches it, and it is not listed as needing reconciliation."""
    assert await p.state(job_id) == "unknown"
    assert await p.claim() == []
    assert (await p.store.rescue()).rescued == ()
    assert await p.owner.fetchval("SELECT count(*) FROM jobs.reconciliation") == 0
    assert (await p.store.job(job_id)).awaiting_resume


@pytest.mark.parametrize("how", ["fail_retry", "lease_lost", "resolved_unknown"])
async def test_resume_reruns_once_and_reuses_the_recorded_outcome(
    principals: Principals, how: str
) -> None:
    p = principals
    first = await succeeded_then(p, how)
    job_id = first.job_id
    await stuck_for_every_loop(p, job_id)
    # control: the repair principal resumes it, with evidence, audited
    done = await repaired(p, resume, job_id)
    assert done.state is JobState.QUEUED
    [row] = [
        a for a in await p.repair.fetch(repair_sql.AUDIT_FOR_JOB, job_id) if a["action"] == "resume"
    ]
    assert (row["who"], row["evidence"], row["outcome"], row["db_role"]) == (
        "alice", "ticket-7", "queued", "accord_repair",
    )  # fmt: skip
    assert '"r-1"' in row["detail"]  # the succeeded effect it resumes past, with its receipt
    lease = await p.claim_one()
    assert lease.job_id == job_id and lease.generation > first.generation
    # the resumed run: the effect is not begun again, its recorded receipt comes back
    start = await p.store.start_effect(lease, KEY, INTENT)
    assert (start.reused, start.seq, start.receipt) == (True, 1, "r-1")
    with pytest.raises(EffectAlreadyBegun) as info:  # the plain begin never dispatches it
        await p.store.begin_effect(lease, KEY, INTENT)
    assert info.value.fields["state"] == "succeeded" and info.value.fields["receipt"] == "r-1"
    with pytest.raises(EffectConflict):  # a changed intent is not the recorded effect
        await p.store.start_effect(lease, KEY, "another-intent")
    await p.store.publish(lease)
    view = await p.store.job(job_id)
    assert view.state is JobState.SUCCEEDED and view.resumed_generation == lease.generation - 1
    assert [(e.seq, e.state, e.receipt) for e in view.effects] == [
        (1, EffectState.SUCCEEDED, "r-1")
    ]


async def test_a_resume_is_used_up_by_one_claim(principals: Principals) -> None:
    p = principals
    job_id = (await succeeded_then(p, "fail_retry")).job_id
    await repaired(p, resume, job_id)
    lease = await p.claim_one()  # control: the resumed claim
    # the resumed run fails again: no loop reruns it, neither fail(retry) nor rescue
    assert await p.store.fail(lease, "render", retry=True) is JobState.UNKNOWN
    await stuck_for_every_loop(p, job_id)
    await repaired(p, resume, job_id)
    lease = await p.claim_one()
    await p.expire(job_id)
    assert (await p.store.rescue()).unknown == [job_id]
    await stuck_for_every_loop(p, job_id)
    # a requeue that ignored the effect (a direct owner write, not an API) is not a resume
    await p.owner.execute("UPDATE jobs.jobs SET state = 'queued' WHERE job_id = $1", job_id)
    assert await p.claim() == []


async def test_resume_refuses_what_it_must(principals: Principals) -> None:
    p = principals
    stuck = (await succeeded_then(p, "fail_retry", "stuck")).job_id
    assert await refused(p, stuck, who=" ") == "no_principal"
    assert await refused(p, stuck, evidence="") == "no_evidence"
    assert await refused(p, 999) == "missing"
    # an effect still unknown must be resolved first; then the resume is allowed (control)
    ambiguous = await p.submit("ambiguous")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, KEY, INTENT)
    await p.store.begin_effect(lease, "other", INTENT)
    await p.store.finish_effect(lease, KEY, EffectState.SUCCEEDED, receipt="r-2")
    await p.store.finish_effect(lease, "other", EffectState.UNKNOWN)
    assert await p.store.fail(lease, "gave up", retry=True) is JobState.UNKNOWN
    assert await refused(p, ambiguous) == "effects_unresolved"
    await repaired(p, resolve_effect, ambiguous, "other", EffectState.SUCCEEDED)
    assert await p.state(ambiguous) == "unknown"  # the resolution alone never reruns it
    assert (await repaired(p, resume, ambiguous)).state is JobState.QUEUED
    # a leased job, and every state but unknown: a canceled job stays canceled
    assert (await p.claim_one()).job_id == ambiguous
    assert await refused(p, ambiguous) == "running"
    canceled = await p.submit("canceled")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, KEY, INTENT)
    await p.store.finish_effect(lease, KEY, EffectState.SUCCEEDED, receipt="r-3")
    await p.store.cancel(canceled, reason="operator")
    assert await refused(p, canceled) == "not_resumable"
    queued = await p.submit("queued")
    assert await refused(p, queued) == "not_resumable"
    # an open restore detection of the tenant holds it (0060): released by a person after
    # the epoch's advance, never resumed
    await p.owner.execute("SELECT * FROM jobs.authority_hold('acme', 99)")
    assert await p.state(stuck) == "held"
    assert await refused(p, stuck) == "not_resumable"
    trail = await audit(p.repair, job_id=ambiguous)
    assert [a.action for a in trail] == ["resolve_effect", "resume"]
    for job in (stuck, canceled, queued):
        assert [a.action for a in await audit(p.repair, job_id=job)] == []


async def test_only_the_repair_role_resumes(principals: Principals) -> None:
    p = principals
    job_id = (await succeeded_then(p, "lease_lost")).job_id
    async with p.worker.acquire() as conn:
        with pytest.raises(DENIED):
            await conn.fetch(repair_sql.RESUME, job_id, "w", "e")
        with pytest.raises(DENIED):  # nor by plain DML
            await conn.execute(
                "UPDATE jobs.jobs SET state = 'queued', resumed_generation = generation"
                " WHERE job_id = $1",
                job_id,
            )
    assert await p.state(job_id) == "unknown"
    await repaired(p, resume, job_id)  # control
    assert await p.state(job_id) == "queued"


async def test_status_says_what_an_unknown_job_waits_for(principals: Principals) -> None:
    p = principals
    stuck = (await succeeded_then(p, "fail_retry", "stuck")).job_id
    ambiguous = await p.submit("ambiguous")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, KEY, INTENT)
    await p.store.fail(lease, "gave up", retry=True)

    async def reasons() -> dict[tuple[str, str], int]:
        async with p.owner.acquire() as conn:
            report = await collect_status(conn)
        return {(str(w.reason), w.state): w.jobs for w in report.waiting}

    assert await reasons() == {
        ("awaiting_resume", "unknown"): 1,
        ("unresolved_effect", "unknown"): 1,
    }
    await repaired(p, resume, stuck)
    # resumed and due: waiting for a worker, not blocked by its (succeeded) effect
    assert await reasons() == {("no_live_worker", "queued"): 1, ("unresolved_effect", "unknown"): 1}
    assert await p.state(ambiguous) == "unknown"


async def test_accord_repair_resume(principals: Principals) -> None:
    p = principals
    job_id = (await succeeded_then(p, "fail_retry")).job_id
    env = {**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": p.dsn}
    base = [sys.executable, "-m", "accord", "repair", "resume", "--job", str(job_id)]
    done = await anyio.run_process(
        [*base, "--evidence", "provider receipt r-1", "--who", "alice"], env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"resumed job={job_id} state=queued".encode() in done.stdout
    again = await anyio.run_process(
        [*base, "--evidence", "again", "--who", "alice"], env=env, check=False
    )
    assert again.returncode != 0 and b"not_resumable" in again.stderr
    [row] = await audit(p.repair, job_id=job_id)
    assert (row.action, row.who, row.evidence, row.db_role) == (
        "resume", "alice", "provider receipt r-1", "accord_repair",
    )  # fmt: skip
