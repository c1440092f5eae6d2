"""The jobs module's "why it waits" (jobs.waiting, next to jobs.claim) agrees with the claim.

For a seeded mix (every reason accord status reports, plus a job blocked by a succeeded
effect and one whose effect failed before dispatch), the next claim of each class by its
registered owner takes exactly the jobs the view calls claimable, and none it calls blocked.
"""

from __future__ import annotations

from collections import defaultdict

import asyncpg
import pytest

from accord.jobs import EffectState, Store, WorkflowNotRegistered
from tests.integration.ops.seed import ACME, DIGEST, MISC, REPORT, Expected, Seeder, seed_jobs

OWNERS = {REPORT: "w-report", DIGEST: "w-digest"}


async def test_the_view_says_what_the_next_claim_takes(pg_dsn: str) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    try:
        s = Seeder(pool)
        await s.store.register_workflow(REPORT, "w-report", effects_enabled=True)
        # Two of its own first, each claimed while only it is due (as seed_jobs does), then
        # parked in the future while seed_jobs claims its own.
        blocked = await s.submit(ACME, REPORT, "r-done-effect")
        lease = await s.claim(REPORT, "w-report")
        await s.store.begin_effect(lease, "charge", "intent-b")
        await s.store.finish_effect(lease, "charge", EffectState.SUCCEEDED, receipt="rcpt-1")
        assert await s.store.fail(lease, "after the effect", retry=True) == "unknown"
        # Test-only direct write: queued beside a succeeded effect that no resume covers
        # (what a bypassed repair would leave); the claim must still skip it.
        await pool.execute(
            "UPDATE jobs.jobs SET state = 'queued', run_after = now() + interval '1 day'"
            " WHERE job_id = $1",
            blocked,
        )
        retryable = await s.submit(ACME, REPORT, "r-not-sent")
        lease = await s.claim(REPORT, "w-report")
        await s.store.begin_effect(lease, "charge", "intent-c")
        await s.store.finish_effect(lease, "charge", EffectState.FAILED_BEFORE_DISPATCH)
        assert await s.store.fail(lease, "refused", retry=True) == "queued"  # long backoff
        await seed_jobs(s, Expected())
        await pool.execute(
            "UPDATE jobs.jobs SET run_after = now() WHERE job_id = ANY($1::bigint[])",
            [blocked, retryable],
        )

        rows = await pool.fetch(
            "SELECT job_id, workflow, state, claimable, reason FROM jobs.waiting"
        )
        claimable: dict[str, set[int]] = defaultdict(set)
        queued_blocked: dict[str, set[int]] = defaultdict(set)
        for r in rows:
            if r["claimable"]:
                claimable[r["workflow"]].add(r["job_id"])
            elif r["state"] == "queued":
                queued_blocked[r["workflow"]].add(r["job_id"])
        by_id = {r["job_id"]: r["reason"] for r in rows}
        # the mix covers both sides, with the reasons status gives
        assert by_id[blocked] == "blocked_by_effect" and blocked in queued_blocked[REPORT]
        assert retryable in claimable[REPORT]
        assert {by_id[j] for w in claimable for j in claimable[w]} >= {
            "workers_busy", "no_live_worker",
        }  # fmt: skip
        assert {by_id[j] for w in queued_blocked for j in queued_blocked[w]} >= {
            "backoff", "tenant_frozen", "unregistered_workflow", "blocked_by_effect",
            "effects_disabled",  # refused for effects disabled: it waits, unclaimed
        }  # fmt: skip

        store = Store(pool)
        for workflow, owner in OWNERS.items():
            taken = {
                lease.job_id for lease in await store.claim(workflow, owner, lease_s=60, limit=1000)
            }
            assert taken == claimable[workflow], workflow
            assert not taken & queued_blocked[workflow]
        # an unregistered class: its job waits, and no claim can take it
        assert not claimable[MISC] and queued_blocked[MISC]
        with pytest.raises(WorkflowNotRegistered):
            await store.claim(MISC, "anyone", lease_s=60, limit=1000)
    finally:
        await pool.close()
