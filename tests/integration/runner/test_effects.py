"""Effects through the worker, with the provider's own evidence as the oracle: a lost reply
stays unknown until reconciled (then the job resumes and publishes with the recorded receipt,
never a second request), a cancel keeps and reports the effect, only an explicit
FailedBeforeDispatch lets the same key begin again."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from accord.demo import DEFAULT_OWNER, EFFECT_KEY, WORKFLOW, report, report_handler
from accord.demo.provider import Fault, ProviderAmbiguous, ProviderRefused
from accord.jobs import EffectAlreadyBegun, EffectState, JobState, ReceiptInvalid
from accord.jobs.repair import audit, resolve_effect, resume
from accord.jobs.runner import (
    EffectRef,
    EffectUnknown,
    Ending,
    FailedBeforeDispatch,
    JobContext,
    Success,
    report_unrecorded,
    scan_journal,
)
from accord.jobs.runner.effects import MAX_RECEIPT_CHARS
from accord.jobs.runner.recovery import open_journal
from tests.integration.runner.conftest import Rig, running, wait_for

pytestmark = pytest.mark.timeout(60)


def _in_state(rig: Rig, job_id: int, state: JobState):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return await rig.state(job_id) == state

    return check


async def test_lost_provider_reply_is_unknown_never_retried_one_accepted_request(
    rig: Rig,
) -> None:
    control = await rig.submit_report("r-ok")
    worker = rig.worker({WORKFLOW: (report_handler(rig.client), 30.0)}, rescue_every_s=0.1)
    async with running(worker):
        await wait_for(_in_state(rig, control, JobState.SUCCEEDED))  # control: a reply
        rig.provider.set_fault(Fault.DROP_AFTER_ACCEPT)  # accepted, then the reply is lost
        job_id = await rig.submit_report("r-lost")
        await wait_for(_in_state(rig, job_id, JobState.UNKNOWN))
        rig.provider.set_fault(Fault.NONE)
        # rescue runs every 0.1 s and the claim loop polls: neither touches it again
        await anyio.sleep(1.0)
    row = await rig.job(job_id)
    assert (row["state"], row["attempts"], row["last_error"]) == (
        JobState.UNKNOWN,
        1,
        "effect_unknown",
    )
    assert await rig.effects(job_id) == [(EFFECT_KEY, 1, "unknown", None)]
    assert (await rig.store.rescue()).rescued == ()
    assert await rig.store.claim(WORKFLOW, DEFAULT_OWNER, lease_s=5) == []
    assert await report(rig.pool, "acme", "r-lost") is None
    # the provider's evidence: exactly one accepted request for this job's key
    [begin] = [
        r
        for r in scan_journal(rig.journal_path()).records
        if r["type"] == "effect_begin" and r["job_id"] == job_id
    ]
    accepted = [e for e in rig.provider.evidence() if e.idempotency_key == begin["idempotency_key"]]
    assert len(accepted) == 1
    assert len(rig.provider.evidence()) == 2  # the control's and this one
    assert list(worker.stats.unresolved) == [(_ref(job_id), EffectState.UNKNOWN)]


async def test_lost_reply_reconciled_resumes_and_publishes_without_a_second_request(
    rig: Rig, tmp_path: Path
) -> None:
    rig.provider.set_fault(Fault.DROP_AFTER_ACCEPT, times=1)  # accepted, then the reply is lost
    job_id = await rig.submit_report("r-lost")
    worker = rig.worker({WORKFLOW: (report_handler(rig.client), 30.0)}, rescue_every_s=0.1)
    async with running(worker):
        await wait_for(_in_state(rig, job_id, JobState.UNKNOWN))
        assert await rig.effects(job_id) == [(EFFECT_KEY, 1, "unknown", None)]
        [accepted] = rig.provider.evidence()
        # `accord reconcile` (repair role) asks the provider by idempotency key: a receipt
        done = await anyio.run_process(
            [sys.executable, "-m", "accord", "reconcile", "--settle-s", "0"],
            env={
                **os.environ,
                "ACCORD_APP": "accord.demo:app",
                "ACCORD_PG_DSN": rig.pg_dsn,
                "ACCORD_DEMO_PROVIDER_URL": rig.provider.url,
                "ACCORD_LEDGER_PATH": str(tmp_path / "ledger"),
            },
            check=False,
        )
        out = done.stdout.decode()
        assert done.returncode == 0, done.stderr
        assert f"resolved job={job_id} key={EFFECT_KEY} seq=1 outcome=succeeded" in out
        assert f"resumed job={job_id} state=queued" in out
        # the same worker, polling, runs it again and publishes
        await wait_for(_in_state(rig, job_id, JobState.SUCCEEDED))
    published = await report(rig.pool, "acme", "r-lost")
    assert published is not None and published.provider_receipt == accepted.receipt_id
    # exactly one accepted request at the provider, one effect record: never dispatched again
    assert [e.idempotency_key for e in rig.provider.evidence()] == [accepted.idempotency_key]
    assert await rig.effects(job_id) == [(EFFECT_KEY, 1, "succeeded", accepted.receipt_id)]
    row = await rig.job(job_id)
    assert (row["state"], row["attempts"]) == (JobState.SUCCEEDED, 2)
    # the journal says the second attempt reused the recorded outcome, and began nothing
    records = [r for r in scan_journal(rig.journal_path()).records if r["job_id"] == job_id]
    assert [(r["type"], r.get("reused")) for r in records] == [
        ("claim", None),
        ("effect_begin", None),
        ("effect_outcome", False),  # the lost reply: unknown
        ("claim", None),
        ("effect_outcome", True),  # the recorded receipt, reused
        ("publish", None),
    ]
    assert records[4]["receipt"] == accepted.receipt_id and records[4]["seq"] == 1
    async with rig.pool.acquire() as conn:
        trail = await audit(conn, job_id=job_id)
    assert [(a.action, a.who) for a in trail] == [
        ("resolve_effect", "accord-reconcile"),
        ("resume", "accord-reconcile"),
    ]
    assert accepted.receipt_id in trail[1].evidence


async def test_cancel_after_effect_intent_keeps_and_reports_the_effect(rig: Rig) -> None:
    # control: cancelling work with no effect leaves nothing to reconcile
    plain = await rig.submit_report("r-plain")
    cancelled = await rig.store.cancel(plain, reason="operator")
    assert (cancelled.changed, cancelled.unresolved_effects) == (True, False)

    rig.provider.set_fault(Fault.SLOW, delay_s=30)  # accepted; the answer is slow
    job_id = await rig.submit_report("r-cancel")
    worker = rig.worker({WORKFLOW: (report_handler(rig.client), 60.0)}, lease_s=1.5)
    async with running(worker):

        async def in_flight() -> bool:
            return len(rig.provider.evidence()) == 1

        await wait_for(in_flight)
        cancelled = await rig.store.cancel(job_id, reason="operator")
        assert (cancelled.changed, cancelled.state, cancelled.unresolved_effects) == (
            True,
            JobState.CANCELED,
            True,
        )

        async def noticed() -> bool:
            return worker.stats.endings["fence_lost"] == 1

        await wait_for(noticed)
    view = await rig.store.job(job_id)
    assert view.state is JobState.CANCELED and view.needs_reconciliation
    # the fence refused the outcome: the pending row is the evidence, kept by the cancel
    assert [(e.effect_key, e.state) for e in view.effects] == [(EFFECT_KEY, EffectState.PENDING)]
    assert list(worker.stats.unresolved) == [(_ref(job_id), EffectState.PENDING)]
    # reported again by the next start of this runner, from its journal
    worker.journal.close()
    with open_journal(rig.journal_path(), "w1") as journal:
        [entry] = await report_unrecorded(rig.pool, journal)
    assert entry.ref == _ref(job_id)
    assert entry.journal_outcome is not None
    assert entry.journal_outcome.outcome is EffectState.UNKNOWN  # cancelled mid-call
    assert entry.begin.idempotency_key == rig.provider.evidence()[0].idempotency_key


async def test_only_failed_before_dispatch_permits_another_begin(rig: Rig) -> None:
    await rig.store.register_workflow("fx", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-fx", "fx")
    seen: list[Any] = []

    def call(key: str, fault: Fault | None) -> Any:
        async def send() -> Success:
            try:
                receipt = await rig.client.create_report(key, {"n": 1}, fault=fault)
            except ProviderRefused as exc:
                raise FailedBeforeDispatch(reason="provider_refused") from exc
            return Success(receipt.receipt_id)

        return send

    async def fx(ctx: JobContext) -> None:
        with pytest.raises(FailedBeforeDispatch):
            await ctx.effect("charge", {"n": 1}, call("k-charge", Fault.FAIL_BEFORE_ACCEPT))
        # control: nothing was dispatched, so the same key and intent may begin again
        seen.append(await ctx.effect("charge", {"n": 1}, call("k-charge", None)))
        with pytest.raises(EffectUnknown) as unknown:
            await ctx.effect("mail", {"n": 1}, call("k-mail", Fault.DROP_AFTER_ACCEPT))
        seen.append(unknown.value)
        # forbidden: an ambiguous dispatch never begins again (and nothing is sent)
        with pytest.raises(EffectAlreadyBegun):
            await ctx.effect("mail", {"n": 1}, call("k-mail", None))
        seen.append("refused")

    worker = rig.worker({"fx": (fx, 30.0)})
    async with running(worker):
        await wait_for(_in_state(rig, job_id, JobState.UNKNOWN))
    assert isinstance(seen[0], Success) and seen[2] == "refused"
    assert isinstance(seen[1].__cause__, ProviderAmbiguous)
    assert [(k, s, st) for k, s, st, _ in await rig.effects(job_id)] == [
        ("charge", 1, "failed_before_dispatch"),
        ("charge", 2, "succeeded"),
        ("mail", 1, "unknown"),
    ]
    evidence = rig.provider.evidence()
    assert sorted(e.idempotency_key for e in evidence) == ["k-charge", "k-mail"]
    # the handler returned with an unknown effect: the job is unknown, never retried
    [finished] = worker.stats.recent
    assert (finished.ending, finished.state) == (Ending.FAILED, JobState.UNKNOWN)


async def test_only_explicit_outcomes_stay_themselves(rig: Rig) -> None:
    await rig.store.register_workflow("odd", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-odd", "odd")

    async def returns_fbd() -> object:
        return FailedBeforeDispatch(reason="said so")

    async def returns_other() -> object:
        return {"ok": True}  # not a Success: the runner cannot tell what happened

    async def odd(ctx: JobContext) -> None:
        with pytest.raises(FailedBeforeDispatch):
            await ctx.effect("a", {}, returns_fbd)
        with pytest.raises(EffectUnknown):
            await ctx.effect("b", {}, returns_other)
        with anyio.move_on_after(0.2):
            await ctx.effect("c", {}, _forever)  # cancelled by a timeout: unknown

    worker = rig.worker({"odd": (odd, 30.0)})
    async with running(worker):
        await wait_for(_in_state(rig, job_id, JobState.UNKNOWN))
    states = [(k, st) for k, _, st, _ in await rig.effects(job_id)]
    assert states == [("a", "failed_before_dispatch"), ("b", "unknown"), ("c", "unknown")]


async def test_a_receipt_too_long_to_keep_is_a_typed_unknown_and_the_journal_stays_whole(
    rig: Rig,
) -> None:
    """A call that returns the provider's whole response as its receipt: the runner refuses
    it (check_receipt: ReceiptInvalid, naming the limit), the outcome is recorded unknown
    (the request left; its proof cannot be kept) and the journal takes the outcome record.
    Before, the database recorded the success and the journal refused the record (over its
    1 MiB frame): the handler got a JournalRecordInvalid, the journal no trace of what the
    call returned. Control: a receipt of the limit's length is recorded and journaled
    whole."""
    await rig.store.register_workflow("big", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-big", "big")
    seen: list[BaseException] = []

    def returning(length: int) -> Any:
        async def send() -> Success:
            return Success("r" * length)

        return send

    async def big(ctx: JobContext) -> None:
        await ctx.effect("fits", {}, returning(MAX_RECEIPT_CHARS))
        with pytest.raises(EffectUnknown) as unknown:
            await ctx.effect("whole-body", {}, returning(2 << 20))
        seen.append(unknown.value)

    worker = rig.worker({"big": (big, 30.0)})
    async with running(worker):
        await wait_for(_in_state(rig, job_id, JobState.UNKNOWN))
    [error] = seen
    assert isinstance(error.__cause__, ReceiptInvalid)
    assert error.__cause__.fields == {"type": "str", "length": 2 << 20, "limit": MAX_RECEIPT_CHARS}
    assert [(k, st, len(r or "")) for k, _, st, r in await rig.effects(job_id)] == [
        ("fits", "succeeded", MAX_RECEIPT_CHARS),
        ("whole-body", "unknown", 0),
    ]
    outcomes = [
        (r["effect_key"], r["outcome"], len(r.get("receipt") or ""), r.get("detail"))
        for r in scan_journal(rig.journal_path()).records
        if r["type"] == "effect_outcome"
    ]
    assert outcomes == [
        ("fits", "succeeded", MAX_RECEIPT_CHARS, None),
        ("whole-body", "unknown", 0, "raised ReceiptInvalid"),
    ]
    assert worker.journal.broken is None


async def test_a_resumed_job_reuses_a_receipt_too_long_for_the_journal(rig: Rig) -> None:
    """A repair (or an older version) recorded a receipt longer than a Success takes: the
    resumed job still reuses it whole (the database holds it) and publishes; its journal
    record of the reuse leaves the receipt to the database and stays within its frame."""
    await rig.store.register_workflow("big", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-big", "big")
    receipts: list[int] = []

    async def lost() -> Success:
        raise ConnectionResetError("the reply was lost")

    async def big(ctx: JobContext) -> None:
        done = await ctx.effect("pay", {}, lost)
        receipts.append(len(done.receipt or ""))
        await ctx.publish()

    worker = rig.worker({"big": (big, 30.0)})
    async with running(worker):
        await wait_for(_in_state(rig, job_id, JobState.UNKNOWN))
        long = "r" * (2 << 20)  # over the journal's 1 MiB frame
        async with rig.pool.acquire() as conn, conn.transaction():
            await resolve_effect(
                conn, job_id, "pay", EffectState.SUCCEEDED, who="ops", evidence="dashboard",
                receipt=long,
            )  # fmt: skip
        async with rig.pool.acquire() as conn, conn.transaction():
            await resume(conn, job_id, who="ops", evidence="resolved")
        await wait_for(_in_state(rig, job_id, JobState.SUCCEEDED))
    assert receipts == [2 << 20]
    [reused] = [
        r
        for r in scan_journal(rig.journal_path()).records
        if r["type"] == "effect_outcome" and r.get("reused")
    ]
    assert (reused["receipt"], reused["detail"]) == (
        None,
        "recorded outcome reused (its receipt in the database)",
    )
    assert worker.journal.broken is None


async def _forever() -> object:
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def _ref(job_id: int) -> EffectRef:
    return EffectRef(job_id, EFFECT_KEY, 1)
