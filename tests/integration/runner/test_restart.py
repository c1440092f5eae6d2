"""A worker's start: its journal opened honestly (torn tail repaired, corrupt refused) and the
effects an earlier run began whose outcome the database never recorded, reported."""

from __future__ import annotations

import os

import anyio
import pytest

from accord.demo import DEFAULT_OWNER
from accord.jobs import EffectState, JobState
from accord.jobs.runner import (
    EffectRef,
    JobContext,
    JournalCorrupt,
    Success,
    Tail,
    open_journal,
    scan_journal,
)
from tests.integration.runner.conftest import Rig, running, wait_for

pytestmark = pytest.mark.timeout(60)


async def test_restart_reports_an_effect_whose_outcome_the_database_never_recorded(
    rig: Rig,
) -> None:
    await rig.store.register_workflow("pay", DEFAULT_OWNER, effects_enabled=True)
    recorded = await rig.submit_job("op-recorded", "pay")
    lost = await rig.submit_job("op-lost", "pay")
    release = anyio.Event()

    async def pay(ctx: JobContext) -> None:
        async def send() -> Success:
            if ctx.lease.job_id == lost:
                await release.wait()  # the lease is taken from us while the call is out
            return Success(f"rcpt-{ctx.lease.job_id}")

        await ctx.effect("pay", {"amount": 5}, send, idempotency_key=f"idem-{ctx.lease.job_id}")

    worker = rig.worker({"pay": (pay, 30.0)}, lease_s=30.0, concurrency=2)
    async with running(worker):

        async def both_begun() -> bool:
            n = await rig.pool.fetchval("SELECT count(*) FROM jobs.effects")
            return bool(n == 2) and await rig.state(recorded) == JobState.SUCCEEDED

        await wait_for(both_begun)
        # the job is cancelled while its call is out: the outcome can no longer be recorded
        await rig.store.cancel(lost, reason="operator")
        release.set()

        async def gave_up() -> bool:
            return worker.stats.endings["fence_lost"] == 1

        await wait_for(gave_up)
    worker.journal.close()
    # the database holds the begin only; the journal holds what the call returned
    assert [(e.state, e.receipt) for e in (await rig.store.job(lost)).effects] == [
        (EffectState.PENDING, None)
    ]
    restarted = rig.worker({"pay": (pay, 30.0)}, journal="w1")
    async with running(restarted):
        pass
    [entry] = restarted.unrecorded
    assert entry.ref == EffectRef(lost, "pay", 1)  # and not the recorded one (control)
    assert entry.begin.idempotency_key == f"idem-{lost}"
    assert entry.journal_outcome is not None
    assert (entry.journal_outcome.outcome, entry.journal_outcome.receipt) == (
        EffectState.SUCCEEDED,
        f"rcpt-{lost}",
    )


async def test_open_journal_repairs_a_torn_tail_and_refuses_a_corrupt_one(rig: Rig) -> None:
    path = rig.journal_path("torn")
    with open_journal(path, "torn") as journal:
        journal.append({"type": "claim", "n": 1})
        journal.append({"type": "claim", "n": 2})
    whole = path.read_bytes()
    # control: a torn last frame (a crash mid-append) is quarantined and cut
    path.write_bytes(whole[:-3])
    with open_journal(path, "torn") as journal:
        assert journal.scan.tail is Tail.CLEAN
        assert [r["n"] for r in journal.scan.records] == [1]
    quarantined = [p for p in os.listdir(path.parent) if ".quarantine-" in p]
    assert len(quarantined) == 1
    # forbidden: a damaged frame followed by a valid one is corruption, never truncated
    damaged = bytearray(whole)
    first_payload = whole.index(b"{")  # the first frame's payload (after length and CRC)
    damaged[first_payload + 1] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(JournalCorrupt):
        open_journal(path, "torn")
    assert path.read_bytes() == bytes(damaged)
    assert scan_journal(path).tail is Tail.CORRUPT
