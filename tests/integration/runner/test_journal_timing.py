"""Which journal records a job waits for (jobs.runner.context): the effect's begin always,
before the call is dispatched; its outcome only when the database did not record it (the
journal is then the only evidence of what the call returned); a claim, a recorded outcome and
a publish are noted (RunnerJournal.note), since the database already holds them. Each case
with its control, against real PostgreSQL."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from accord.demo import DEFAULT_OWNER
from accord.jobs import EffectState
from accord.jobs.runner import JobContext, Success
from accord.schemas import telemetry
from tests.integration.runner.conftest import Rig

pytestmark = pytest.mark.timeout(60)

WORKFLOW = "timed"


class Journal:
    """What the context wrote and how: ``written`` (durable before the call returned) or
    ``noted`` (queued, nothing waited)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def write(self, record: Any) -> None:
        self.calls.append(("written", str(record.type), getattr(record, "outcome", None)))

    def note(self, record: Any) -> None:
        self.calls.append(("noted", str(record.type), getattr(record, "outcome", None)))


async def _context(rig: Rig, operation_id: str, journal: Journal) -> JobContext:
    await rig.submit_job(operation_id, WORKFLOW)
    [lease] = await rig.store.claim(WORKFLOW, DEFAULT_OWNER, lease_s=30)
    return JobContext(
        lease, store=rig.store, objects=rig.objects, journal=journal.write, note=journal.note
    )


@pytest.fixture
async def timed(rig: Rig) -> Rig:
    await rig.store.register_workflow(WORKFLOW, DEFAULT_OWNER, effects_enabled=True)
    return rig


async def test_a_recorded_outcome_is_noted_and_the_begin_is_written_before_dispatch(
    timed: Rig,
) -> None:
    journal = Journal()
    ctx = await _context(timed, "recorded", journal)

    async def call() -> Success:
        # dispatched only once the begin was written (durable), never on a noted one
        assert journal.calls == [("written", "effect_begin", None)]
        return Success("receipt-1")

    assert (await ctx.effect("mail.send", {"to": "a"}, call)).receipt == "receipt-1"
    await ctx.publish()
    assert journal.calls == [
        ("written", "effect_begin", None),
        ("noted", "effect_outcome", EffectState.SUCCEEDED),  # the database holds it
        ("noted", "publish", None),
    ]
    assert [(e.effect_key, e.state) for e in (await timed.store.job(ctx.lease.job_id)).effects] == [
        ("mail.send", EffectState.SUCCEEDED)
    ]


async def test_an_outcome_the_database_refused_is_written_before_the_effect_returns(
    timed: Rig,
) -> None:
    journal = Journal()
    ctx = await _context(timed, "refused", journal)

    async def call() -> Success:
        # The lease is lost while the call runs: finish_effect's fence refuses the outcome.
        await timed.store.cancel(ctx.lease.job_id, reason="operator")
        return Success("receipt-2")

    await ctx.effect("mail.send", {"to": "b"}, call)
    assert journal.calls == [
        ("written", "effect_begin", None),
        # the pending row is the database's only trace: the receipt is on disk, waited for
        ("written", "effect_outcome", EffectState.SUCCEEDED),
    ]
    view = await timed.store.job(ctx.lease.job_id)
    assert [(e.effect_key, e.state) for e in view.effects] == [("mail.send", EffectState.PENDING)]


class BrokenBegins(Journal):
    """A journal whose write of an effect's begin fails (a disk error, say)."""

    async def write(self, record: Any) -> None:
        if str(record.type) == "effect_begin":
            raise OSError(5, "Input/output error")
        await super().write(record)


async def test_an_effect_whose_begin_the_journal_could_not_write_is_never_dispatched(
    timed: Rig,
) -> None:
    """The begin is the journal's evidence that a call may have gone out: when it cannot be
    written the call is not made, the effect is recorded failed_before_dispatch (a later
    attempt may begin it again), and the error reaches the handler. Control: with a journal
    that writes, the same call is dispatched."""
    calls: list[str] = []

    async def call() -> Success:
        calls.append("dispatched")
        return Success("receipt-3")

    broken = await _context(timed, "unjournaled", BrokenBegins())
    with pytest.raises(OSError):
        await broken.effect("mail.send", {"to": "c"}, call)
    assert calls == []
    view = await timed.store.job(broken.lease.job_id)
    assert [(e.effect_key, e.state) for e in view.effects] == [
        ("mail.send", EffectState.FAILED_BEFORE_DISPATCH)
    ]
    working = await _context(timed, "journaled", Journal())
    assert (await working.effect("mail.send", {"to": "c"}, call)).receipt == "receipt-3"
    assert calls == ["dispatched"]


class Kept(Journal):
    """Keeps the records written, as the journal's file would."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Any] = []

    async def write(self, record: Any) -> None:
        self.records.append(record)
        await super().write(record)


async def test_the_begin_names_the_provider_key_even_when_the_handler_did_not(
    timed: Rig,
) -> None:
    """A begin's record carries the idempotency key the provider is asked with, whether the
    handler passed it or not: after a restore (job ids rewound, the row gone) it is what a
    lookup needs. Before, it held None unless the handler passed the key itself. Control:
    passed explicitly, the same key."""
    for explicit in (False, True):
        journal = Kept()
        ctx = await _context(timed, f"keyed-{explicit}", journal)
        key = ctx.idempotency_key("mail.send")
        given = {"idempotency_key": key} if explicit else {}

        async def call() -> Success:
            return Success("receipt")

        await ctx.effect("mail.send", {"to": "d"}, call, **given)
        [begin] = [r for r in journal.records if str(r.type) == "effect_begin"]
        assert begin.idempotency_key == key


async def test_an_attempt_cancelled_while_it_notes_the_effect_s_trace_dispatched_nothing(
    timed: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With spans exported, the effect's trace context is noted in the database between its
    begin and its journaled begin; a stop, the deadline or a lost lease may cancel the
    attempt there. Nothing was dispatched: the effect is recorded failed_before_dispatch,
    and its ref is in the attempt's trail. Before, it stayed pending and out of the trail,
    and the job went unknown for a provider lookup or a person (control: not cancelled, the
    same effect is sent and recorded)."""
    monkeypatch.setattr(telemetry, "exporting", lambda: True)
    monkeypatch.setattr(telemetry, "span_headers", lambda span: {"traceparent": "00-x"})
    note_trace = timed.store.note_trace
    slow = {"on": True}

    async def held(*args: Any, **kwargs: Any) -> bool:
        if slow["on"]:
            await anyio.sleep(60)
        return await note_trace(*args, **kwargs)

    monkeypatch.setattr(timed.store, "note_trace", held)
    sent: list[str] = []

    async def call() -> Success:
        sent.append("sent")
        return Success("receipt-1")

    ctx = await _context(timed, "cancelled-at-trace", Journal())
    with anyio.move_on_after(0.5):
        await ctx.effect("mail.send", {"to": "a"}, call)
    effects = (await timed.store.job(ctx.lease.job_id)).effects
    assert sent == [] and [(e.effect_key, e.state) for e in effects] == [
        ("mail.send", EffectState.FAILED_BEFORE_DISPATCH)
    ]
    assert [ref.effect_key for ref in ctx.trail.begun] == ["mail.send"]
    slow["on"] = False  # control
    again = await _context(timed, "noted-at-trace", Journal())
    assert (await again.effect("mail.send", {"to": "a"}, call)).receipt == "receipt-1"
    assert sent == ["sent"]
