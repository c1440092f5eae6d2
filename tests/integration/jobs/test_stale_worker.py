"""The stale-worker experiment, 1,000 runs for each way ownership moves: the current worker
publishes (control); after ownership moves (expiry + re-claim, cancel, or epoch rotation) the
old worker's publish is refused every time, however plausible its result, while the new
worker's is accepted. After a rotation the old worker tries twice: before the new worker has
claimed the job (refused on the epoch) and after (refused on the generation). Each run
writes its result manifest one of three ways (FORMS): a stale publish writes none of them."""

from __future__ import annotations

from collections import Counter

import asyncpg
import pytest

from accord.jobs import FenceLost, JobState, Lease, Store
from tests.integration.jobs.conftest import Jobs
from tests.support import scaled

RUNS = scaled(1000, 10_000)  # per mode
MODES = ("expiry", "cancel", "rotation")


#: How a run's publish writes its manifest row: through ``Store.record_result`` in the
#: callback (its own fence), or as the fenced succeeded statement's ``result`` (with a
#: callback, or without one: then the publish is that one statement).
FORMS = ("record_result", "result", "result_only")


def key_of(lease: Lease) -> str:
    return f"results/{lease.job_id}/{lease.attempt_id}"


async def publish(jobs: Jobs, lease: Lease, form: str) -> None:
    digest = "sha256:same-plausible-content"

    async def record(tx: asyncpg.Connection) -> None:
        await Store.record_result(tx, lease, key_of(lease), digest)

    async def nothing(tx: asyncpg.Connection) -> None:
        await tx.execute("SELECT 1")

    if form == "record_result":
        await jobs.store.publish(lease, record)
    elif form == "result":
        await jobs.store.publish(lease, nothing, result=(key_of(lease), digest))
    else:
        await jobs.store.publish(lease, result=(key_of(lease), digest))


async def one_run(jobs: Jobs, i: int, mode: str, tally: Counter[str]) -> None:
    tenant = f"tenant-{i}"
    form = FORMS[(i // len(MODES)) % len(FORMS)]
    await jobs.submit(f"control-{i}", tenant=tenant)
    current = await jobs.claim_one()
    await publish(jobs, current, form)
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
        await publish(jobs, old, form)
    except FenceLost as lost:
        tally[f"stale_refused:{mode}:{lost.failed_check}"] += 1
        tally[f"stale_refused_by_form:{mode}:{form}"] += 1
    else:
        tally[f"stale_ACCEPTED:{mode}"] += 1
    if mode == "rotation":
        assert (await jobs.store.rescue()).requeued == [subject]
        new = await jobs.claim_one()
        assert new.epoch == old.epoch + 1
        try:  # again, now that the new worker holds the job
            await publish(jobs, old, form)
        except FenceLost as lost:
            tally[f"stale_refused_after_reclaim:{mode}:{lost.failed_check}"] += 1
        else:
            tally[f"stale_ACCEPTED_after_reclaim:{mode}"] += 1
    if new is not None:
        await publish(jobs, new, form)
        tally["new_accepted"] += 1
    key = await jobs.pool.fetchval("SELECT object_key FROM jobs.results WHERE job_id = $1", subject)
    expected = None if new is None else key_of(new)
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
    for mode in MODES:  # every form refused in every mode (the control accepted each)
        assert all(tally[f"stale_refused_by_form:{mode}:{form}"] > 0 for form in FORMS), mode
    manifests = await jobs.pool.fetchval("SELECT count(*) FROM jobs.results")
    assert manifests == total + 2 * RUNS  # one per succeeded job, none from a stale publish
    states = dict(
        await jobs.pool.fetch("SELECT state, count(*) FROM jobs.jobs GROUP BY state")  # type: ignore[arg-type]
    )
    assert states == {
        JobState.SUCCEEDED.value: total + 2 * RUNS,
        JobState.CANCELED.value: RUNS,
    }
