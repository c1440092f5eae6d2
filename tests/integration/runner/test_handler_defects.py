"""A handler's own defects around an effect fail its job at once, with nothing sent, instead
of being retried up to poison: a retry runs the same code and meets the same defect.

* An idempotency key other than ``ctx.idempotency_key(key)``: ``accord reconcile`` asks the
  provider's lookup by that derived key, so an effect whose reply is lost would be resolved
  by another key's answer ("never seen") and sent again under the handler's own key.
* An intent with no canonical form (NaN), which has no digest.
* An intent changed since the key was begun (``EffectConflict``).

Each beside its control: the derived key, a plain intent, the same intent again."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from accord.demo import DEFAULT_OWNER
from accord.jobs import (
    EffectConflict,
    EffectIntentInvalid,
    EffectState,
    IdempotencyKeyMismatch,
    JobState,
)
from accord.jobs.repair import resolve_effect
from accord.jobs.runner import (
    EffectUnknown,
    Ending,
    FailedBeforeDispatch,
    Handler,
    JobContext,
    Success,
    Worker,
)
from tests.integration.runner.conftest import Rig, running, wait_for

pytestmark = pytest.mark.timeout(60)

#: What the handler passes to ctx.effect, from its context and its attempt number.
Effect = Callable[[JobContext, int], tuple[dict[str, Any], str | None]]


async def _run(
    rig: Rig, workflow: str, effect: Effect, *, fail_first: bool = False
) -> tuple[int, list[str | None]]:
    """One job whose handler begins an effect with what ``effect`` gives (from the context
    and the number of calls made before, plus one) and publishes; the provider refuses the
    first call before dispatch when ``fail_first``. Returns the job id once the job has
    ended, and the keys of the calls made."""
    calls: list[str | None] = []

    async def handler(ctx: JobContext) -> None:
        intent, key = effect(ctx, len(calls) + 1)

        async def send() -> Success:
            calls.append(key)
            if fail_first and len(calls) == 1:
                raise FailedBeforeDispatch(reason="provider refused the connection")
            return Success(receipt="r")

        await ctx.effect("mail.send", intent, send, idempotency_key=key)
        await ctx.publish()

    await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=True)
    job = await rig.submit_job(f"{workflow}-1", workflow)
    worker = rig.worker({workflow: (handler, 10.0)}, journal=workflow)
    async with running(worker):

        async def ended() -> bool:
            return await rig.state(job) not in ("queued", "running")

        await wait_for(ended)
    return job, calls


async def test_the_derived_idempotency_key_runs_another_is_refused_before_anything_is_sent(
    rig: Rig,
) -> None:
    job, calls = await _run(
        rig, "derived", lambda ctx, _: ({"to": "a"}, ctx.idempotency_key("mail.send"))
    )
    assert await rig.state(job) == JobState.SUCCEEDED  # control: the key reconcile asks about
    assert len(calls) == 1

    job, calls = await _run(
        rig, "custom", lambda ctx, _: ({"to": "a"}, f"my-key-{ctx.lease.job_id}")
    )
    row = await rig.job(job)
    assert calls == []
    assert await rig.effects(job) == []  # nothing begun: nothing for reconcile to misread
    assert (row["state"], row["attempts"]) == (JobState.FAILED, 1)
    assert row["last_error"] == IdempotencyKeyMismatch.reason


async def test_an_intent_with_no_canonical_form_fails_the_job_at_once(rig: Rig) -> None:
    job, calls = await _run(rig, "plain", lambda ctx, _: ({"amount": 1.5}, None))
    assert await rig.state(job) == JobState.SUCCEEDED  # control: a plain intent
    job, calls = await _run(rig, "nan", lambda ctx, _: ({"amount": float("nan")}, None))
    row = await rig.job(job)
    assert (row["state"], row["attempts"], row["last_error"]) == (
        JobState.FAILED,
        1,
        EffectIntentInvalid.reason,
    )
    assert calls == [] and await rig.effects(job) == []


async def test_an_intent_changed_since_its_key_was_begun_fails_the_job_at_once(rig: Rig) -> None:
    """The first call fails before dispatch, so the key may begin again: with the same intent
    it does and succeeds (control); with another, the second attempt's begin conflicts and
    the job fails then, not after every attempt it has left."""
    job, calls = await _run(rig, "same", lambda ctx, n: ({"to": "a"}, None), fail_first=True)
    assert await rig.state(job) == JobState.SUCCEEDED
    assert len(calls) == 2
    assert [s for _, _, s, _ in await rig.effects(job)] == ["failed_before_dispatch", "succeeded"]

    job, calls = await _run(rig, "changed", lambda ctx, n: ({"to": f"a{n}"}, None), fail_first=True)
    row = await rig.job(job)
    assert (row["state"], row["attempts"], row["last_error"]) == (
        JobState.FAILED,
        2,
        EffectConflict.reason,
    )
    assert len(calls) == 1
    assert [s for _, _, s, _ in await rig.effects(job)] == ["failed_before_dispatch"]


async def test_a_defect_after_an_unknown_effect_is_kept_until_the_effect_is_resolved(
    rig: Rig,
) -> None:
    """Migration 0055, through the shipped worker: a handler whose first call's outcome is
    unknown, which then meets a defect of its own (another effect under a key of its own
    making), leaves the job ``unknown`` with its verdict kept; once the unknown effect is
    resolved "never sent", the job is ``failed`` and no worker runs it again. Before, the
    resolution queued it, and the worker ran it and sent the first call again. Control: the
    same handler without the defect (it lets the EffectUnknown go) is run again."""
    calls: list[str] = []

    def handler_for(defect: bool) -> Handler:
        async def handler(ctx: JobContext) -> None:
            async def lost_reply() -> Success:
                calls.append(ctx.lease.workflow)
                raise TimeoutError("the reply never came")  # sent: outcome unknown

            try:
                await ctx.effect("mail.send", {"to": "a"}, lost_reply)
            except EffectUnknown:
                if not defect:
                    raise
                await ctx.effect("mail.copy", {"to": "b"}, lost_reply, idempotency_key="mine")

        return handler

    ended: dict[bool, int] = {}
    for defect in (False, True):
        workflow = f"defect-{defect}".lower()
        await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=True)
        ended[defect] = await rig.submit_job(f"{workflow}-1", workflow)
        worker = rig.worker({workflow: (handler_for(defect), 10.0)}, journal=workflow)
        async with running(worker):

            async def given_up(job: int = ended[defect]) -> bool:
                return await rig.state(job) == "unknown"

            await wait_for(given_up)
            async with rig.pool.acquire() as conn, conn.transaction():
                done = await resolve_effect(
                    conn, ended[defect], "mail.send", EffectState.FAILED_BEFORE_DISPATCH,
                    who="test", evidence="the provider never saw it",
                )  # fmt: skip
            if defect:
                assert done.job_state is JobState.FAILED
                await anyio.sleep(0.5)  # the worker polls every 0.05 s: time to claim it
            else:
                assert done.job_state is JobState.QUEUED  # control: it runs again

                async def ran_again(job: int = ended[defect]) -> bool:
                    return (await rig.job(job))["attempts"] == 2

                await wait_for(ran_again)
    assert calls.count("defect-false") == 2  # control: the first call sent again
    assert calls.count("defect-true") == 1  # never again
    row = await rig.job(ended[True])
    assert (row["state"], row["attempts"]) == (JobState.FAILED, 1)
    assert row["last_error"] == IdempotencyKeyMismatch.reason


async def _never_sent() -> Success:
    raise AssertionError("a defect is met before anything is sent")


async def test_a_stop_landing_after_a_defect_keeps_the_defect_s_verdict(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler meets a defect of its own (a key of its own making), and a stop (now)
    lands while its attempt's heartbeat is still winding down (a renew in flight, held
    here until the stop). Before, the stop's ending (worker_stopped, with a retry) replaced
    the defect's verdict and the job was queued to meet it again; now it is failed. A
    handler that returned, after an effect that succeeded, is completed the same way (before,
    given back: the succeeded effect forbids a rerun, so the job waited, unknown, for a
    person), and one that published is reported published. Control: a stop while a handler
    still runs gives its job back, as it does when the handler returns because the stop
    cancelled it (a return the stop forced, not work done)."""
    events: dict[str, anyio.Event] = {}
    heartbeat = Worker._heartbeat

    async def slow_to_end(self: Worker, *args: Any) -> None:
        try:
            await heartbeat(self, *args)
        finally:
            events["winding"].set()
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await events["stopped"].wait()  # the stop lands while this attempt winds down

    monkeypatch.setattr(Worker, "_heartbeat", slow_to_end)

    async def defect(ctx: JobContext) -> None:
        await ctx.effect("mail.send", {"to": "a"}, _never_sent, idempotency_key="mine")

    async def sent() -> Success:
        return Success("receipt")

    async def returns(ctx: JobContext) -> None:
        await ctx.effect("mail.send", {"to": "a"}, sent)

    async def long(ctx: JobContext) -> None:
        events["running"].set()
        await anyio.sleep(60)

    async def swallows(ctx: JobContext) -> None:
        """Returns when the stop cancels it: a return the stop forced, not work done."""
        events["running"].set()
        with contextlib.suppress(anyio.get_cancelled_exc_class()):
            await anyio.sleep(60)

    async def publishes(ctx: JobContext) -> None:
        await ctx.publish()

    for workflow, handler, started in (
        ("defect", defect, "winding"),
        ("returns", returns, "winding"),
        ("publishes", publishes, "winding"),
        ("long", long, "running"),
        ("swallows", swallows, "running"),
    ):
        events.update(winding=anyio.Event(), stopped=anyio.Event(), running=anyio.Event())
        await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=True)
        job = await rig.submit_job(f"{workflow}-1", workflow)
        worker = rig.worker({workflow: (handler, 30.0)}, journal=workflow)
        async with running(worker):
            with anyio.fail_after(20):
                await events[started].wait()
            worker.stop(now=True)
            events["stopped"].set()

            async def ended(job: int = job) -> bool:
                return await rig.state(job) != "running"

            await wait_for(ended)
        row = await rig.job(job)
        if workflow == "defect":
            assert (row["state"], row["last_error"]) == ("failed", "idempotency_key_mismatch")
        elif workflow in ("returns", "publishes"):
            assert (row["state"], row["last_error"]) == ("succeeded", None)
            # published before the stop: reported so, not as a fence the give-up met
            assert worker.stats.endings[str(Ending.PUBLISHED)] == 1, worker.stats.endings
        else:
            assert (row["state"], row["last_error"]) == ("queued", "worker_stopped")


async def test_a_defect_raised_inside_the_handler_s_own_task_group_fails_the_job(
    rig: Rig,
) -> None:
    """A handler running its effects in a task group of its own: a defect reaches the worker
    inside an exception group. Before, the group read as a transient failure and the job was
    retried to poison, meeting the defect at each attempt; now it fails at once. Control: a
    transient error in the same group is retried."""

    def grouped(defect: bool) -> Handler:
        async def handler(ctx: JobContext) -> None:
            async def one() -> None:
                if defect:
                    key = "mine"
                    await ctx.effect("mail.send", {"to": "a"}, _never_sent, idempotency_key=key)
                raise ConnectionError("the provider went away")

            async with anyio.create_task_group() as tg:
                tg.start_soon(one)

        return handler

    for defect in (True, False):
        workflow = f"grouped-{defect}".lower()
        await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=True)
        job = await rig.submit_job(f"{workflow}-1", workflow)
        worker = rig.worker({workflow: (grouped(defect), 10.0)}, journal=workflow)
        async with running(worker):

            async def tried(job: int = job) -> bool:
                row = await rig.job(job)
                return row["state"] == "failed" or row["attempts"] >= 2

            await wait_for(tried)
        row = await rig.job(job)
        if defect:
            assert (row["state"], row["attempts"]) == ("failed", 1)
            assert row["last_error"] == "idempotency_key_mismatch"
        else:
            assert row["state"] != "failed" and row["attempts"] >= 2  # control: retried


async def test_effects_disabled_inside_the_handler_s_own_task_group_parks_the_job(
    rig: Rig,
) -> None:
    """A handler beginning two effects at once in a task group of its own, its class
    registered with effects disabled: both are refused at begin_effect and the worker gets
    an exception group. Before, it read as a transient failure ("handler:ExceptionGroup"),
    retried with backoff to poison; now the job is parked as a lone refusal parks it, until
    effects are enabled (control: the same handler enabled publishes)."""

    async def sent() -> Success:
        return Success("receipt")

    async def handler(ctx: JobContext) -> None:
        async def one(key: str) -> None:
            await ctx.effect(key, {"to": key}, sent)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "mail.a")
            tg.start_soon(one, "mail.b")

    for enabled in (False, True):
        workflow = f"grouped-effects-{'on' if enabled else 'off'}"
        await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=enabled)
        job = await rig.submit_job(f"{workflow}-1", workflow)
        worker = rig.worker({workflow: (handler, 10.0)}, journal=workflow)
        async with running(worker):

            async def ended(job: int = job) -> bool:
                row = await rig.job(job)
                return row["state"] == "succeeded" or row["last_error"] is not None

            await wait_for(ended)
        row = await rig.job(job)
        if enabled:  # control: both effects sent, the job done
            assert (row["state"], row["last_error"]) == ("succeeded", None)
            continue
        assert (row["state"], row["last_error"]) == ("queued", "effects_disabled")
        assert await rig.pool.fetchval(
            "SELECT run_after = 'infinity' FROM jobs.jobs WHERE job_id = $1", job
        )


async def test_a_publish_whose_first_answer_was_lost_is_counted_published(rig: Rig) -> None:
    """A publish that committed while its answer was lost (here: the job published through
    the store itself, then the context's publish refused on the job's state) is this
    attempt's own: the attempt is counted published, not a lost fence (the database was
    right either way). Control: a job cancelled under its handler is a lost fence."""

    async def published_elsewhere(ctx: JobContext) -> None:
        await rig.store.publish(ctx.lease)  # the commit whose answer the context never saw
        await ctx.publish()

    async def cancelled(ctx: JobContext) -> None:
        await rig.store.cancel(ctx.lease.job_id, reason="a person")
        await ctx.publish()

    for workflow, handler, state, ending in (
        ("answer-lost", published_elsewhere, "succeeded", Ending.PUBLISHED),
        ("cancelled", cancelled, "canceled", Ending.FENCE_LOST),
    ):
        await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=True)
        job = await rig.submit_job(f"{workflow}-1", workflow)
        worker = rig.worker({workflow: (handler, 10.0)}, journal=workflow)
        async with running(worker):

            async def ended(job: int = job, worker: Worker = worker) -> bool:
                return await rig.state(job) != "running" and sum(worker.stats.endings.values()) > 0

            await wait_for(ended)
        assert await rig.state(job) == state
        assert dict(worker.stats.endings) == {str(ending): 1}, worker.stats.endings
