"""The jobs schema and its SQL agree with the code: enums, statements, indexes, guards."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg
import pytest

from accord.jobs import Store, retention, sql
from accord.jobs.errors import WorkflowNotDrained
from accord.jobs.models import EffectState, JobState
from tests.support import filtered_out, logged_plans


async def check_values(pg: asyncpg.Connection, constraint: str) -> set[str]:
    definition = await pg.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1", constraint
    )
    assert definition is not None, constraint
    return set(re.findall(r"'([a-z_]+)'::text", definition))


async def test_job_state_enum_mirrors_the_check(pg: asyncpg.Connection) -> None:
    assert await check_values(pg, "jobs_state_check") == {s.value for s in JobState}


async def test_effect_state_enum_mirrors_the_check(pg: asyncpg.Connection) -> None:
    assert await check_values(pg, "effects_state_check") == {s.value for s in EffectState}


def statements() -> list[tuple[str, str]]:
    return [
        (name, value)
        for name, value in vars(sql).items()
        if name.isupper() and isinstance(value, str)
    ]


@pytest.mark.parametrize(("name", "statement"), statements(), ids=[n for n, _ in statements()])
async def test_every_statement_prepares(pg: asyncpg.Connection, name: str, statement: str) -> None:
    await pg.prepare(statement)


async def finished_jobs(pg: asyncpg.Connection, n: int) -> None:
    """``n`` succeeded jobs of tenant acme over workflows w0..w19, in one statement."""
    await pg.execute(
        "WITH o AS (INSERT INTO jobs.operations (tenant, workflow, operation_id, job_id)"
        " SELECT 'acme', 'w' || (i % 20), 'done' || i, nextval('jobs.jobs_job_id_seq')"
        " FROM generate_series(1, $1) i RETURNING *)"
        " INSERT INTO jobs.jobs (job_id, tenant, workflow, operation_id, digest, state)"
        " OVERRIDING SYSTEM VALUE"
        " SELECT job_id, tenant, workflow, operation_id, 'd', 'succeeded' FROM o",
        n,
    )


async def test_claim_uses_its_partial_index(pg: asyncpg.Connection) -> None:
    # Enough rows that the planner would not pick a sequential scan for a good reason.
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    await finished_jobs(pg, 20000)
    await pg.execute("ANALYZE jobs.jobs")
    plan = "\n".join(
        row[0]
        for row in await pg.fetch(
            "EXPLAIN SELECT j.job_id FROM jobs.jobs j WHERE j.workflow = $1"
            " AND j.state = 'queued' AND j.run_after <= now() ORDER BY j.run_after, j.job_id"
            " LIMIT 10 FOR NO KEY UPDATE OF j SKIP LOCKED",
            "w1",
        )
    )
    assert "jobs_claimable_idx" in plan, plan
    rescue_plan = "\n".join(
        row[0]
        for row in await pg.fetch(
            "EXPLAIN SELECT job_id FROM jobs.jobs WHERE state = 'running'"
            " ORDER BY lease_expires_at LIMIT 10"
        )
    )
    assert "jobs_running_idx" in rescue_plan, rescue_plan


async def test_the_operation_key_holds_one_job_per_operation(pg: asyncpg.Connection) -> None:
    """jobs.operations is the idempotency key (0011); the foreign key ties each job to the
    one operation row naming it."""
    # control: submit writes the operation row and the job row, and they agree
    job_id = await pg.fetchval("SELECT job_id FROM jobs.submit('acme', 'w', 'op', 'd', '{}', 5)")
    key = await pg.fetchrow("SELECT * FROM jobs.operations WHERE job_id = $1", job_id)
    assert dict(key) == {"tenant": "acme", "workflow": "w", "operation_id": "op", "job_id": job_id}

    insert_job = (
        "INSERT INTO jobs.jobs (job_id, tenant, workflow, operation_id, digest)"
        " OVERRIDING SYSTEM VALUE VALUES ($1, 'acme', 'w', $2, 'd')"
    )
    # a second job for the same operation: its operation row is refused
    with pytest.raises(asyncpg.UniqueViolationError, match="operations_pkey"):
        await pg.execute(
            "INSERT INTO jobs.operations VALUES"
            " ('acme', 'w', 'op', nextval('jobs.jobs_job_id_seq'))"
        )
    # a job that borrows another job's operation row, or has none, is refused
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="jobs_operation_fkey"):
        await pg.execute(insert_job, job_id + 1000, "op")
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="jobs_operation_fkey"):
        await pg.execute(insert_job, job_id + 1000, "other")
    # and a job's copy of its key cannot be changed away from its operation row
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="jobs_operation_fkey"):
        await pg.execute("UPDATE jobs.jobs SET operation_id = 'other' WHERE job_id = $1", job_id)
    # a key row whose job never comes is refused when its transaction commits
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="operations_job_fkey"):
        await pg.execute(
            "INSERT INTO jobs.operations VALUES"
            " ('acme', 'w', 'lonely', nextval('jobs.jobs_job_id_seq'))"
        )
    # the non-empty checks moved with the key
    with pytest.raises(asyncpg.CheckViolationError, match="operations_operation_id_check"):
        await pg.fetchval("SELECT job_id FROM jobs.submit('acme', 'w', '', 'd', '{}', 5)")
    assert await pg.fetchval("SELECT count(*) FROM jobs.jobs") == 1
    # emptying the jobs empties their keys too, so a resubmit makes a new job
    await pg.execute("TRUNCATE jobs.jobs CASCADE")
    assert await pg.fetchval("SELECT count(*) FROM jobs.operations") == 0
    again = await pg.fetchrow("SELECT * FROM jobs.submit('acme', 'w', 'op', 'd', '{}', 5)")
    assert again["created"] and again["job_id"] != job_id


async def noop(tx: asyncpg.Connection) -> None:
    return None


@pytest.mark.parametrize("plan_cache_mode", ["force_generic_plan", "force_custom_plan"])
async def test_write_backs_find_their_job_by_primary_key_under_stale_statistics(
    pg: asyncpg.Connection, plan_cache_mode: str
) -> None:
    """Statistics taken while nothing ran (a backlog, then ANALYZE) make jobs_running_idx
    look empty. A write-back that addresses its job by id must still be planned on the
    primary key, not as a scan of every running job (migration 0011)."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    await finished_jobs(pg, 20000)
    store = Store(pg, backoff_base_s=0.0)
    await store.register_workflow("w", "o")
    async with pg.transaction():
        await pg.executemany(
            sql.SUBMIT, [("acme", "w", f"op{i}", "d", "{}", 5) for i in range(300)]
        )
    await pg.execute("ANALYZE jobs.jobs")
    leases = await store.claim("w", "o", lease_s=60, limit=300)
    assert len(leases) == 300
    await pg.execute(f"SET plan_cache_mode = {plan_cache_mode}")

    # Control: the spelling before 0011 (the job's id beside state = 'running') is planned on
    # the running index under these statistics, so this fixture does show the hazard.
    control = "\n".join(
        row[0]
        for row in await pg.fetch(
            "EXPLAIN UPDATE jobs.jobs j SET updated_at = now()"
            " WHERE j.job_id = $1 AND j.state = 'running'",
            leases[0].job_id,
        )
    )
    assert "jobs_running_idx" in control, control

    await pg.execute(
        "UPDATE jobs.jobs SET lease_expires_at = now() - interval '1 second' WHERE job_id = $1",
        leases[9].job_id,
    )
    async with logged_plans(pg) as plans:
        await store.renew(leases[0], 60)
        await store.fail(leases[1], "gave up", retry=True)
        await store.publish(leases[2])
        await store.publish(leases[3], noop)
        done = await store.publish_many(leases[4:9])
        rescued = await store.rescue(limit=10)
    assert len(done.published) == 5
    assert [r.job_id for r in rescued.rescued] == [leases[9].job_id]

    updates = [p for p in plans if "Update on jobs j" in p]
    # renew, fail, two publishes, one batch, rescue's re-check: one UPDATE of job rows each
    assert len(updates) == 6, plans
    for plan in updates:
        assert "jobs_pkey" in plan and "jobs_running_idx" not in plan, plan


# jobs.prune's re-check of its locked candidates as 0031 spelled it (the conditions that
# match jobs_prunable_idx's predicate), for the control below.
RECHECK_BEFORE_0033 = (
    "SELECT array_agg(j.job_id) FROM jobs.jobs j WHERE j.job_id = ANY ($1::bigint[])"
    " AND j.state IN ('succeeded', 'failed', 'canceled') AND j.unresolved_effects = 0"
    " AND j.updated_at < $2::timestamptz"
    " AND NOT EXISTS (SELECT 1 FROM jobs.effects e WHERE e.job_id = j.job_id"
    " AND (e.state IN ('pending', 'unknown') OR e.finished_at >= $2::timestamptz))"
)


async def test_each_prune_batch_reads_its_batch_not_the_whole_backlog(
    pg: asyncpg.Connection,
) -> None:
    """Statistics taken while few jobs were prunable (a service just configured retention),
    then 20,000 jobs past it: each batch of 100 reads about 100 jobs, in both its steps, so
    draining the backlog costs its length, not its square (0033). Control: the re-check as
    0031 spelled it, planned generically as PL/pgSQL plans it, reads every prunable job."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    await pg.executemany(sql.SUBMIT, [("acme", "w", f"op{i}", "d", "{}", 5) for i in range(200)])
    await pg.execute("ANALYZE jobs.jobs, jobs.effects")
    await finished_jobs(pg, 20000)
    await pg.execute("UPDATE jobs.jobs SET updated_at = now() - interval '30 days'")

    ids = [
        r[0]
        for r in await pg.fetch(
            "SELECT job_id FROM jobs.jobs WHERE state = 'succeeded' ORDER BY job_id LIMIT 100"
        )
    ]
    await pg.execute("SET plan_cache_mode = force_generic_plan")
    control = "\n".join(
        r[0]
        for r in await pg.fetch(
            f"EXPLAIN (ANALYZE, COSTS OFF) {RECHECK_BEFORE_0033}", ids, datetime.now(UTC)
        )
    )
    await pg.execute("RESET plan_cache_mode")
    assert re.search(r"Rows Removed by Filter: 19\d\d\d", control), control

    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        async with pg.transaction():
            pruned = await retention.prune(
                pg, retention_s=86400.0, audit_retention_s=86400.0, limit=100
            )
    assert pruned.jobs == 100
    scans = [
        line
        for plan in plans
        for line in plan.splitlines()
        if re.search(r"Scan.* on (jobs|effects)\b", line)
    ]
    assert scans, plans
    for plan in plans:
        assert all(n <= 100 for n in filtered_out(plan)), plan
        for rows, loops in re.findall(r"on jobs j .*actual time=\S+ rows=(\d+) loops=(\d+)", plan):
            assert int(rows) * int(loops) <= 100, plan


BACKLOG = 3000  # unknown effects of other jobs, awaiting reconciliation


def effect_scans(plans: list[str]) -> list[str]:
    """The plan lines that read jobs.effects, each with the two after it (its conditions)."""
    found = []
    for plan in plans:
        lines = plan.splitlines()
        for i, line in enumerate(lines):
            if re.search(r"Scan.* on effects\b|Scan using effects_", line):
                found.append("\n".join(lines[i : i + 3]))
    return found


@pytest.mark.parametrize("plan_cache_mode", ["force_generic_plan", "force_custom_plan"])
async def test_a_job_s_effect_calls_read_its_own_effects_not_the_reconciliation_backlog(
    pg: asyncpg.Connection, plan_cache_mode: str
) -> None:
    """Statistics taken while effects were resolved as fast as they began make the
    unresolved ones look rare; then 3,000 effects of other jobs wait for reconciliation
    (unknown). A job's begin, finish, publish and the next claim ask about their job's own
    unresolved effects: by job, through effects_job_unresolved_idx (0032), they read its few
    rows. Control: without it, effects_unresolved_idx (by age) is the index matching their
    predicate, and finish_effect reads the whole backlog to find its row."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    store = Store(pg, backoff_base_s=0.0)
    await store.register_workflow("w", "o", effects_enabled=True)
    async with pg.transaction():
        await pg.executemany(
            sql.SUBMIT, [("acme", "w", f"op{i}", "d", "{}", 5) for i in range(BACKLOG + 210)]
        )
    leases = await store.claim("w", "o", lease_s=600, limit=BACKLOG + 200)
    warm, stuck, mine = leases[:200], leases[200:-1], leases[-1]
    for lease in warm:
        await store.begin_effect(lease, "k", "d")
        await store.finish_effect(lease, "k", EffectState.SUCCEEDED, receipt="r")
    await pg.execute("ANALYZE jobs.effects, jobs.jobs")
    await pg.execute(
        "INSERT INTO jobs.effects (tenant, job_id, effect_key, seq, intent_digest, state,"
        " attempt_id, generation) SELECT 'acme', job_id, 'k', 1, 'd', 'unknown', attempt_id,"
        " generation FROM jobs.jobs WHERE job_id = ANY($1::bigint[])",
        [lease.job_id for lease in stuck],
    )
    await pg.execute(f"SET plan_cache_mode = {plan_cache_mode}")

    control = pg.transaction()
    await control.start()
    await pg.execute("DROP INDEX jobs.effects_job_unresolved_idx")
    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        await store.begin_effect(mine, "k", "d")
        await store.finish_effect(mine, "k", EffectState.SUCCEEDED, receipt="r")
    await control.rollback()
    walked = [s for s in effect_scans(plans) if "effects_unresolved_idx" in s]
    assert any(n >= BACKLOG - 1 for s in walked for n in filtered_out(s)), plans

    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        await store.begin_effect(mine, "k", "d")
        await store.finish_effect(mine, "k", EffectState.SUCCEEDED, receipt="r")
        await store.publish(mine, noop)
        assert await store.claim("w", "o", lease_s=60, limit=10) != []  # the last ten
    scans = effect_scans(plans)
    assert scans, plans
    for scan in scans:
        assert "effects_unresolved_idx" not in scan and "Seq Scan" not in scan, scan
        assert all(n <= 1 for n in filtered_out(scan)), scan
    assert await pg.fetchval("SELECT state FROM jobs.jobs WHERE job_id = $1", mine.job_id) == (
        "succeeded"
    )


CLAIM_FUNCTION = "jobs.claim(text, text, double precision, integer)"
SUCCEED_MANY_FUNCTION = (
    "jobs.succeed_many(bigint[], text[], text[], text[], text[], uuid[], bigint[], bigint[])"
)


async def claim_then_publish_batch(pg: asyncpg.Connection, store: Store) -> tuple[str, str]:
    """One claim of ten and its batch publish; the plans of their job-row UPDATEs."""
    async with logged_plans(pg) as plans:
        leases = await store.claim("w", "o", lease_s=60, limit=10)
        done = await store.publish_many(leases)
    assert len(leases) == 10 and len(done.published) == 10
    updates = [p for p in plans if "Update on jobs j" in p]
    assert len(updates) == 2, plans
    return updates[0], updates[1]


@pytest.mark.parametrize("statistics", ["fresh", "stale"])
async def test_claim_and_batch_publish_keep_one_generic_plan(
    pg: asyncpg.Connection, statistics: str
) -> None:
    """0012: jobs.claim and jobs.succeed_many run their generic plans from the first call
    (no planning per call), and those plans reach job rows only through the claim's partial
    index and the primary key, under fresh statistics and under statistics taken before the
    backlog arrived. Control (fresh statistics of a backlog, where the cost test rejects the
    generic plans): without 0012's setting, the seventh call of each is still planned anew
    for its values."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    store = Store(pg)
    await store.register_workflow("w", "o")
    if statistics == "stale":
        await finished_jobs(pg, 20000)
        await pg.execute("ANALYZE jobs.jobs")
    async with pg.transaction():
        await pg.executemany(
            sql.SUBMIT, [("acme", "w", f"op{i}", "d", "{}", 5) for i in range(2000)]
        )
    if statistics == "fresh":
        await pg.execute("ANALYZE jobs.jobs")

    claim, batch = await claim_then_publish_batch(pg, store)
    assert "(workflow = $1)" in claim and "jobs_claimable_idx" in claim, claim
    assert "jobs_pkey" in claim and "Seq Scan on jobs" not in claim, claim
    assert "ANY ($1)" in batch and "jobs_pkey" in batch, batch
    assert "Seq Scan on jobs" not in batch and "jobs_running_idx" not in batch, batch

    if statistics == "stale":
        return
    # Control: the same functions without the setting. PL/pgSQL's first five executions are
    # custom plans in any case; over a backlog these two never switch to the generic plan.
    await pg.execute(f"ALTER FUNCTION {CLAIM_FUNCTION} RESET plan_cache_mode")
    await pg.execute(f"ALTER FUNCTION {SUCCEED_MANY_FUNCTION} RESET plan_cache_mode")
    for _ in range(6):
        await store.publish_many(await store.claim("w", "o", lease_s=60, limit=10))
    claim, batch = await claim_then_publish_batch(pg, store)
    assert "(workflow = 'w'::text)" in claim, claim
    assert "ANY ('{" in batch, batch


@pytest.mark.parametrize("setting", ["shipped", "control"])
async def test_claim_and_batch_publish_plans_cached_on_a_small_table_never_scan_it(
    pg: asyncpg.Connection, pg_dsn: str, setting: str
) -> None:
    """A worker's session caches the generic plans of jobs.claim and jobs.succeed_many at its
    first calls (0012), when jobs.jobs may be nearly empty (a new deployment); nothing plans
    them again until the table is analyzed. 20,000 jobs later, they must still reach job rows
    by index, never by reading the table (0033: enable_seqscan off in both). Control: without
    that setting, the plans cached on the small table scan all of it on every call."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    store = Store(pg)
    await store.register_workflow("w", "o")
    if setting == "control":
        await pg.execute(f"ALTER FUNCTION {CLAIM_FUNCTION} RESET enable_seqscan")
        await pg.execute(f"ALTER FUNCTION {SUCCEED_MANY_FUNCTION} RESET enable_seqscan")
    await pg.executemany(sql.SUBMIT, [("acme", "w", f"first{i}", "d", "{}", 5) for i in range(10)])
    await claim_then_publish_batch(pg, store)  # the plans are cached now, on 10 rows
    other = await asyncpg.connect(pg_dsn)
    try:
        await finished_jobs(other, 20000)
        await other.executemany(
            sql.SUBMIT, [("acme", "w", f"op{i}", "d", "{}", 5) for i in range(10)]
        )  # the claimable jobs now lie after the history, as a running service's do
    finally:
        await other.close()
    await pg.execute("LOAD 'auto_explain'; SET auto_explain.log_analyze = on")
    claim, batch = await claim_then_publish_batch(pg, store)
    scans = [p for p in (claim, batch) if "Seq Scan on jobs" in p]
    if setting == "control":
        assert len(scans) == 2, (claim, batch)
        assert all(re.search(r"Rows Removed by Filter: 20\d\d\d", p) for p in scans), scans
    else:
        assert scans == [], (claim, batch)
        assert "jobs_pkey" in claim and "jobs_pkey" in batch, (claim, batch)


async def test_a_finished_effect_outcome_never_changes(pg: asyncpg.Connection) -> None:
    job_id = await pg.fetchval("SELECT job_id FROM jobs.submit('acme', 'w', 'op', 'd', '{}', 5)")
    await pg.execute(
        "INSERT INTO jobs.effects (tenant, job_id, effect_key, seq, intent_digest, attempt_id,"
        " generation) VALUES ('acme', $1, 'k', 1, 'i', gen_random_uuid(), 1)",
        job_id,
    )
    # control: pending -> succeeded is the allowed transition
    await pg.execute("UPDATE jobs.effects SET state = 'succeeded' WHERE job_id = $1", job_id)
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never changes"):
        await pg.execute("UPDATE jobs.effects SET state = 'unknown' WHERE job_id = $1", job_id)
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never deleted"):
        await pg.execute("DELETE FROM jobs.effects WHERE job_id = $1", job_id)
    assert await pg.fetchval("SELECT state FROM jobs.effects WHERE job_id = $1", job_id) == (
        "succeeded"
    )


async def test_the_claim_never_reads_jobs_waiting_for_their_run_after(
    pg: asyncpg.Connection,
) -> None:
    """20,000 queued jobs whose run_after is an hour away, and 5 due: the claim's scan of
    jobs_claimable_idx returns the 5 and reads none of the others (its range stops at
    now()). Control: the same eligibility walked in job_id order reads every waiting job."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    store = Store(pg, backoff_base_s=0.0)
    await store.register_workflow("w", "o")
    async with pg.transaction():
        await pg.executemany(
            sql.SUBMIT, [("acme", "w", f"later{i}", "d", "{}", 5) for i in range(20000)]
        )
    await pg.execute("UPDATE jobs.jobs SET run_after = now() + interval '1 hour'")
    async with pg.transaction():
        await pg.executemany(sql.SUBMIT, [("acme", "w", f"due{i}", "d", "{}", 5) for i in range(5)])
    await pg.execute("ANALYZE jobs.jobs")
    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        leases = await store.claim("w", "o", lease_s=60, limit=50)
        async with pg.transaction():
            await pg.execute(
                "SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off;"
                " SET LOCAL enable_bitmapscan = off"
            )
            control = await pg.fetchval(
                "SELECT count(*) FROM (SELECT job_id FROM jobs.jobs WHERE workflow = 'w'"
                " AND state = 'queued' AND run_after <= now() ORDER BY job_id LIMIT 50) x"
            )
    assert len(leases) == 5 and control == 0  # the 5 are claimed; none left due
    claim_plan = next(p for p in plans if "jobs_claimable_idx" in p)
    assert re.search(r"Index Scan using jobs_claimable_idx .*actual time=\S+ rows=5 ", claim_plan)
    assert "Rows Removed by Filter: 20000" not in claim_plan
    walked = next(p for p in plans if "ORDER BY job_id LIMIT 50" in p)
    assert re.search(r"Rows Removed by Filter: 2000\d", walked), walked


# The claim's statement as it read before 0037: frozen tenants refused at the join only.
CLAIM_WITHOUT_FLAG = (
    "SELECT j.job_id FROM jobs.jobs j JOIN jobs.tenants t ON t.tenant = j.tenant"
    " WHERE j.workflow = 'w' AND j.state = 'queued' AND j.run_after <= now() AND NOT t.frozen"
    " ORDER BY j.run_after, j.job_id LIMIT 50 FOR NO KEY UPDATE OF j SKIP LOCKED"
)


def claimable_scanned(plan: str) -> int:
    """The rows a plan's scan of jobs_claimable_idx returned (EXPLAIN ANALYZE, text)."""
    [rows] = re.findall(r"(?:using|Scan on) jobs_claimable_idx .*actual time=\S+ rows=(\d+) ", plan)
    return int(rows)


async def test_the_claim_never_reads_a_frozen_tenant_s_jobs(pg: asyncpg.Connection) -> None:
    """Tenant ice is frozen with 20,000 queued jobs, all due before tenant acme's 5 (its
    producers kept submitting while it was frozen): the claim takes acme's 5 and its scan of
    jobs_claimable_idx reads nothing else (0037). Control: the same claim refusing frozen
    tenants at the join only, as before 0037, reads every one of ice's jobs."""
    store = Store(pg, backoff_base_s=0.0)
    await store.register_workflow("w", "o")
    await store.freeze("ice")
    async with pg.transaction():
        await pg.executemany(
            sql.SUBMIT, [("ice", "w", f"i{i}", "d", "{}", 5) for i in range(20000)]
        )
    await pg.execute("UPDATE jobs.jobs SET run_after = now() - interval '1 hour'")
    async with pg.transaction():
        await pg.executemany(sql.SUBMIT, [("acme", "w", f"a{i}", "d", "{}", 5) for i in range(5)])
    await pg.execute("ANALYZE jobs.jobs")
    assert await pg.fetchval("SELECT count(*) FROM jobs.jobs WHERE tenant_frozen") == 20000
    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        leases = await store.claim("w", "o", lease_s=60, limit=50)
        async with pg.transaction():
            await pg.execute("SET LOCAL enable_seqscan = off")  # as jobs.claim runs (0033)
            control = await pg.fetch(CLAIM_WITHOUT_FLAG)
    assert sorted(lease.operation_id for lease in leases) == [f"a{i}" for i in range(5)]
    assert control == []  # nothing left to take: acme's are claimed, ice's refused
    claim_plan = next(p for p in plans if "jobs_claimable_idx" in p and "tenant_frozen" in p)
    assert claimable_scanned(claim_plan) == 5, claim_plan
    walked = next(p for p in plans if "NOT t.frozen ORDER BY" in p)
    assert claimable_scanned(walked) >= 20000, walked


async def test_a_freeze_and_a_thaw_read_live_work_not_history(pg: asyncpg.Connection) -> None:
    """20,000 finished jobs of tenant acme and 5 queued: its freeze's trigger flags the 5
    through the live-work indexes and its thaw clears them through jobs_tenant_frozen_idx, and
    a detected restore (jobs.authority_hold) freezes it and holds the 5 likewise, none of them
    reading the finished history while the tenant's row (and so its submits) waits on them.
    Control: the same freeze spelled with an IN over the states, planned without the
    trigger's settings, reads the whole table."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    await finished_jobs(pg, 20000)
    async with pg.transaction():
        await pg.executemany(sql.SUBMIT, [("acme", "w1", f"q{i}", "d", "{}", 5) for i in range(5)])
    await pg.execute("ANALYZE jobs.jobs")
    store = Store(pg)
    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        await store.freeze("acme")
        frozen = await pg.fetchval("SELECT count(*) FROM jobs.jobs WHERE tenant_frozen")
        await store.unfreeze("acme")
        held = await pg.fetchval("SELECT held_jobs FROM jobs.authority_hold('acme', 5)")
        undone = pg.transaction()
        await undone.start()
        try:
            await pg.execute(
                "EXPLAIN ANALYZE UPDATE jobs.jobs j SET tenant_frozen = true"
                " WHERE j.tenant = 'acme' AND NOT j.tenant_frozen"
                " AND j.state IN ('queued', 'running', 'held', 'unknown', 'poison')"
            )
        finally:
            await undone.rollback()
    control = next(p for p in plans if "state IN ('queued'" in p)
    assert frozen == 5 and held == 5
    rewrites = [p for p in plans if "SET tenant_frozen" in p and "state IN ('queued'" not in p]
    assert len(rewrites) == 3, plans  # freeze, thaw, and the restore detection's freeze
    rewrites += [p for p in plans if "SET state = 'held'" in p]
    assert len(rewrites) == 4, plans
    for plan in rewrites:
        assert "Seq Scan" not in plan and all(n <= 5 for n in filtered_out(plan)), plan
    assert "Seq Scan on jobs" in control and any(n >= 20000 for n in filtered_out(control))


async def test_a_registration_counts_open_work_by_index_not_history(
    pg: asyncpg.Connection,
) -> None:
    """A registration under another owner counts the class's open work while it holds the
    class's row (and so its claims): beside 20,000 finished jobs it reads the live ones by the
    live-work indexes. Control: the count spelled with an IN over the states, as before, reads
    the whole table."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    await finished_jobs(pg, 20000)
    async with pg.transaction():
        await pg.executemany(sql.SUBMIT, [("acme", "w1", f"q{i}", "d", "{}", 5) for i in range(3)])
    await pg.execute("UPDATE jobs.jobs SET state = 'held' WHERE operation_id = 'q2'")
    await pg.execute("ANALYZE jobs.jobs")
    store = Store(pg)
    await store.register_workflow("w1", "first", effects_enabled=True)
    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        with pytest.raises(WorkflowNotDrained) as refused:
            await store.register_workflow("w1", "second", effects_enabled=True)
        await pg.fetch(
            "SELECT state, count(*) AS n FROM jobs.jobs"
            " WHERE workflow = $1 AND state IN ('queued', 'running', 'unknown', 'held')"
            " GROUP BY state",
            "w1",
        )
    assert refused.value.fields["open"] == {"queued": 2, "held": 1}
    [counted] = [p for p in plans if "HAVING count(*) > 0" in p]
    assert "Seq Scan" not in counted and all(n <= 3 for n in filtered_out(counted)), counted
    [control] = [p for p in plans if "state IN ('queued', 'running'" in p]
    assert "Seq Scan on jobs" in control and any(n >= 20000 for n in filtered_out(control))


async def waits_for(
    pg_dsn: str,
    hold: Callable[[asyncpg.Connection], Awaitable[object]],
    then: Callable[[], Awaitable[object]],
) -> bool:
    """Whether ``then()``, started while another connection's transaction that ran ``hold``
    is open, waits for that transaction (it has not returned 0.3 s later); both finish."""
    other = await asyncpg.connect(pg_dsn)
    try:
        async with other.transaction():
            await hold(other)
            task = asyncio.ensure_future(then())
            await asyncio.sleep(0.3)
            waited = not task.done()
        await task
    finally:
        await other.close()
    return waited


async def redefine_without(
    pg: asyncpg.Connection, function: str, lock: str, unlocked: str, absent: str
) -> None:
    """A race's control: ``function`` redefined with its ``lock`` text replaced by
    ``unlocked`` (``absent`` no longer in it)."""
    definition = await pg.fetchval(
        "SELECT replace(pg_get_functiondef($1::regproc), $2, $3)", function, lock, unlocked
    )
    assert absent not in definition
    await pg.execute(definition)


async def test_a_thaw_clears_the_flag_of_a_job_submitted_while_it_waited(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """A submit reads its tenant frozen; a thaw starts before it commits. The thaw waits for
    the submit (its trigger locks the tenant row FOR UPDATE, the submit holds FOR KEY SHARE),
    then clears the new job's flag too, and the job is claimed. Control: the trigger without
    that lock returns at once and leaves the job flagged under a thawed tenant, out of every
    claim for good. tests/isolation/freeze_vs_submit.spec runs the other orders."""
    store = Store(pg, backoff_base_s=0.0)
    await store.register_workflow("w", "o")

    async def race(operation_id: str) -> tuple[bool, bool]:
        """(the thaw waited for the submit, the job was claimed afterwards)."""
        await store.freeze("acme")
        waited = await waits_for(
            pg_dsn,
            lambda submitter: submitter.fetch(sql.SUBMIT, "acme", "w", operation_id, "d", "{}", 5),
            lambda: store.unfreeze("acme"),
        )
        leases = await store.claim("w", "o", lease_s=60, limit=5)
        return waited, [lease.operation_id for lease in leases] == [operation_id]

    assert await race("locked") == (True, True)
    await redefine_without(
        pg, "jobs.tenant_frozen_sync",
        "PERFORM 1 FROM jobs.tenants t WHERE t.tenant = NEW.tenant FOR UPDATE;", "",
        absent="FOR UPDATE",
    )  # fmt: skip
    assert await race("unlocked") == (False, False)
    assert await pg.fetchval(
        "SELECT tenant_frozen FROM jobs.jobs WHERE operation_id = 'unlocked'"
    ), "the control's job should be stranded with the flag set"


async def refuse_for_disabled_effects(pg: asyncpg.Connection, workflow: str, n: int) -> None:
    """``n`` jobs of ``workflow`` claimed and given up for effects_disabled, as the worker
    does when jobs.begin_effect refuses (jobs.fail with a retry, as Store.fail runs it)."""
    async with pg.transaction():
        await pg.executemany(
            sql.SUBMIT, [("acme", workflow, f"refused{i}", "d", "{}", 5) for i in range(n)]
        )
    claimed = await pg.fetch(
        "SELECT job_id, tenant, workflow, operation_id, owner, attempt_id, generation, epoch"
        " FROM jobs.claim($1, 'o', 60, $2)",
        workflow,
        n,
    )
    assert len(claimed) == n
    async with pg.transaction():
        await pg.executemany(
            sql.FAIL, [(*row, "effects_disabled", True, 0.0, 0.0) for row in claimed]
        )


async def test_the_claim_never_reads_jobs_refused_for_disabled_effects(
    pg: asyncpg.Connection,
) -> None:
    """Class w runs with its effects disabled (the default registration) and 5,000 of its
    jobs were refused for effects_disabled: they are parked out of the claim's range (0038),
    and a claim takes the class's 5 new jobs reading nothing else. Control: the same refused
    jobs due again, as jobs.fail left them before 0038, and the same claim reads every one
    of them before it finds 5 more (it still refuses them)."""
    store = Store(pg, backoff_base_s=0.0)
    await store.register_workflow("w", "o")
    await refuse_for_disabled_effects(pg, "w", 5000)
    parked = "SELECT count(*) FROM jobs.jobs WHERE run_after = 'infinity'"
    assert await pg.fetchval(parked) == 5000
    for batch in ("a", "b"):
        async with pg.transaction():
            await pg.executemany(
                sql.SUBMIT, [("acme", "w", f"{batch}{i}", "d", "{}", 5) for i in range(5)]
            )
    await pg.execute("ANALYZE jobs.jobs")
    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        taken = await store.claim("w", "o", lease_s=60, limit=5)
        await pg.execute(
            "UPDATE jobs.jobs SET run_after = now() - interval '1 hour'"
            " WHERE run_after = 'infinity'"
        )
        control = await store.claim("w", "o", lease_s=60, limit=5)
    assert sorted(lease.operation_id for lease in taken) == [f"a{i}" for i in range(5)]
    assert sorted(lease.operation_id for lease in control) == [f"b{i}" for i in range(5)]
    claims = [p for p in plans if "jobs_claimable_idx" in p and "tenant_frozen" in p]
    assert claimable_scanned(claims[0]) == 5 and not any(filtered_out(claims[0])), claims[0]
    # the control's scan drops the refused jobs at its filter, after reading each one
    assert any(n >= 5000 for n in filtered_out(claims[1])), claims[1]


async def test_enabling_effects_brings_the_class_s_refused_jobs_back_by_index(
    pg: asyncpg.Connection,
) -> None:
    """Class w1 has 1,000 finished jobs (of 20,000 over 20 classes), 50 parked for
    effects_disabled and 50 due: enabling its effects makes the 50 parked ones due again, read
    through jobs_claimable_idx (no sequential scan, nothing read and dropped), and the claim
    then takes all 100. A class still disabled keeps its parked jobs."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    await finished_jobs(pg, 20000)
    store = Store(pg, backoff_base_s=0.0)
    for workflow in ("w1", "w2"):
        await store.register_workflow(workflow, "o")
        await refuse_for_disabled_effects(pg, workflow, 50)
    async with pg.transaction():
        await pg.executemany(
            sql.SUBMIT, [("acme", "w1", f"due{i}", "d", "{}", 5) for i in range(50)]
        )
    await pg.execute("ANALYZE jobs.jobs")
    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        await store.register_workflow("w1", "o", effects_enabled=True)
    [rewrite] = [p for p in plans if "SET run_after = now()" in p]
    assert "jobs_claimable_idx" in rewrite and "Seq Scan" not in rewrite, rewrite
    assert all(n == 0 for n in filtered_out(rewrite)), rewrite
    assert len(await store.claim("w1", "o", lease_s=60, limit=200)) == 100
    still = "SELECT count(*) FROM jobs.jobs WHERE workflow = $1 AND run_after = 'infinity'"
    assert await pg.fetchval(still, "w2") == 50


async def test_a_class_s_refused_jobs_follow_its_effects_flag(pg: asyncpg.Connection) -> None:
    """Class w's 3 refused jobs are parked; its effects enabled and disabled again before any
    claim, they are parked again (the claim would refuse them and drop them at its filter),
    and enabled once more they are claimed. Its due job that was never refused is never
    parked. Control: with the class enabled, nothing is parked."""
    store = Store(pg, backoff_base_s=0.0)
    await store.register_workflow("w", "o")
    await refuse_for_disabled_effects(pg, "w", 3)
    async with pg.transaction():
        await pg.fetch(sql.SUBMIT, "acme", "w", "fresh", "d", "{}", 5)
    parked = "SELECT count(*) FROM jobs.jobs WHERE run_after = 'infinity'"
    assert await pg.fetchval(parked) == 3
    await store.register_workflow("w", "o", effects_enabled=True)
    assert await pg.fetchval(parked) == 0  # control
    await store.register_workflow("w", "o", effects_enabled=False)
    assert await pg.fetchval(parked) == 3
    assert [lease.operation_id for lease in await store.claim("w", "o", lease_s=60, limit=9)] == [
        "fresh"
    ]
    await store.register_workflow("w", "o", effects_enabled=True)
    assert len(await store.claim("w", "o", lease_s=60, limit=9)) == 3


async def test_an_enabling_brings_back_a_job_refused_while_it_waited(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """A worker gives a job up for effects_disabled (its class's flag read "disabled"); an
    enabling starts before that commits. The enabling waits for it (jobs.fail holds the
    class's row FOR SHARE), then brings the parked job back, and the job is claimed. Control:
    jobs.fail reading the flag without that lock lets the enabling pass, and the job stays
    parked under an enabled class, out of every claim for good.
    tests/isolation/enable_effects_vs_refusal.spec runs the other orders."""
    store = Store(pg, backoff_base_s=0.0)

    async def race(operation_id: str) -> tuple[bool, bool]:
        """(the enabling waited for the refusal, the job was claimed afterwards)."""
        await store.register_workflow("w", "o", effects_enabled=False)
        async with pg.transaction():
            await pg.fetch(sql.SUBMIT, "acme", "w", operation_id, "d", "{}", 5)
        [lease] = await store.claim("w", "o", lease_s=60, limit=5)
        waited = await waits_for(
            pg_dsn,
            lambda worker: Store(worker).fail(lease, "effects_disabled", retry=True),
            lambda: store.register_workflow("w", "o", effects_enabled=True),
        )
        leases = await store.claim("w", "o", lease_s=60, limit=5)
        return waited, [lease.operation_id for lease in leases] == [operation_id]

    assert await race("locked") == (True, True)
    await redefine_without(
        pg, "jobs.fail",
        "WHERE w.workflow = p_workflow FOR SHARE", "WHERE w.workflow = p_workflow",
        absent="FOR SHARE",
    )  # fmt: skip
    assert await race("unlocked") == (False, False)
    assert await pg.fetchval(
        "SELECT run_after = 'infinity' FROM jobs.jobs WHERE operation_id = 'unlocked'"
    ), "the control's job should be left parked"


PRUNE_SCAN = (
    "EXPLAIN (ANALYZE, COSTS OFF) SELECT j.job_id FROM jobs.jobs j"
    " WHERE j.state IN ('succeeded', 'failed', 'canceled') AND j.unresolved_effects = 0"
    " AND j.updated_at < now() - interval '1 day' ORDER BY j.updated_at LIMIT 100"
)


async def test_the_pruner_reads_only_jobs_it_may_take(pg: asyncpg.Connection) -> None:
    """20,000 poison jobs that finished long ago (they wait for a repair, never pruned) and 5
    old succeeded ones: jobs.prune's scan of jobs_prunable_idx (0023) returns the 5 and reads
    none of the poison rows, so a backlog awaiting repair costs a batch nothing. Control:
    without it (jobs_finished_idx of 0020 holds poison jobs too; the planner reads the table)
    the same scan reads every one of them."""
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    await finished_jobs(pg, 20000)
    await pg.execute("UPDATE jobs.jobs SET state = 'poison'")
    await pg.execute(
        "WITH o AS (INSERT INTO jobs.operations (tenant, workflow, operation_id, job_id)"
        " SELECT 'acme', 'w', 'old' || i, nextval('jobs.jobs_job_id_seq')"
        " FROM generate_series(1, 5) i RETURNING *)"
        " INSERT INTO jobs.jobs (job_id, tenant, workflow, operation_id, digest, state)"
        " OVERRIDING SYSTEM VALUE"
        " SELECT job_id, tenant, workflow, operation_id, 'd', 'succeeded' FROM o"
    )
    await pg.execute("UPDATE jobs.jobs SET updated_at = now() - interval '30 days'")
    await pg.execute("ANALYZE jobs.jobs")

    control = pg.transaction()
    await control.start()
    await pg.execute("DROP INDEX jobs.jobs_prunable_idx")
    walked = "\n".join(row[0] for row in await pg.fetch(PRUNE_SCAN))
    await control.rollback()
    assert re.search(r"Rows Removed by Filter: 2000\d", walked), walked

    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        async with pg.transaction():
            pruned = await retention.prune(
                pg, retention_s=86400.0, audit_retention_s=86400.0, limit=100
            )
    assert pruned.jobs == 5
    scan = next(p for p in plans if "jobs_prunable_idx" in p)
    assert re.search(r"Index Scan using jobs_prunable_idx .*actual time=\S+ rows=5 ", scan), scan
    assert "Rows Removed by Filter" not in scan, scan
