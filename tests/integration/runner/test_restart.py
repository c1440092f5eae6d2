"""A worker's start: its journal opened honestly (torn tail repaired, corrupt refused) and the
effects an earlier run began whose outcome the database never recorded, reported."""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections import Counter
from typing import Any

import anyio
import asyncpg
import pytest

from accord import observe
from accord.demo import DEFAULT_OWNER
from accord.jobs import EffectState, JobState, repair
from accord.jobs.errors import RepairRefused
from accord.jobs.runner import (
    Begun,
    EffectBegin,
    EffectOutcome,
    EffectRef,
    JobContext,
    Journal,
    JournalCorrupt,
    JournalRecordInvalid,
    Publish,
    Success,
    Tail,
    Worker,
    WorkerConfig,
    open_journal,
    recovery,
    scan_journal,
)
from accord.ops.metrics import families
from accord.ops.status import collect_status
from tests.integration.runner.conftest import Rig, running, wait_for

pytestmark = pytest.mark.timeout(60)


async def test_restart_reports_an_effect_whose_outcome_the_database_never_recorded(
    rig: Rig,
) -> None:
    await rig.store.register_workflow("pay", DEFAULT_OWNER, effects_enabled=True)
    recorded = await rig.submit_job("op-recorded", "pay")
    lost = await rig.submit_job("op-lost", "pay")
    release = anyio.Event()
    keys: dict[int, str] = {}

    def effects_counted(outcome: str) -> float:
        labels = {"workflow": "pay", "outcome": outcome}
        return observe.REGISTRY.get_sample_value("accord_effects_total", labels) or 0.0

    counted_before = {o: effects_counted(o) for o in ("succeeded", "not_recorded")}

    async def pay(ctx: JobContext) -> None:
        async def send() -> Success:
            if ctx.lease.job_id == lost:
                await release.wait()  # the lease is taken from us while the call is out
            return Success(f"rcpt-{ctx.lease.job_id}")

        keys[ctx.lease.job_id] = ctx.idempotency_key("pay")
        await ctx.effect("pay", {"amount": 5}, send, idempotency_key=keys[ctx.lease.job_id])

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
    # counted once the database answered: one recorded, one the fence refused
    assert {o: effects_counted(o) - n for o, n in counted_before.items()} == {
        "succeeded": 1.0,
        "not_recorded": 1.0,
    }
    # the database holds the begin only; the journal holds what the call returned
    assert [(e.state, e.receipt) for e in (await rig.store.job(lost)).effects] == [
        (EffectState.PENDING, None)
    ]
    restarted = rig.worker({"pay": (pay, 30.0)}, journal="w1")
    async with running(restarted):
        pass
    [entry] = restarted.unrecorded
    assert entry.ref == EffectRef(lost, "pay", 1)  # and not the recorded one (control)
    assert entry.begin.idempotency_key == keys[lost]
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


# -- rotation: a start reads one segment, carrying what is unresolved ---------------------------


async def _lose_an_effect(rig: Rig, worker_for: Any) -> tuple[int, int, Any]:
    """Run one job whose effect is recorded and one whose outcome the database never records
    (the job is cancelled while its call is out); returns (recorded, lost, the handler)."""
    await rig.store.register_workflow("pay", DEFAULT_OWNER, effects_enabled=True)
    recorded = await rig.submit_job("op-recorded", "pay")
    lost = await rig.submit_job("op-lost", "pay")
    release = anyio.Event()

    async def pay(ctx: JobContext) -> None:
        async def send() -> Success:
            if ctx.lease.job_id == lost:
                await release.wait()
            return Success(f"rcpt-{ctx.lease.job_id}")

        await ctx.effect("pay", {"amount": 5}, send, idempotency_key=ctx.idempotency_key("pay"))

    worker = worker_for(pay)
    async with running(worker):

        async def both_begun() -> bool:
            n = await rig.pool.fetchval("SELECT count(*) FROM jobs.effects")
            return bool(n == 2) and await rig.state(recorded) == JobState.SUCCEEDED

        await wait_for(both_begun)
        await rig.store.cancel(lost, reason="operator")
        release.set()

        async def gave_up() -> bool:
            return worker.stats.endings["fence_lost"] == 1

        await wait_for(gave_up)
    return recorded, lost, pay


def _worker(rig: Rig, handler: Any, *, name: str = "w1", segment_bytes: int = 1 << 24) -> Worker:
    worker = Worker(
        WorkerConfig(owner=DEFAULT_OWNER, lease_s=30.0, poll_s=0.05, rescue_every_s=None),
        store=rig.store,
        journal=open_journal(rig.journal_path(name), name, segment_bytes=segment_bytes),
        objects=rig.objects,
        pool=rig.pool,
    )
    worker.register("pay", handler, timeout_s=30.0)
    return worker


async def test_a_start_carries_only_the_unrecorded_effects_into_a_new_segment(rig: Rig) -> None:
    _, lost, pay = await _lose_an_effect(rig, lambda h: _worker(rig, h))
    path = rig.journal_path()
    before = scan_journal(path)
    assert before.segment == 1 and len(before.records) > 2  # the first run's whole history
    async with running(_worker(rig, pay)) as restarted:
        pass
    [entry] = restarted.unrecorded
    assert entry.ref == EffectRef(lost, "pay", 1)
    after = scan_journal(path)
    # Only the lost effect's begin and journal outcome were carried; the rest is gone.
    assert (after.version, after.segment, after.carried) == (2, 2, 2)
    assert [(r["type"], r["job_id"]) for r in after.records] == [
        ("effect_begin", lost),
        ("effect_outcome", lost),
    ]
    # A later start reads the carried records and still reports the effect, with its receipt.
    async with running(_worker(rig, pay)) as again:
        pass
    [entry] = again.unrecorded
    assert entry.journal_outcome is not None and entry.journal_outcome.receipt == f"rcpt-{lost}"
    assert scan_journal(path).segment == 2  # nothing to leave behind: not rotated again


async def test_a_start_leaves_out_a_published_job_s_effects_once_retention_removed_it(
    rig: Rig,
) -> None:
    """A worker down longer than the jobs retention finds, at its start, journal records of
    jobs the database no longer holds. A job whose publish the journal holds had every effect
    resolved when that publish committed: left out, not carried. A job gone with no publish
    in the journal (as a restore from an older backup would leave it) stays reported."""
    recorded, lost, pay = await _lose_an_effect(rig, lambda h: _worker(rig, h))
    path = rig.journal_path()
    published = [r["job_id"] for r in scan_journal(path).records if r["type"] == "publish"]
    assert published == [recorded]
    # Retention removes the published job (aged past it: the job and its effect record).
    pruned = await rig.prune_past_retention([recorded])
    assert (pruned.jobs, pruned.effects) == (1, 1)
    # The cancelled job's rows vanish too, behind the guards' back (a restore's doing).
    async with rig.pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        for table in ("effect_traces", "effects", "jobs", "operations"):
            await conn.execute(f"DELETE FROM jobs.{table} WHERE job_id = $1", lost)
    async with running(_worker(rig, pay)) as restarted:
        pass
    assert [entry.ref for entry in restarted.unrecorded] == [EffectRef(lost, "pay", 1)]
    after = scan_journal(path)
    assert {r["job_id"] for r in after.records} == {lost}  # nothing of the published job


async def test_a_running_worker_rotates_and_its_restart_reads_one_bounded_segment(
    rig: Rig,
) -> None:
    _, lost, pay = await _lose_an_effect(rig, lambda h: _worker(rig, h, segment_bytes=4096))
    jobs = [await rig.submit_job(f"op-{n}", "pay") for n in range(40)]
    worker = _worker(rig, pay, segment_bytes=4096)
    async with running(worker):

        async def all_done() -> bool:
            states = [await rig.state(job) for job in jobs]
            return all(state == JobState.SUCCEEDED for state in states)

        await wait_for(all_done)

        async def rotated() -> bool:
            # at its start, then while running; and the rotation loop caught up with the last
            # jobs' records (how much they wrote within one of its polls is the machine's pace)
            return worker.journal.stats.rotations >= 2 and not worker.journal.rotation_due

        await wait_for(rotated)
        live = scan_journal(rig.journal_path())
        # Once nothing is in flight, a rotation leaves behind every effect the database
        # recorded: the segment holds the lost effect's begin and outcome, nothing else.
        await recovery.rotate_journal(rig.pool, worker.journal)
        quiet = scan_journal(rig.journal_path())
    # The first run's segment, sealed at this start, then at least one rotation while running
    # (more when the first run or this one wrote faster than a poll: the machine's pace).
    assert live.segment >= 3
    # The loop's segment: what it carried (the lost effect, and the begins of jobs in flight
    # between its query and its switch: as many as the machine's pace let begin), then less
    # than the bound written since, or than what it carried when that is more (rotation_due).
    fresh = live.offsets[live.carried] if live.carried < len(live.offsets) else live.end
    assert live.end - fresh < max(4096, fresh - live.offsets[0])
    assert [(r["type"], r["job_id"]) for r in quiet.records] == [
        ("effect_begin", lost),
        ("effect_outcome", lost),
    ]
    assert quiet.size < 1024
    async with running(_worker(rig, pay, segment_bytes=4096)) as restarted:
        pass
    assert [e.ref for e in restarted.unrecorded] == [EffectRef(lost, "pay", 1)]


async def test_a_0_2_journal_is_read_at_start_and_migrated(rig: Rig) -> None:
    _, lost, pay = await _lose_an_effect(rig, lambda h: _worker(rig, h))
    path = rig.journal_path()
    history = scan_journal(path).records
    path.unlink()
    with Journal.open(path, "w1") as old:  # the same records, as 0.2 wrote them (version 1)
        for record in history:
            old.append(record)
    assert scan_journal(path).version == 1
    async with running(_worker(rig, pay)) as restarted:
        pass
    assert [e.ref for e in restarted.unrecorded] == [EffectRef(lost, "pay", 1)]
    migrated = scan_journal(path)
    assert (migrated.version, migrated.carried) == (2, 2)
    assert [r["type"] for r in migrated.records] == ["effect_begin", "effect_outcome"]


async def test_a_begin_is_recorded_only_on_the_row_its_own_attempt_began(rig: Rig) -> None:
    """A restore that rewinds the job ids lets a new job take the id of one whose begin the
    journal still carries. The new job's effect of the same key and seq (another attempt's
    row, recorded), its outcome and its publish in the journal are not that begin's: a start
    reports the begin with no outcome and a rotation carries it on (control: the journal of
    the attempt the database recorded has nothing to report and is dropped)."""
    await rig.store.register_workflow("pay", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-new", "pay")
    [lease] = await rig.store.claim("pay", DEFAULT_OWNER, lease_s=30)
    seq = await rig.store.begin_effect(lease, "pay", "intent")
    await rig.store.finish_effect(lease, "pay", EffectState.SUCCEEDED, receipt="rcpt-new")
    ref = EffectRef(job_id, "pay", seq)
    ids = {"tenant": lease.tenant, "job_id": job_id, "generation": lease.generation}
    new = {**ids, "attempt_id": lease.attempt_id}
    effect = {"effect_key": "pay", "seq": seq}
    new_job = [
        EffectBegin(**new, **effect),
        EffectOutcome(**new, **effect, outcome=EffectState.SUCCEEDED, receipt="rcpt-new"),
        Publish(**new),
    ]
    lost = EffectBegin(**ids, attempt_id=uuid.uuid4(), **effect)
    for name, records, carried in (("lost", [lost, *new_job], True), ("same", new_job, False)):
        with open_journal(rig.journal_path(name), name) as journal:
            for record in records:
                await journal.write(record)
        journal = open_journal(rig.journal_path(name), name)
        try:
            found = await recovery.report_unrecorded(rig.pool, journal)
            assert [(e.ref, e.begin.attempt_id, e.journal_outcome) for e in found] == (
                [(ref, lost.attempt_id, None)] if carried else []
            ), name
            rotation = await recovery.rotate_journal(rig.pool, journal)
            assert rotation is not None
            carried_now = [Begun(ref, str(lost.attempt_id))] if carried else []
            assert journal.begun() == carried_now, name
        finally:
            journal.close()


async def test_a_begin_after_another_attempt_s_begin_of_the_same_ref_is_its_own_evidence(
    rig: Rig,
) -> None:
    """The other order. The journal still holds an old attempt's begin, outcome and publish
    of a job whose id a restore rewound; the new job of that id begins the same key and seq,
    and its worker stops before the outcome is recorded. Both begins are reported and both
    are carried (before, the first begin stood for the ref: the new attempt's, the only
    evidence that its call went out, was neither reported nor carried). Control: once the
    new attempt's outcome is recorded, only the old begin stays."""
    await rig.store.register_workflow("pay", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-new", "pay")
    [lease] = await rig.store.claim("pay", DEFAULT_OWNER, lease_s=30)
    seq = await rig.store.begin_effect(lease, "pay", "intent")  # pending: the worker stopped
    ref = EffectRef(job_id, "pay", seq)
    ids = {"tenant": lease.tenant, "job_id": job_id, "generation": lease.generation}
    effect = {"effect_key": "pay", "seq": seq}
    old = {**ids, "attempt_id": uuid.uuid4()}
    records = [
        EffectBegin(**old, **effect),
        EffectOutcome(**old, **effect, outcome=EffectState.SUCCEEDED, receipt="rcpt-old"),
        Publish(**old),
        EffectBegin(**ids, attempt_id=lease.attempt_id, **effect),
    ]
    theirs, ours = Begun(ref, str(old["attempt_id"])), Begun(ref, str(lease.attempt_id))
    with open_journal(rig.journal_path("w"), "w") as journal:
        for record in records:
            await journal.write(record)
    for recorded in (False, True):
        if recorded:  # the control: the new attempt's outcome reaches the database
            await rig.store.finish_effect(lease, "pay", EffectState.SUCCEEDED, receipt="r")
        journal = open_journal(rig.journal_path("w"), "w")
        try:
            found = await recovery.report_unrecorded(rig.pool, journal)
            expected = [theirs] if recorded else [theirs, ours]
            assert [e.begun for e in found] == expected
            assert found[0].journal_outcome is not None  # the old attempt's own outcome
            assert found[0].journal_outcome.receipt == "rcpt-old"
            if not recorded:
                assert found[1].journal_outcome is None
            await recovery.seal_at_start(journal, found)
            assert journal.begun() == expected
        finally:
            journal.close()


async def _journal_of(rig: Rig, name: str, lease: Any, seq: int, *, published: bool) -> Any:
    """A journal holding ``lease``'s begin of "pay" (and its outcome, and its publish)."""
    ids = {"tenant": lease.tenant, "job_id": lease.job_id, "generation": lease.generation}
    ids["attempt_id"] = lease.attempt_id
    effect = {"effect_key": "pay", "seq": seq}
    records = [
        EffectBegin(**ids, **effect),
        EffectOutcome(**ids, **effect, outcome=EffectState.SUCCEEDED, receipt="rcpt"),
    ]
    if published:
        records.append(Publish(**ids))
    with open_journal(rig.journal_path(name), name) as journal:
        for record in records:
            await journal.write(record)
    return open_journal(rig.journal_path(name), name)


async def _reported(rig: Rig, journal: Any) -> list[EffectRef]:
    try:
        return [e.ref for e in await recovery.report_unrecorded(rig.pool, journal)]
    finally:
        journal.close()


async def test_a_journaled_begin_is_let_go_only_for_a_job_retention_removed(rig: Rig) -> None:
    """A job retention removed had every effect resolved: its begin is let go at a start,
    published or not (before 0047, a failed job pruned while the worker was down was
    reported and carried at every start), by its attempt's tombstone (0054). So is a
    begin of a job retention removed before 0054 (gone at or below jobs.pruned's mark,
    frozen there). A begin whose database holds no record of it stays evidence even with a
    publish in the journal: the database may be a restore from before the begin (its job
    queued, never run) or from before the job (gone, above what retention removed). Before,
    the journal's publish let both go, the only evidence that the call went out."""
    await rig.store.register_workflow("pay", DEFAULT_OWNER, effects_enabled=True)
    ran: dict[str, tuple[Any, int]] = {}
    for op in ("published", "failed"):
        job_id = await rig.submit_job(op, "pay")
        [lease] = await rig.store.claim("pay", DEFAULT_OWNER, lease_s=30)
        seq = await rig.store.begin_effect(lease, "pay", "intent")
        await rig.store.finish_effect(lease, "pay", EffectState.SUCCEEDED, receipt="rcpt")
        if op == "published":
            await rig.store.publish(lease)
        else:
            await rig.store.fail(lease, "boom", retry=False)
        ran[op] = (lease, seq)
        assert lease.job_id == job_id
    never_run = await rig.submit_job("restored", "pay")  # a restore from before its begin
    [restored] = await rig.store.claim("pay", DEFAULT_OWNER, lease_s=30)
    assert restored.job_id == never_run
    await rig.store.cancel(never_run, reason="test")  # queued again or not: no effect row
    pruned = await rig.prune_past_retention([lease.job_id for lease, _ in ran.values()])
    assert pruned.jobs == 2
    tombstones = await rig.pool.fetch("SELECT attempt_id FROM jobs.pruned_attempts")
    assert {r["attempt_id"] for r in tombstones} == {lease.attempt_id for lease, _ in ran.values()}
    assert await rig.pool.fetchval("SELECT count(*) FROM jobs.pruned") == 0  # frozen at 0054
    for op, (lease, seq) in ran.items():  # pruned: let go, published or not
        journal = await _journal_of(rig, op, lease, seq, published=op == "published")
        assert await _reported(rig, journal) == [], op
    # Pruned before 0054: no tombstone, its job gone at or below the frozen mark.
    legacy = dataclasses.replace(restored, job_id=never_run + 1, attempt_id=uuid.uuid4())
    await rig.pool.execute("INSERT INTO jobs.pruned (through_job_id) VALUES ($1)", never_run + 1)
    journal = await _journal_of(rig, "legacy", legacy, 1, published=False)
    assert await _reported(rig, journal) == []
    # The job queued in the database, never run there: its begin and publish in the journal.
    journal = await _journal_of(rig, "queued", restored, 1, published=True)
    assert await _reported(rig, journal) == [EffectRef(never_run, "pay", 1)]
    # A job the database never had, above what retention removed.
    beyond = dataclasses.replace(restored, job_id=never_run + 100)
    journal = await _journal_of(rig, "beyond", beyond, 1, published=True)
    assert await _reported(rig, journal) == [EffectRef(never_run + 100, "pay", 1)]


async def test_an_effect_record_the_index_cannot_read_refuses_the_start(rig: Rig) -> None:
    """A begin whose job id is a string ("5") reads as a record (pydantic is lax) but is not
    indexed, so a rotation would not carry it: it was reported once, then dropped. It now
    refuses the start (control: the same begin with an int job id is reported)."""
    ids = {"tenant": "acme", "attempt_id": str(uuid.uuid4()), "generation": 1}
    effect = {"type": "effect_begin", "effect_key": "pay", "seq": 1}
    for name, job_id in (("int", 5), ("text", "5")):
        with open_journal(rig.journal_path(name), name) as journal:
            await journal.write({**ids, **effect, "job_id": job_id})
        journal = open_journal(rig.journal_path(name), name)
        try:
            if job_id == 5:
                found = await recovery.report_unrecorded(rig.pool, journal)
                assert [e.ref for e in found] == [EffectRef(5, "pay", 1)]
            else:
                with pytest.raises(JournalRecordInvalid):
                    await recovery.report_unrecorded(rig.pool, journal)
        finally:
            journal.close()


async def _journal_evidence(rig: Rig) -> list[Any]:
    """`accord status`'s journal evidence, checked against its /metrics gauge."""
    async with rig.pool.acquire() as conn:
        report = await collect_status(conn, integrity=False, window=False)
    [gauge] = [f for f in families(report) if f.name == "accord_journal_evidence"]
    by_tenant = {s.labels["tenant"]: s.value for s in gauge.samples}
    assert by_tenant == dict(Counter(v.tenant for v in report.journal_evidence))
    return list(report.journal_evidence)


async def test_a_restore_s_evidence_outlives_the_prune_of_a_job_that_took_its_id(
    rig: Rig,
) -> None:
    """0054. The journal holds an old attempt's begin of job J; a restore rewound the job ids
    and a new job took J, ran its own effect and published. A start reports the old begin,
    notes it (jobs.journal_evidence) and carries it. Retention then removes the new job J.
    Before 0054 the prune mark then covered J with no row of it, which read as "its job was
    pruned": the next rotation dropped the old begin, the only record that its call went
    out, and so did the first start of a worker whose journal held it and that had not
    started since the restore (never noted). A begin is now let go only by what the database
    says of its own attempt: the pruned job leaves a tombstone of *its* attempt, not the old
    one's. The noted begin stays, reported at each start under the same note and kept by a
    running rotation, until a person acknowledges the note (the repair role, audited); the
    next start then drops it. The late worker's first start reports and notes it too
    (control: a begin of the pruned attempt itself is let go by its tombstone:
    ``test_a_journaled_begin_is_let_go_only_for_a_job_retention_removed``)."""
    await rig.store.register_workflow("pay", DEFAULT_OWNER, effects_enabled=True)
    job_id = await rig.submit_job("op-new", "pay")
    [lease] = await rig.store.claim("pay", DEFAULT_OWNER, lease_s=30)
    seq = await rig.store.begin_effect(lease, "pay", "intent")
    await rig.store.finish_effect(lease, "pay", EffectState.SUCCEEDED, receipt="rcpt-new")
    await rig.store.publish(lease)
    ids = {"tenant": lease.tenant, "job_id": job_id, "generation": lease.generation}
    effect = {"effect_key": "pay", "seq": seq}
    old = EffectBegin(**ids, attempt_id=uuid.uuid4(), **effect, idempotency_key="idem-old")
    new = {**ids, "attempt_id": lease.attempt_id}
    records = [
        old,
        EffectOutcome(**ids, attempt_id=old.attempt_id, **effect, outcome=EffectState.SUCCEEDED),
        EffectBegin(**new, **effect),
        EffectOutcome(**new, **effect, outcome=EffectState.SUCCEEDED, receipt="rcpt-new"),
        Publish(**new),
    ]
    theirs = Begun(EffectRef(job_id, "pay", seq), str(old.attempt_id))
    with open_journal(rig.journal_path("w"), "w") as journal:
        for record in records:
            await journal.write(record)
    # another worker's journal, with its own lost attempt of J, first started after the prune
    lost = EffectBegin(**ids, attempt_id=uuid.uuid4(), **effect, idempotency_key="idem-late")
    with open_journal(rig.journal_path("late"), "late") as journal:
        await journal.write(lost)

    async def start(runner: str = "w") -> list[Any]:
        """A worker's start, as the worker role: report, note, seal."""
        journal = open_journal(rig.journal_path(runner), runner)
        try:
            async with rig.pool.acquire() as conn, conn.transaction():
                await conn.execute("SET LOCAL ROLE accord_worker")
                found = await recovery.report_unrecorded(conn, journal)
            await recovery.seal_at_start(journal, found)
            assert journal.begun() == [e.begun for e in found]
            return found
        finally:
            journal.close()

    [first] = await start()
    assert (first.begun, first.begin.idempotency_key) == (theirs, "idem-old")
    assert first.evidence_id is not None
    note = await rig.pool.fetchrow(
        "SELECT tenant, runner_id, idempotency_key, acknowledged_at FROM jobs.journal_evidence"
        " WHERE evidence_id = $1",
        first.evidence_id,
    )
    assert tuple(note) == (lease.tenant, "w", "idem-old", None)
    assert [(v.evidence_id, v.job_id, v.idempotency_key) for v in await _journal_evidence(rig)] == [
        (first.evidence_id, job_id, "idem-old")
    ]
    assert (await rig.prune_past_retention([job_id])).jobs == 1  # the new job J
    tombstones = await rig.pool.fetch("SELECT attempt_id FROM jobs.pruned_attempts")
    assert [r["attempt_id"] for r in tombstones] == [lease.attempt_id]  # the new attempt's
    # forbidden before 0054: the prune mark let the old begin go
    [again] = await start()
    assert (again.begun, again.evidence_id) == (theirs, first.evidence_id)
    [late] = await start("late")
    assert late.begin == lost and late.evidence_id not in (None, first.evidence_id)
    # a running rotation keeps it too
    journal = open_journal(rig.journal_path("w"), "w")
    try:
        await recovery.rotate_journal(rig.pool, journal)
        assert journal.begun() == [theirs]
    finally:
        journal.close()
    # The worker role cannot acknowledge; the repair role can, once, with a principal.
    async with rig.pool.acquire() as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            async with conn.transaction():
                await conn.execute("SET LOCAL ROLE accord_worker")
                await repair.acknowledge_evidence(conn, first.evidence_id, who="w", evidence="e")
        async with conn.transaction():
            await conn.execute("SET LOCAL ROLE accord_repair")
            with pytest.raises(RepairRefused) as no_who:
                await repair.acknowledge_evidence(conn, first.evidence_id, who=" ", evidence="e")
    assert no_who.value.reason == "no_principal"
    env = {**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": rig.pg_dsn}
    ack = ["acknowledge-evidence", "--id", str(first.evidence_id), "--who", "alice"]
    done = await anyio.run_process(
        [sys.executable, "-m", "accord", "repair", *ack, "--evidence", "provider: sent once"],
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"acknowledged evidence={first.evidence_id} job={job_id}".encode() in done.stdout
    again_cli = await anyio.run_process(
        [sys.executable, "-m", "accord", "repair", *ack, "--evidence", "e"], env=env, check=False
    )
    assert again_cli.returncode != 0 and b"already_acknowledged" in again_cli.stderr
    # the note's job id is the journal's, not this database's job J: named in the detail only
    assert await repair.audit(rig.pool, job_id=job_id) == []
    [audit] = await repair.audit(rig.pool, tenant=lease.tenant)
    assert (audit.action, audit.who, audit.db_role, audit.job_id) == (
        "acknowledge_evidence",
        "alice",
        "accord_repair",
        None,
    )
    assert [v.evidence_id for v in await _journal_evidence(rig)] == [late.evidence_id]
    # The worker does not start again until after the audit retention: the acknowledged note
    # is still there for its start (0063; before, the prune removed it, and the start noted
    # the begin again, unacknowledged, for a person to recheck).
    await rig.pool.execute(
        "UPDATE jobs.journal_evidence SET acknowledged_at = now() - interval '2 days'"
        " WHERE evidence_id = $1",
        first.evidence_id,
    )
    await rig.prune_past_retention([])  # an audit retention of one day
    # acknowledged: let go at the next start, and nothing left to report after it
    assert await start() == []
    assert scan_journal(rig.journal_path("w")).records == ()


async def test_a_start_on_a_database_that_takes_no_writes_reports_its_evidence_unnoted(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker started on a standby (here a read-only transaction) cannot note a restore's
    evidence: it reports the begin, logs why it is not noted, and starts as it did before
    notes existed (the journal keeps the begin whatever the notes say); a start that can
    write notes it (control)."""
    ids = {"tenant": "acme", "job_id": 5, "attempt_id": uuid.uuid4(), "generation": 1}
    with open_journal(rig.journal_path("ro"), "ro") as journal:
        await journal.write(EffectBegin(**ids, effect_key="pay", seq=1))
    for read_only in (True, False):
        journal = open_journal(rig.journal_path("ro"), "ro")
        try:
            async with rig.pool.acquire() as conn, conn.transaction(readonly=read_only):
                [found] = await recovery.report_unrecorded(conn, journal)
        finally:
            journal.close()
        assert found.ref == EffectRef(5, "pay", 1)
        assert (found.evidence_id is None) is read_only
    assert "journal evidence not noted: the database takes no writes" in caplog.text
