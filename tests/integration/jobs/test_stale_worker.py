"""The stale-worker experiment, 1,000 runs for each way ownership moves: the current worker
publishes (control); after ownership moves (expiry + re-claim, cancel, or epoch rotation) the
old worker's publish is refused every time, however plausible its result, while the new
worker's is accepted. After a rotation the old worker tries twice: before the new worker has
claimed the job (refused on the epoch) and after (refused on the generation)."""

from __future__ import annotations

from collections import Counter

import asyncpg
import pytest

from accord.jobs import FenceLost, JobState, Lease, Store
from tests.integration.jobs.conftest import Jobs
from tests.support import scaled

RUNS = scaled(1000, 10_000)  # per mode
MODES = ("expiry", "cancel", "rotation")


def manifest(lease: Lease):  # type: ignore[no-untyped-def]
    async def callback(tx: asyncpg.Connection) -> None:
        await Store.record_result(
            tx,
            lease,
            f"results/{lease.job_id}/{lease.attempt_id}",
            "sha256:same-plausible-content",
        )

    return callback


async def one_run(jobs: Jobs, i: int, mode: str, tally: Counter[str]) -> None:
    tenant = f"tenant-{i}"
    await jobs.submit(f"control-{i}", tenant=tenant)
    current = await jobs.claim_one()
    await jobs.store.publish(current, manifest(current))
    tally["control_accepted"] += 1

    subject = await jobs.submit(f"subject-{i}", tenant=tenant)
    old = await jobs.claim_one()
    assert old.job_id == subject
    new: Lease | None = None
    if mode == "expiry":
        await jobs.expire(subject)
        assert (await jobs.store.rescue()).requeued == [subject]
        new = await jobs.claim_one()
    elif mode == "cancel":
        assert (await jobs.store.cancel(subject, reason="experiment")).changed
    else:
        await jobs.store.rotate_epoch(tenant)
    try:
        await jobs.store.publish(old, manifest(old))
    except FenceLost as lost:
        tally[f"stale_refused:{mode}:{lost.failed_check}"] += 1
    else:
        tally[f"stale_ACCEPTED:{mode}"] += 1
    if mode == "rotation":
        assert (await jobs.store.rescue()).requeued == [subject]
        new = await jobs.claim_one()
        assert new.epoch == old.epoch + 1
        try:  # again, now that the new worker holds the job
            await jobs.store.publish(old, manifest(old))
        except FenceLost as lost:
            tally[f"stale_refused_after_reclaim:{mode}:{lost.failed_check}"] += 1
        else:
            tally[f"stale_ACCEPTED_after_reclaim:{mode}"] += 1
    if new is not None:
        await jobs.store.publish(new, manifest(new))
        tally["new_accepted"] += 1
    key = await jobs.pool.fetchval("SELECT object_key FROM jobs.results WHERE job_id = $1", subject)
    expected = None if new is None else f"results/{subject}/{new.attempt_id}"
    if key != expected:
        tally["wrong_manifest"] += 1


@pytest.mark.timeout(600)
async def test_a_stale_worker_never_publishes(jobs: Jobs) -> None:
    tally: Counter[str] = Counter()
    total = RUNS * len(MODES)
    for i in range(total):
        await one_run(jobs, i, MODES[i % len(MODES)], tally)
    print(f"stale-worker experiment, {RUNS} runs per mode: {dict(sorted(tally.items()))}")
    assert tally["control_accepted"] == total
    assert tally["stale_refused:expiry:generation"] == RUNS
    assert tally["stale_refused:cancel:generation"] == RUNS
    assert tally["stale_refused:rotation:epoch"] == RUNS
    assert tally["stale_refused_after_reclaim:rotation:generation"] == RUNS
    assert tally["new_accepted"] == 2 * RUNS  # expiry and rotation: a new worker holds it
    assert not any("ACCEPTED" in k for k in tally)
    assert tally["wrong_manifest"] == 0
    states = dict(
        await jobs.pool.fetch("SELECT state, count(*) FROM jobs.jobs GROUP BY state")  # type: ignore[arg-type]
    )
    assert states == {
        JobState.SUCCEEDED.value: total + 2 * RUNS,
        JobState.CANCELED.value: RUNS,
    }
