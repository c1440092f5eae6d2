"""A seeded mix of states, built through the real stores (SQL only where noted), and the
figures expected for it, written down by hand from the seeding steps (not re-derived by the
queries under test)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from accord.consumers import Consumer, Delivery, InboxOutcome, record_delivery
from accord.consumers.poison import PoisonReason, PoisonRecord, body_fingerprint, record_poison
from accord.demo.catalog import demo_catalog
from accord.jobs import EffectState, Lease, Store, submit
from accord.schemas.events import Event
from tests.support import enqueue

#: Put into every payload, error text and poison detail: must never reach status or metrics.
SECRET = "SECRET-7f3a-do-not-print"
ACME, GLOBEX, INITECH = "acme", "globex", "initech"
REPORT, DIGEST, MISC, HOLD = "report", "digest", "misc", "hold"


@dataclass
class Expected:
    """Hand-computed figures of the seeded mix."""

    jobs: dict[tuple[str, str, str], int] = field(default_factory=dict)
    attempts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    rescued: dict[tuple[str, str, str], int] = field(default_factory=dict)
    waiting: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    effects: dict[tuple[str, str, str, str], tuple[int, int]] = field(default_factory=dict)
    tenants: dict[str, tuple[int, bool, int, int | None]] = field(default_factory=dict)
    relay_pending: int = 0
    relay_held: int = 0
    deliveries: dict[tuple[str, str, str], int] = field(default_factory=dict)
    poison: dict[tuple[str, str], int] = field(default_factory=dict)
    refusals: dict[tuple[str, str], int] = field(default_factory=dict)


class Seeder:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        # A long backoff: a retried job stays visibly "backing off" during the test.
        self.store = Store(pool, backoff_base_s=3600.0)

    async def submit(self, tenant: str, workflow: str, op: str, max_attempts: int = 5) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            done = await submit(
                conn, tenant=tenant, workflow=workflow, operation_id=op, digest=f"d-{op}",
                payload={"subject": SECRET}, max_attempts=max_attempts,
            )  # fmt: skip
        return done.job_id

    async def claim(self, workflow: str, owner: str, lease_s: float = 600.0) -> Lease:
        leases = await self.store.claim(workflow, owner, lease_s=lease_s)
        assert len(leases) == 1, leases
        return leases[0]

    async def expire(self, job_id: int) -> None:
        """Test-only direct write: the lease ran out (no sleeping)."""
        await self.pool.execute(
            "UPDATE jobs.jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE job_id = $1 AND state = 'running'",
            job_id,
        )


async def seed_jobs(s: Seeder, e: Expected) -> None:
    """Jobs in every reported state; each claim happens while only its job is due."""
    await s.store.register_workflow(REPORT, "w-report", effects_enabled=True)
    await s.store.register_workflow(DIGEST, "w-digest", effects_enabled=False)

    # Rescued once, now backing off (digest).
    rescued = await s.submit(ACME, DIGEST, "d-rescued")
    await s.expire((await s.claim(DIGEST, "w-digest")).job_id)
    assert [r.job_id for r in (await s.store.rescue()).rescued] == [rescued]
    # Running with an expired lease: awaiting rescue (digest has no live lease).
    await s.submit(ACME, DIGEST, "d-expired")
    await s.expire((await s.claim(DIGEST, "w-digest")).job_id)
    # An unknown job: an effect pending when the worker gave up.
    await s.submit(ACME, REPORT, "r-unknown")
    lease = await s.claim(REPORT, "w-report")
    await s.store.begin_effect(lease, "charge", "intent-1")
    assert await s.store.fail(lease, f"gave up {SECRET}", retry=True) == "unknown"
    # The unknown effect on a canceled job.
    canceled = await s.submit(ACME, REPORT, "r-cancel")
    lease = await s.claim(REPORT, "w-report")
    await s.store.begin_effect(lease, "charge", "intent-2")
    await s.store.finish_effect(lease, "charge", EffectState.UNKNOWN)
    assert (await s.store.cancel(canceled, reason="operator")).unresolved_effects
    # Poison: attempts used up.
    await s.submit(ACME, REPORT, "r-poison", max_attempts=1)
    assert await s.store.fail(await s.claim(REPORT, "w-report"), "x", retry=True) == "poison"
    # A healthy retry, backing off.
    await s.submit(ACME, REPORT, "r-retry")
    assert await s.store.fail(await s.claim(REPORT, "w-report"), "x", retry=True) == "queued"
    # Running with a live lease: the report class has a worker.
    await s.submit(ACME, REPORT, "r-running")
    await s.claim(REPORT, "w-report")
    # Due work the report class's (busy) workers have not reached; digest has no live worker.
    await s.submit(ACME, REPORT, "r-wait-1")
    await s.submit(ACME, REPORT, "r-wait-2")
    await s.submit(ACME, DIGEST, "d-wait")
    # The worker's typed refusal when effects are off (a direct write of what jobs.fail leaves:
    # its last_error, and the job parked out of the claim's range, 0038).
    job = await s.submit(ACME, DIGEST, "d-noeffects")
    await s.pool.execute(
        "UPDATE jobs.jobs SET last_error = 'effects_disabled', run_after = 'infinity'"
        " WHERE job_id = $1",
        job,
    )
    # Missing authority: a frozen tenant; configuration: an unregistered class.
    await s.submit(GLOBEX, REPORT, "g-frozen")
    await s.store.freeze(GLOBEX)
    await s.submit(ACME, MISC, "m-1")
    await seed_held(s)
    await seed_escalation(s)

    e.jobs = {
        ("running", ACME, DIGEST): 1, ("running", ACME, REPORT): 1,
        ("unknown", ACME, REPORT): 1, ("canceled", ACME, REPORT): 1,
        ("poison", ACME, REPORT): 1, ("queued", ACME, REPORT): 3,
        ("queued", ACME, DIGEST): 3, ("queued", GLOBEX, REPORT): 1,
        ("queued", ACME, MISC): 1, ("held", INITECH, HOLD): 2,
    }  # fmt: skip
    e.attempts = {k: 0 for k in e.jobs} | {
        ("running", ACME, DIGEST): 1, ("running", ACME, REPORT): 1,
        ("unknown", ACME, REPORT): 1, ("canceled", ACME, REPORT): 1,
        ("poison", ACME, REPORT): 1, ("queued", ACME, REPORT): 1,
        ("queued", ACME, DIGEST): 1, ("held", INITECH, HOLD): 1,
    }  # fmt: skip
    e.rescued = {k: 0 for k in e.jobs} | {("queued", ACME, DIGEST): 1}
    e.waiting = {
        ("unresolved_effect", "unknown", ACME, REPORT): 1,
        ("unresolved_effect", "canceled", ACME, REPORT): 1,
        ("backoff", "queued", ACME, REPORT): 1,
        ("workers_busy", "queued", ACME, REPORT): 2,
        ("lease_expired", "running", ACME, DIGEST): 1,
        ("backoff", "queued", ACME, DIGEST): 1,
        ("no_live_worker", "queued", ACME, DIGEST): 1,
        ("effects_disabled", "queued", ACME, DIGEST): 1,
        ("tenant_frozen", "queued", GLOBEX, REPORT): 1,
        ("unregistered_workflow", "queued", ACME, MISC): 1,
        ("held", "held", INITECH, HOLD): 2,
    }
    # (effects, escalated) by (tenant, workflow, effect state, job state)
    e.effects = {
        (ACME, REPORT, "pending", "unknown"): (1, 1),
        (ACME, REPORT, "unknown", "canceled"): (1, 1),
    }
    # (epoch, frozen, held, restore ledger epoch) by tenant
    e.tenants = {
        ACME: (1, False, 0, None), GLOBEX: (1, True, 0, None), INITECH: (1, True, 2, 3),
    }  # fmt: skip


async def seed_held(s: Seeder) -> None:
    """Work held under an old epoch: the ledger says epoch 3 while the database is at 1 (a
    restore), so authority_hold freezes the tenant and holds its running and queued work."""
    await s.store.register_workflow(HOLD, "w-hold")
    await s.submit(INITECH, HOLD, "i-running")
    await s.claim(HOLD, "w-hold")
    await s.submit(INITECH, HOLD, "i-queued")
    held = await s.pool.fetchrow("SELECT * FROM jobs.authority_hold($1, 3)", INITECH)
    assert (held["db_epoch"], held["held_jobs"]) == (1, 2)


async def seed_escalation(s: Seeder) -> None:
    """Escalate every effect awaiting reconciliation (the unknown job's pending effect and
    the canceled job's unknown one)."""
    escalated = await s.pool.fetch("SELECT * FROM jobs.repair_escalate(0, 100)")
    assert len(escalated) == 2


def _event(n: int, tenant: str = ACME) -> Event:
    return Event(
        tenant=tenant, operation_id=f"op-{n}", type="report.accepted", version=1,
        payload={"report_id": f"r{n}", "subject": SECRET},
    )  # fmt: skip


async def seed_delivery(pool: asyncpg.Pool, e: Expected) -> None:
    """Relay lag (two unpublished rows), a held row, inbox decisions, poison, a refusal."""
    async with pool.acquire() as conn:
        for n in range(3):
            async with conn.transaction():
                await enqueue(conn, _event(n))
        await conn.execute(
            "UPDATE relay.outbox SET state = 'held', last_reason = 'unroutable'"
            " WHERE operation_id = 'op-2'"
        )
        consumer = Consumer(REPORT, demo_catalog(), 3600.0)
        async with conn.transaction():
            for n, outcome in ((0, "new"), (0, "duplicate"), (1, "conflict")):
                await record_delivery(
                    conn, consumer, _event(n), Delivery(redelivered=n == 0), InboxOutcome(outcome)
                )
            for reason in (PoisonReason.CONFLICT, PoisonReason.MALFORMED_JSON):
                await record_poison(conn, _poison(reason))
        run = await conn.fetchval(
            "INSERT INTO ops.replay_runs (workflow, since) VALUES ('report_projection', now())"
            " RETURNING run_id"
        )
        await conn.execute(
            "INSERT INTO ops.replay_refusals (run_id, workflow, tenant, operation_id, event_id,"
            " event_type, outbox_id, reason, sqlstate, message) VALUES ($1, 'report_projection',"
            " 'acme', 'op-9', $2, 'report.published.v1', 1, 'insufficient_privilege', '42501',"
            " 'permission denied for schema jobs')",
            run,
            uuid.uuid4(),
        )
    e.relay_pending, e.relay_held = 2, 1
    e.deliveries = {(REPORT, ACME, "new"): 1, (REPORT, ACME, "duplicate"): 1,
                    (REPORT, ACME, "conflict"): 1}  # fmt: skip
    e.poison = {(REPORT, "conflict"): 1, (REPORT, "malformed_json"): 1}
    e.refusals = {("report_projection", "insufficient_privilege"): 1}


def _poison(reason: PoisonReason) -> PoisonRecord:
    body = json.dumps({"subject": SECRET}).encode()
    size, sha = body_fingerprint(body)
    return PoisonRecord(
        consumer=REPORT, queue="q.report", reason=reason, detail={"note": SECRET},
        headers={"ce-tenantid": ACME}, body_size=size, body_sha256=sha, tenant=ACME,
    )  # fmt: skip


async def seed_all(pool: asyncpg.Pool) -> Expected:
    expected = Expected()
    await seed_jobs(Seeder(pool), expected)
    await seed_delivery(pool, expected)
    return expected


def as_counts(rows: Any, key: Any, value: str) -> dict[Any, int]:
    """Group rows of the report into {key: value} (for comparison with Expected)."""
    return {key(r): getattr(r, value) for r in rows}
