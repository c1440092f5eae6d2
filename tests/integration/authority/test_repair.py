"""The checked repairs refuse what they must (each after its control), and `accord repair`."""

from __future__ import annotations

import os
import sys

import anyio
import pytest

from accord.jobs import EffectState, JobState, RepairRefused
from accord.jobs.repair import release_hold, requeue_poison, resolve_effect
from tests.integration.authority.conftest import Principals


async def refused(p: Principals, repair: object, *args: object, **kwargs: object) -> str:
    async with p.repair.acquire() as conn:
        with pytest.raises(RepairRefused) as info:
            async with conn.transaction():
                await repair(conn, *args, **kwargs)  # type: ignore[operator]
    return str(info.value.reason)


async def test_requeue_poison_gives_a_fresh_budget(principals: Principals) -> None:
    p = principals
    job_id = await p.submit("a", max_attempts=1)
    lease = await p.claim_one()
    assert await p.store.fail(lease, "boom", retry=True) is JobState.POISON
    assert await p.claim() == []
    assert await refused(p, release_hold, job_id, who="a", evidence="e") == "not_held"
    assert await refused(p, requeue_poison, job_id, who="a", evidence=" ") == "no_evidence"
    assert await refused(p, requeue_poison, job_id, who="", evidence="e") == "no_principal"
    async with p.repair.acquire() as conn, conn.transaction():  # control
        done = await requeue_poison(conn, job_id, who="alice", evidence="fixed upstream")
    assert done.state is JobState.QUEUED
    again = await p.claim_one()
    assert again.job_id == job_id and again.generation > lease.generation
    await p.store.publish(again)
    assert await refused(p, requeue_poison, job_id, who="a", evidence="e") == "not_poison"


async def test_resolve_refuses_what_is_not_unresolved(principals: Principals) -> None:
    p = principals
    job_id = await p.submit("a")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, "k", "i")
    await p.store.finish_effect(lease, "k", EffectState.SUCCEEDED)
    await p.store.fail(lease, "later step failed", retry=False)
    ok = EffectState.SUCCEEDED
    assert await refused(p, resolve_effect, job_id, "k", ok, who="a", evidence="e") == (
        "not_unresolved"
    )
    assert await refused(p, resolve_effect, job_id, "nope", ok, who="a", evidence="e") == (
        "missing_effect"
    )
    assert await refused(p, resolve_effect, 999, "k", ok, who="a", evidence="e") == "missing"
    unknown = EffectState.UNKNOWN
    assert await refused(p, resolve_effect, job_id, "k", unknown, who="a", evidence="e") == (
        "invalid_outcome"
    )


async def test_a_pending_effect_of_a_job_no_longer_running_can_be_resolved(
    principals: Principals,
) -> None:
    p = principals
    job_id = await p.submit("a")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, "k", "i")  # the worker dies: pending stays the evidence
    await p.expire(job_id)
    await p.store.rescue()
    assert await p.state(job_id) == "unknown"
    async with p.repair.acquire() as conn, conn.transaction():
        done = await resolve_effect(
            conn, job_id, "k", EffectState.FAILED_BEFORE_DISPATCH, who="a", evidence="journal"
        )
    assert (done.seq, done.job_state) == (1, JobState.QUEUED)
    # the resolution also cleared the job row's count of unresolved effects (0010), which the
    # publish checks: the next attempt publishes
    again = await p.claim_one()
    await p.store.publish(again)
    assert await p.state(job_id) == "succeeded"


async def test_a_resolution_is_refused_once_the_key_began_again(principals: Principals) -> None:
    """Migration 0050. Evidence about seq 1 (reconcile's provider answer, read a while ago)
    resolved whatever record was latest: the key begun again meanwhile (seq 2, a request in
    flight), seq 2 was resolved failed_before_dispatch, and could be sent again. With the
    seq it is about, the resolution is refused (seq_moved; control: seq 2's own resolves)."""
    p = principals
    job_id = await p.submit("a")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, "k", "i")
    await p.store.finish_effect(lease, "k", EffectState.FAILED_BEFORE_DISPATCH)
    assert await p.store.begin_effect(lease, "k", "i") == 2  # begun again: its reply lost
    await p.store.finish_effect(lease, "k", EffectState.UNKNOWN)
    await p.store.fail(lease, "effect_unknown", retry=False)
    fbd = EffectState.FAILED_BEFORE_DISPATCH
    assert await refused(p, resolve_effect, job_id, "k", fbd, who="a", evidence="e", seq=1) == (
        "seq_moved"
    )
    assert [e.state for e in (await p.store.job(job_id)).effects] == [fbd, EffectState.UNKNOWN]
    async with p.repair.acquire() as conn, conn.transaction():  # control (the effects guard:
        done = await resolve_effect(conn, job_id, "k", fbd, who="a", evidence="e", seq=2)
    assert done.seq == 2  # an unknown record resolved through the seven-argument form)
    owners = "SELECT count(DISTINCT proowner) FROM pg_proc WHERE proname = 'repair_resolve_effect'"
    assert await p.owner.fetchval(owners) == 1


async def test_the_repair_cli_uses_the_repair_role(principals: Principals) -> None:
    p = principals
    job_id = await p.submit("a")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, "k", "i")
    await p.store.finish_effect(lease, "k", EffectState.UNKNOWN)
    await p.store.fail(lease, "ambiguous", retry=False)
    env = {**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": p.dsn}
    base = [sys.executable, "-m", "accord", "repair"]
    args = ["resolve-effect", "--job", str(job_id), "--key", "k", "--outcome", "succeeded"]
    done = await anyio.run_process(
        [*base, *args, "--evidence", "receipt r-1", "--who", "alice", "--receipt", "r-1"],
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"outcome=succeeded" in done.stdout
    audit = await anyio.run_process([*base, "audit", "--job", str(job_id)], env=env, check=False)
    assert b"resolve_effect" in audit.stdout and b"db_role=accord_repair" in audit.stdout
    # a role the login may not take is a configuration error, not a silent fallback
    bad = await anyio.run_process(
        [*base, "audit", "--job", str(job_id)],
        env={**env, "ACCORD_REPAIR_ROLE": "no_such_role_x"},
        check=False,
    )
    assert (
        bad.returncode == 2
        and b"DatabaseLoginRefused" in bad.stderr
        and b"no_such_role_x" in bad.stderr
    )


async def test_a_job_given_up_for_good_fails_once_its_last_effect_is_resolved(
    principals: Principals,
) -> None:
    """Migration 0055: a job given up without a retry keeps that verdict across resolutions.
    With two effects unresolved, the first resolution leaves it unknown (the other is still
    the evidence), the second fails it: never queued. Control: given up with a retry, the
    same resolutions queue it again."""
    p = principals
    jobs: dict[bool, int] = {}
    for retry in (True, False):
        jobs[retry] = await p.submit(f"two-{retry}")
        lease = await p.claim_one()
        for key in ("a", "b"):
            await p.store.begin_effect(lease, key, "i")
            await p.store.finish_effect(lease, key, EffectState.UNKNOWN)
        assert await p.store.fail(lease, "handler", retry=retry) is JobState.UNKNOWN
    fbd = EffectState.FAILED_BEFORE_DISPATCH
    states: dict[bool, list[JobState]] = {True: [], False: []}
    async with p.repair.acquire() as conn:
        for retry, job_id in jobs.items():
            for key in ("a", "b"):
                async with conn.transaction():
                    done = await resolve_effect(conn, job_id, key, fbd, who="a", evidence="e")
                states[retry].append(done.job_state)
    assert states == {
        True: [JobState.UNKNOWN, JobState.QUEUED],  # control: it may run again
        False: [JobState.UNKNOWN, JobState.FAILED],
    }
    [again] = await p.claim(limit=2)
    assert again.job_id == jobs[True]
    assert await p.state(jobs[False]) == "failed"
