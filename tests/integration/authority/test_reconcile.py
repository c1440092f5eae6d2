"""Reconciliation resolves unknown effects only with evidence, and escalates the rest by age.

Against the real provider simulator (loopback HTTP, durable evidence) and its receipt lookup.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from accord.commands.reconcile import asking
from accord.demo.app import receipt_lookup
from accord.demo.provider import Fault, ProviderAmbiguous, ProviderClient, ProviderServer
from accord.jobs import EffectState, JobState, Lease, reconcile
from accord.jobs.reconcile import Left
from accord.jobs.repair import audit
from accord.jobs.runner.effects import idempotency_key
from accord.schemas import telemetry
from tests.integration.authority.conftest import Principals
from tests.integration.telemetry.receiver import otlp_receiver

KEY = "deliver"
DEMO_KEY = "provider.create_report"  # the demo's report_provider owns it, with a lookup
BODY = {"report": "q3"}


@pytest.fixture
async def provider_server(tmp_path: Path) -> AsyncIterator[ProviderServer]:
    async with ProviderServer(tmp_path / "evidence.sqlite") as server:
        yield server


@pytest.fixture
def provider(provider_server: ProviderServer) -> ProviderClient:
    return ProviderClient(provider_server.url, timeout_s=5.0)


async def gave_up(p: Principals, lease: Lease, key: str = KEY, *, retry: bool = True) -> None:
    """The runner's ending for an ambiguous call: outcome unknown, the job given up with a
    retry (EffectUnknown is not a handler defect); ``retry=False``: the handler's final
    verdict (a defect of its own, met after the effect went unknown)."""
    await p.store.finish_effect(lease, key, EffectState.UNKNOWN)
    assert await p.store.fail(lease, "effect outcome unknown", retry=retry) is JobState.UNKNOWN


async def accepted_but_unanswered(
    p: Principals, provider: ProviderClient, op: str, *, retry: bool = True, key: str = KEY
) -> Lease:
    await p.submit(op)
    lease = await p.claim_one()
    await p.store.begin_effect(lease, key, "intent")
    with pytest.raises(ProviderAmbiguous):  # the provider records it, then drops the reply
        await provider.create_report(
            idempotency_key(lease, key), BODY, fault=Fault.DROP_AFTER_ACCEPT
        )
    await gave_up(p, lease, key, retry=retry)
    return lease


async def never_sent(p: Principals, op: str, *, retry: bool = True) -> Lease:
    await p.submit(op)
    lease = await p.claim_one()
    await p.store.begin_effect(lease, KEY, "intent")  # then the worker died before sending
    await gave_up(p, lease, retry=retry)
    return lease


def provider_lookup(client: ProviderClient) -> reconcile.LookupFor:
    """The report provider's lookup, for every effect of these tests (all of them its key)."""
    lookup = asking("report_provider", receipt_lookup(client))
    return lambda _effect: lookup


async def test_the_provider_receipt_decides(
    principals: Principals, provider: ProviderClient
) -> None:
    p = principals
    accepted = await accepted_but_unanswered(p, provider, "a")
    unseen = await never_sent(p, "b")
    lookup = provider_lookup(provider)
    async with p.repair.acquire() as conn:
        # control: "never seen" is not trusted while a request could still be in flight
        settling = await reconcile.reconcile(
            conn, lookup, who="reconciler", escalate_after_s=3600, settle_s=3600
        )
        assert [(r.job_id, r.outcome) for r in settling.resolved] == [
            (accepted.job_id, EffectState.SUCCEEDED)
        ]
        # nothing of that job is unresolved any more: resumed in the same transaction
        assert [(r.job_id, r.state) for r in settling.resumed] == [
            (accepted.job_id, JobState.QUEUED)
        ]
        assert [(e.job_id, why) for e, why in settling.left] == [(unseen.job_id, Left.SETTLING)]
        report = await reconcile.reconcile(
            conn, lookup, who="reconciler", escalate_after_s=3600, settle_s=0
        )
        assert [(r.job_id, r.outcome, r.job_state) for r in report.resolved] == [
            (unseen.job_id, EffectState.FAILED_BEFORE_DISPATCH, JobState.QUEUED)
        ]
        assert report.escalated == () and report.resumed == ()  # requeued by the resolution
        trail = await audit(conn, job_id=accepted.job_id) + await audit(conn, job_id=unseen.job_id)
    receipt = (await provider.lookup(idempotency_key(accepted, KEY))).receipt_id  # type: ignore[union-attr]
    assert [(a.action, a.who, a.outcome) for a in trail] == [
        ("resolve_effect", "reconciler", "succeeded"),
        ("resume", "reconciler", "queued"),
        ("resolve_effect", "reconciler", "failed_before_dispatch"),
    ]
    assert receipt in trail[0].evidence and receipt in trail[1].evidence
    assert "never accepted" in trail[2].evidence
    view = await p.store.job(accepted.job_id)
    assert view.effects[0].receipt == receipt and not view.needs_reconciliation
    both = {lease.job_id: lease for lease in await p.claim(limit=2)}
    assert set(both) == {accepted.job_id, unseen.job_id}
    # the accepted one runs again without a second request: the recorded receipt comes back
    resumed = await p.store.start_effect(both[accepted.job_id], KEY, "intent")
    assert (resumed.reused, resumed.seq, resumed.receipt) == (True, 1, receipt)
    await p.store.publish(both[accepted.job_id])
    # the one the provider never saw may run again: same key, a new record, same provider key
    again = both[unseen.job_id]
    assert await p.store.begin_effect(again, KEY, "intent") == 2
    made = await provider.create_report(idempotency_key(again, KEY), BODY)
    await p.store.finish_effect(again, KEY, EffectState.SUCCEEDED, receipt=made.receipt_id)
    await p.store.publish(again)
    assert (await provider.stats())["accepted"] == 2  # one each, no duplicate
    assert {await p.state(j) for j in both} == {"succeeded"}


async def test_a_final_verdict_is_kept_once_the_effect_is_known(
    principals: Principals, provider: ProviderClient
) -> None:
    """Migration 0055. A job its handler gave up without a retry while an effect was unknown
    (a defect of its own after the call: fail(retry=False)) is failed once the provider's
    answer resolves that effect, whatever the answer: before, the "never seen" resolution
    queued it and the receipt's resumed it, and the job ran again, dispatching again what
    its handler had given up on. Control: test_the_provider_receipt_decides, the same two
    answers for jobs given up with a retry, which run again."""
    p = principals
    accepted = await accepted_but_unanswered(p, provider, "a", retry=False)
    unseen = await never_sent(p, "b", retry=False)
    async with p.repair.acquire() as conn:
        report = await reconcile.reconcile(
            conn, provider_lookup(provider), who="reconciler", escalate_after_s=3600, settle_s=0
        )
        trail = await audit(conn, job_id=accepted.job_id) + await audit(conn, job_id=unseen.job_id)
    assert sorted((r.job_id, r.outcome, r.job_state) for r in report.resolved) == [
        (accepted.job_id, EffectState.SUCCEEDED, JobState.FAILED),
        (unseen.job_id, EffectState.FAILED_BEFORE_DISPATCH, JobState.FAILED),
    ]
    assert report.resumed == () and report.left == ()
    assert [(a.action, a.outcome) for a in trail] == [
        ("resolve_effect", "succeeded"),
        ("resolve_effect", "failed_before_dispatch"),
    ]
    assert {await p.state(j.job_id) for j in (accepted, unseen)} == {"failed"}
    for lease in (accepted, unseen):
        view = await p.store.job(lease.job_id)
        assert not view.needs_reconciliation and view.last_error == "effect outcome unknown"
    assert await p.claim(limit=2) == []  # nothing runs again
    assert (await provider.stats())["accepted"] == 1  # the one call that got through


async def test_a_receipt_that_fails_a_job_for_good_is_an_error_in_its_trace(
    principals: Principals,
    provider: ProviderClient,
    provider_server: ProviderServer,
    ledger_env: dict[str, str],
) -> None:
    """`accord reconcile`'s resolution span is the operation's last word when the resolution
    fails the job (0055: given up for good), receipt or not: an error. Control: the same
    answer for a job given up with a retry resumes it, no error."""
    p = principals
    again = await accepted_but_unanswered(p, provider, "a", key=DEMO_KEY)
    final = await accepted_but_unanswered(p, provider, "b", key=DEMO_KEY, retry=False)
    with otlp_receiver() as (endpoint, received):
        done = await anyio.run_process(
            [sys.executable, "-m", "accord", "reconcile", "--settle-s", "0"],
            env={
                **ledger_env,
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_SERVICE_NAME": "reconcile",
                "ACCORD_APP": "accord.demo:app",
                "ACCORD_PG_DSN": p.dsn,
                "ACCORD_DEMO_PROVIDER_URL": provider_server.url,
            },
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert "resolved=2 resumed=1" in done.stdout.decode()
        spans = received.named("reconcile ")
    by_job = {s.attributes[telemetry.ATTR_JOB_ID]: s for s in spans}
    assert set(by_job) == {again.job_id, final.job_id}
    assert by_job[again.job_id].status_code == 0  # control: resumed, it goes on
    assert by_job[final.job_id].status_code == 2
    assert by_job[final.job_id].attributes[telemetry.ATTR_RECONCILE_JOB_STATE] == "failed"
    assert await p.state(final.job_id) == "failed"


async def _backdate(p: Principals, table: str, columns: str, job_id: int, s: int) -> None:
    """Move ``columns`` of job ``job_id``'s row(s) in ``table`` ``s`` seconds back (test-only,
    as the owner with triggers off: the effect guard refuses any change of a pending row)."""
    moved = ", ".join(f"{c} = {c} - make_interval(secs => $2)" for c in columns.split())
    async with p.owner.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(f"UPDATE {table} SET {moved} WHERE job_id = $1", job_id, s)


@pytest.mark.parametrize("cut", ["expired", "rotated"])
async def test_never_seen_settles_from_when_no_attempt_can_still_send(
    principals: Principals, provider: ProviderClient, cut: str
) -> None:
    """An effect begun five minutes ago whose job was rescued just now: its lease expired,
    or a rotation of the tenant's epoch cut it short (its worker, cut off from the database,
    runs on until the lease it was granted ends). The provider's "never seen" is not trusted
    while an attempt may still be sending. Before, the settle ran from the begin: resolved
    failed_before_dispatch at once and the job queued to dispatch again. Stage by stage: the
    rescue just now holds it; with the rescue five minutes back, the lease granted (a minute
    from the claim) still holds it after a cut; with that lease past too, it resolves."""
    p = principals
    await p.submit("a")
    lease = await p.claim_one(lease_s=60)
    await p.store.begin_effect(lease, KEY, "intent")
    await _backdate(p, "jobs.effects", "begun_at", lease.job_id, 300)
    if cut == "expired":
        await p.expire(lease.job_id)
    else:
        async with p.owner.acquire() as conn:
            await conn.execute("SELECT jobs.rotate_epoch($1)", lease.tenant)
    assert [r.job_id for r in (await p.store.rescue()).rescued] == [lease.job_id]
    assert await p.state(lease.job_id) == "unknown"
    lookup = provider_lookup(provider)  # the provider never saw it
    async with p.repair.acquire() as conn:

        async def settle() -> reconcile.ReconcileReport:
            return await reconcile.reconcile(
                conn, lookup, who="reconciler", escalate_after_s=3600, settle_s=10
            )

        report = await settle()  # rescued just now
        assert [(e.job_id, why) for e, why in report.left] == [(lease.job_id, Left.SETTLING)]
        assert report.left[0][0].age_s >= 300
        await _backdate(p, "jobs.jobs", "updated_at", lease.job_id, 300)
        report = await settle()  # the lease granted at the claim runs for a minute more
        assert [(e.job_id, why) for e, why in report.left] == [(lease.job_id, Left.SETTLING)]
        assert report.left[0][0].quiet_s is not None and report.left[0][0].quiet_s < 0
        await _backdate(p, "jobs.jobs", "lease_granted_until", lease.job_id, 300)
        report = await settle()  # control: nothing of it can be on its way any more
    assert [(r.job_id, r.outcome, r.job_state) for r in report.resolved] == [
        (lease.job_id, EffectState.FAILED_BEFORE_DISPATCH, JobState.QUEUED)
    ]


async def test_no_definite_answer_leaves_it_unknown(principals: Principals, tmp_path: Path) -> None:
    p = principals
    lease = await never_sent(p, "a")
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
    gone = provider_lookup(ProviderClient(f"http://127.0.0.1:{port}", connect_timeout_s=1))
    async with p.repair.acquire() as conn:
        report = await reconcile.reconcile(conn, gone, who="r", escalate_after_s=3600, settle_s=0)
    assert report.resolved == ()
    assert [(e.job_id, why) for e, why in report.left] == [(lease.job_id, Left.LOOKUP_UNAVAILABLE)]
    assert await p.state(lease.job_id) == "unknown"


async def test_a_provider_that_gives_no_answer_exits_1_naming_only_the_error_s_type(
    principals: Principals, ledger_env: dict[str, str]
) -> None:
    """`accord reconcile` against a provider nobody answers for: the effect stays unknown
    (why=lookup_unavailable) and the pass exits 1, so a scheduler can tell it from a pass
    where every provider asked answered (exit 0, the test below); the log names the error's
    type, not its text."""
    p = principals
    await p.submit("a")
    lease = await p.claim_one()
    await p.store.begin_effect(lease, DEMO_KEY, "intent")
    await gave_up(p, lease, DEMO_KEY)
    done = await anyio.run_process(
        [sys.executable, "-m", "accord", "reconcile", "--settle-s", "0"],
        env={
            **ledger_env,
            "ACCORD_APP": "accord.demo:app",
            "ACCORD_PG_DSN": p.dsn,
            "ACCORD_DEMO_PROVIDER_URL": "http://127.0.0.1:9",
        },
        check=False,
    )
    assert done.returncode == 1, done.stderr
    out, err = done.stdout.decode(), done.stderr.decode()
    assert f"left job={lease.job_id} key={DEMO_KEY} seq=1 why=lookup_unavailable" in out
    assert "gave no answer" in err and "OSError" not in err  # its text named the cause
    assert await p.state(lease.job_id) == "unknown"


async def test_without_a_lookup_it_stays_unknown_and_escalates_by_age(
    principals: Principals, ledger_env: dict[str, str]
) -> None:
    p = principals
    lease = await never_sent(p, "a")
    async with p.repair.acquire() as conn:
        young = await reconcile.reconcile(conn, None, who="r", escalate_after_s=3600)
        assert young.escalated == ()  # control: younger than the configured age
        assert [why for _, why in young.left] == [Left.NO_LOOKUP]
    done = await anyio.run_process(
        [sys.executable, "-m", "accord", "reconcile", "--escalate-after-s", "0"],
        env={
            **ledger_env,
            "ACCORD_APP": "accord.demo:app",
            "ACCORD_PG_DSN": p.dsn,
            "ACCORD_DEMO_PROVIDER_URL": "http://127.0.0.1:9",
        },
        check=False,
    )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    assert f"escalated job={lease.job_id} key={KEY} seq=1" in out
    assert "resolved=0 resumed=0 left=1 escalated=1" in out
    async with p.repair.acquire() as conn:
        [row] = await conn.fetch("SELECT state, escalated_at FROM jobs.reconciliation")
        assert row["state"] == "unknown" and row["escalated_at"] is not None
        again = await reconcile.reconcile(conn, None, who="r", escalate_after_s=0)
        assert again.escalated == ()  # escalated once
    assert await p.state(lease.job_id) == "unknown"  # never resolved by time
    assert (await p.store.job(lease.job_id)).needs_reconciliation


@pytest.fixture
def ledger_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ACCORD_LEDGER_PATH": str(tmp_path / "ledger")}
