"""Registration: exactly one queue owner per workflow class, in the database."""

from __future__ import annotations

import pytest

from accord.jobs import (
    EffectState,
    FenceLost,
    JobState,
    WorkflowNotDrained,
    WorkflowNotRegistered,
    WorkflowOwnedElsewhere,
)
from tests.integration.jobs.conftest import OWNER, WORKFLOW, Jobs


async def test_claimants_for_unregistered_or_foreign_classes_refuse(jobs: Jobs) -> None:
    await jobs.submit("a")
    reg = await jobs.store.require_registration(WORKFLOW, OWNER)  # control
    assert reg.owner == OWNER and reg.effects_enabled
    with pytest.raises(WorkflowNotRegistered, match="No queue owner is registered"):
        await jobs.store.require_registration("nobody-serves-this", OWNER)
    with pytest.raises(WorkflowOwnedElsewhere) as info:
        await jobs.store.require_registration(WORKFLOW, "celery")
    assert info.value.fields["registered_owner"] == OWNER
    # the claim itself refuses too, and takes nothing
    with pytest.raises(WorkflowOwnedElsewhere):
        await jobs.store.claim(WORKFLOW, "celery", lease_s=30)
    with pytest.raises(WorkflowNotRegistered):
        await jobs.store.claim("nobody-serves-this", OWNER, lease_s=30)
    assert await jobs.state(await jobs.submit("a")) == "queued"


async def test_effects_are_off_unless_registered_on(jobs: Jobs) -> None:
    reg = await jobs.store.register_workflow("plain", "svc")
    assert not reg.effects_enabled
    again = await jobs.store.register_workflow("plain", "svc")  # idempotent
    assert again == reg


async def test_registering_again_without_the_flag_keeps_effects_as_they_are(jobs: Jobs) -> None:
    """Re-asserting a class's owner must not turn its effects off under running work (its
    jobs would park effects_disabled, each refused attempt spent). Control: an explicit
    flag still sets them."""
    on = await jobs.store.register_workflow("tools", "svc", effects_enabled=True)
    assert (await jobs.store.register_workflow("tools", "svc")).effects_enabled
    off = await jobs.store.register_workflow("tools", "svc", effects_enabled=False)
    assert on.effects_enabled and not off.effects_enabled
    assert not (await jobs.store.register_workflow("tools", "svc")).effects_enabled


async def test_owner_change_needs_a_drained_class(jobs: Jobs) -> None:
    await jobs.store.register_workflow("w2", "old")
    await jobs.store.register_workflow("w2", "new")  # control: nothing open, allowed
    await jobs.store.register_workflow("w2", "old")
    job_id = await jobs.submit("a", workflow="w2")
    with pytest.raises(WorkflowNotDrained) as info:
        await jobs.store.register_workflow("w2", "new")
    assert info.value.fields["open"] == {"queued": 1}
    lease = (await jobs.store.claim("w2", "old", lease_s=30))[0]
    await jobs.store.publish(lease)
    assert await jobs.state(job_id) == "succeeded"
    await jobs.store.register_workflow("w2", "new")  # drained again


@pytest.mark.parametrize("open_state", ["running", "unknown", "held"])
async def test_running_unknown_or_held_work_also_keeps_the_owner(
    jobs: Jobs, open_state: str
) -> None:
    await jobs.store.register_workflow("w4", "old")
    await jobs.store.register_workflow("w4", "new")  # control: nothing open, allowed
    await jobs.store.register_workflow("w4", "old", effects_enabled=True)
    job_id = await jobs.submit("a", workflow="w4")
    lease = (await jobs.store.claim("w4", "old", lease_s=30))[0]  # running
    if open_state == "unknown":
        await jobs.store.begin_effect(lease, "k", "i")
        assert await jobs.store.fail(lease, "ambiguous", retry=False) is JobState.UNKNOWN
    elif open_state == "held":  # what restore detection does to a tenant's work (test-only)
        await jobs.pool.execute(
            "UPDATE jobs.jobs SET state = 'held', lease_expires_at = NULL WHERE job_id = $1",
            job_id,
        )
    assert await jobs.state(job_id) == open_state
    with pytest.raises(WorkflowNotDrained) as info:
        await jobs.store.register_workflow("w4", "new")
    assert info.value.fields["open"] == {open_state: 1}


async def test_transfer_carries_the_work_and_fences_out_the_old_owner(jobs: Jobs) -> None:
    await jobs.store.register_workflow("w3", "old", effects_enabled=True)
    queued = await jobs.submit("q", workflow="w3")
    running = await jobs.submit("r", workflow="w3")
    await jobs.pool.execute(
        "UPDATE jobs.jobs SET run_after = now() + interval '1 hour' WHERE job_id = $1", queued
    )
    old_lease = (await jobs.store.claim("w3", "old", lease_s=300))[0]
    assert old_lease.job_id == running
    with pytest.raises(WorkflowOwnedElsewhere):
        await jobs.store.transfer_workflow("w3", "someone", "new")
    reg = await jobs.store.transfer_workflow("w3", "old", "new")
    assert reg.owner == "new" and reg.effects_enabled
    with pytest.raises(FenceLost) as info:
        await jobs.store.publish(old_lease)
    assert info.value.failed_check == "lease_expired"
    with pytest.raises(WorkflowOwnedElsewhere):
        await jobs.store.claim("w3", "old", lease_s=30)
    assert (await jobs.store.rescue()).requeued == [running]
    new_lease = (await jobs.store.claim("w3", "new", lease_s=30))[0]
    assert new_lease.job_id == running and new_lease.operation_id == "r"
    await jobs.store.publish(new_lease)
    view = await jobs.store.job(queued)
    assert view.state is JobState.QUEUED and view.operation_id == "q"


async def test_transfer_keeps_the_effect_records_of_the_work_it_carries(jobs: Jobs) -> None:
    """Work the old owner left with a pending effect moves to the new owner as it is: the
    record stays, the job becomes unknown at rescue, and the new owner cannot run it again."""
    await jobs.store.register_workflow("w5", "old", effects_enabled=True)
    job_id = await jobs.submit("e", workflow="w5")
    old = (await jobs.store.claim("w5", "old", lease_s=300))[0]
    await jobs.store.begin_effect(old, "charge", "intent")
    await jobs.store.transfer_workflow("w5", "old", "new")
    assert (await jobs.store.rescue()).ids(JobState.UNKNOWN) == [job_id]
    view = await jobs.store.job(job_id)
    assert [(e.effect_key, e.state, e.attempt_id) for e in view.effects] == [
        ("charge", EffectState.PENDING, old.attempt_id)
    ]
    assert await jobs.store.claim("w5", "new", lease_s=30) == []
