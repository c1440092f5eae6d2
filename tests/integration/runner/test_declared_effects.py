"""A job class's declared effect keys hold at run time: a handler may begin only a key its
class declared (``app.job(effects=...)``, ``Worker.register(effects=...)``), because only the
provider that owns a key can ever resolve that effect when its reply is lost. An undeclared
key is refused before anything is recorded or sent, and the job fails at once: retrying a
handler's own defect cannot help."""

from __future__ import annotations

from typing import Any

import pytest

from accord.demo import DEFAULT_OWNER
from accord.jobs import EffectUndeclared, JobState
from accord.jobs.runner import JobContext, Registered, Success
from accord.jobs.runner.context import declares
from tests.integration.runner.conftest import Rig, running, wait_for

pytestmark = pytest.mark.timeout(60)
DECLARED = ("mail.send", "archive.")


def test_a_key_is_declared_exactly_or_under_a_prefix_ending_in_a_dot() -> None:
    assert declares(DECLARED, "mail.send") and declares(DECLARED, "archive.store")
    assert not declares(DECLARED, "mail.sender") and not declares(DECLARED, "archive")
    assert not declares((), "mail.send")


async def _serve(
    rig: Rig, workflow: str, keys: tuple[str, ...], calls: list[str], *, via_all: bool = False
) -> int:
    """One job of ``workflow`` whose handler begins ``keys`` in turn, then publishes; the
    worker declares DECLARED for the class, by ``register`` or (``via_all``) by
    ``register_all``, as ``accord worker`` registers an application's job classes. Returns
    the job id once the job has ended."""

    async def handler(ctx: JobContext) -> None:
        for key in keys:

            async def call(key: str = key) -> Success:
                calls.append(key)
                return Success(receipt=f"r-{key}")

            await ctx.effect(key, {"n": 1}, call)
        await ctx.publish()

    await rig.store.register_workflow(workflow, DEFAULT_OWNER, effects_enabled=True)
    job = await rig.submit_job(f"{workflow}-1", workflow)
    worker = rig.worker({}, journal=workflow)
    if via_all:
        worker.register_all([Registered(workflow, handler, 10.0, DECLARED)])
    else:
        worker.register(workflow, handler, timeout_s=10.0, effects=DECLARED)
    async with running(worker):

        async def ended() -> bool:
            return await rig.state(job) not in ("queued", "running")

        await wait_for(ended)
    return job


async def test_declared_keys_run_and_publish(rig: Rig) -> None:
    calls: list[str] = []
    job = await _serve(rig, "declared", ("mail.send", "archive.store"), calls)
    assert await rig.state(job) == JobState.SUCCEEDED  # control: declared keys run
    assert calls == ["mail.send", "archive.store"]
    assert [(k, s) for k, _, s, _ in await rig.effects(job)] == [
        ("archive.store", "succeeded"),
        ("mail.send", "succeeded"),
    ]


@pytest.mark.parametrize("via_all", [False, True], ids=["register", "register_all"])
async def test_an_undeclared_key_is_refused_before_anything_is_recorded_and_fails_the_job(
    rig: Rig, via_all: bool
) -> None:
    """Both ways a worker learns a class's keys; ``register_all`` (``accord worker``'s) once
    dropped them, and every key ran."""
    calls: list[str] = []
    job = await _serve(rig, "undeclared", ("mail.send", "sms.send"), calls, via_all=via_all)
    row = await rig.job(job)
    # The declared key ran; the undeclared one was neither recorded nor sent, and the job
    # failed on its first attempt instead of being retried up to poison.
    assert calls == ["mail.send"]
    assert [(k, s) for k, _, s, _ in await rig.effects(job)] == [("mail.send", "succeeded")]
    assert row["state"] == JobState.FAILED and row["attempts"] == 1
    assert row["last_error"] == EffectUndeclared.reason


def test_the_refusal_names_the_class_the_key_and_what_was_declared() -> None:
    error: Any = EffectUndeclared(workflow="w", effect_key="sms.send", declared=list(DECLARED))
    assert error.reason == "effect_undeclared"
    assert error.fields["effect_key"] == "sms.send"
    assert error.fields["declared"] == ["mail.send", "archive."]
