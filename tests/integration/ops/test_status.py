"""`accord status` and `/metrics` agree with the database on a seeded mix of states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from accord.consumers import Consumer
from accord.consumers.inbox import PRUNE_MARGIN_S, declare_window
from accord.jobs import Store, submit
from accord.ops import collect_status, render_table, serve_metrics, to_json
from accord.ops.metrics import families
from accord.ops.models import REPORTED_STATES, StatusReport
from tests.integration.consumers.support import CATALOG
from tests.integration.ops.seed import SECRET, Expected, seed_all
from tests.support import filtered_out, logged_plans


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    assert pool is not None
    yield pool
    await pool.close()


@pytest.fixture
async def seeded(pool: asyncpg.Pool) -> Expected:
    return await seed_all(pool)


def run_cli(dsn: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accord", *args],
        env={**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": dsn, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def snapshot(pool: asyncpg.Pool) -> StatusReport:
    async with pool.acquire() as conn:
        return await collect_status(conn)


def check_report(report: StatusReport, e: Expected) -> None:
    assert {(g.state, g.tenant, g.workflow): g.jobs for g in report.jobs} == e.jobs
    assert {(g.state, g.tenant, g.workflow): g.attempts for g in report.jobs} == e.attempts
    assert {(g.state, g.tenant, g.workflow): g.rescued for g in report.jobs} == e.rescued
    waiting = {(str(w.reason), w.state, w.tenant, w.workflow): w.jobs for w in report.waiting}
    assert waiting == e.waiting
    effects = {(x.tenant, x.workflow, x.effect_state, x.job_state): (x.effects, x.escalated)
               for x in report.effects}  # fmt: skip
    assert effects == e.effects
    assert report.escalated_effects == 2
    tenants = {t.tenant: (t.epoch, t.frozen, t.held, t.restore_ledger_epoch)
               for t in report.tenants}  # fmt: skip
    assert tenants == e.tenants
    assert (report.relay.pending, report.relay.held) == (e.relay_pending, e.relay_held)
    assert report.relay.lag_s > 0
    assert {(d.consumer, d.tenant, d.outcome): d.deliveries
            for d in report.deliveries} == e.deliveries  # fmt: skip
    assert report.inbox_conflicts == 1
    assert {(p.consumer, p.reason): p.messages for p in report.poison} == e.poison
    assert {(x.workflow, x.reason): x.refusals for x in report.replay_refusals} == e.refusals
    ages = [g.oldest_age_s for g in (*report.jobs, *report.waiting, *report.effects)]
    assert all(0 <= a < 600 for a in ages)


async def test_status_matches_the_seeded_states(pool: asyncpg.Pool, seeded: Expected) -> None:
    report = await snapshot(pool)
    check_report(report, seeded)
    # The figures agree with each other: every queued/held/unknown job has a reason.
    for state in ("queued", "held", "unknown"):
        assert report.count(state) == sum(w.jobs for w in report.waiting if w.state == state)
    categories = {str(w.category) for w in report.waiting}
    assert categories == {
        "no_worker_capacity", "missing_authority", "invalid_configuration",
        "awaiting_reconciliation", "scheduled_retry", "awaiting_rescue",
    }  # fmt: skip
    assert {w.workflow: w.live_leases for w in report.workflows} == {
        "digest": 0,
        "hold": 0,
        "report": 1,
    }


async def test_status_names_a_job_whose_effect_count_disagrees_with_its_records(
    pool: asyncpg.Pool, seeded: Expected
) -> None:
    """The row's count of unresolved effects (migration 0010) is derived by a trigger. The
    seeded mix (effects begun, finished, resolved by repair) keeps it right (control); a count
    written by hand, as a bypassed trigger would leave it, is named with both figures."""
    assert (await snapshot(pool)).miscounted == ()
    job_id = await pool.fetchval(
        "SELECT job_id FROM jobs.effects WHERE state IN ('pending', 'unknown')"
        " ORDER BY job_id LIMIT 1"
    )
    await pool.execute("UPDATE jobs.jobs SET unresolved_effects = 0 WHERE job_id = $1", job_id)
    report = await snapshot(pool)
    assert [(m.job_id, m.counted) for m in report.miscounted] == [(job_id, 0)]
    assert report.miscounted[0].recorded >= 1
    assert "effect count disagrees" in render_table(report)
    assert to_json(report)["miscounted"][0]["job_id"] == job_id


async def test_status_names_jobs_and_operation_keys_that_do_not_name_each_other(
    pool: asyncpg.Pool, seeded: Expected
) -> None:
    """jobs.operations (migration 0011) is the idempotency key; foreign keys both ways keep
    each job and its key row together. The seeded mix has no stray one (control). Rows
    removed behind the foreign keys' back, as a data-only restore with disabled triggers can
    leave them, are named, and they matter: a job without its key can be submitted again as
    a second job, and a key without its job makes its resubmits fail."""
    assert (await snapshot(pool)).key_mismatches == ()
    first, second = await pool.fetch(
        "SELECT job_id, tenant, workflow, operation_id FROM jobs.jobs ORDER BY job_id LIMIT 2"
    )
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute("DELETE FROM jobs.operations WHERE job_id = $1", first["job_id"])
        # a stray key naming another job's id (what a reused id would look like)
        await conn.execute(
            "INSERT INTO jobs.operations VALUES ($1, $2, 'stray', $3)",
            second["tenant"], second["workflow"], second["job_id"],
        )  # fmt: skip
    report = await snapshot(pool)
    assert [(u.job_id, u.operation_id, u.problem) for u in report.key_mismatches] == [
        (first["job_id"], first["operation_id"], "job_without_key"),
        (second["job_id"], "stray", "key_without_job"),
    ]
    assert "do not name each other" in render_table(report)
    assert to_json(report)["key_mismatches"][0]["job_id"] == first["job_id"]
    submit = "SELECT job_id FROM jobs.submit($1, $2, $3, 'd', '{}', 5)"
    again = await pool.fetchval(submit, first["tenant"], first["workflow"], first["operation_id"])
    assert again != first["job_id"]
    # the stray key's resubmit is refused, never answered with the other job
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="has a key row but no job"):
        await pool.fetchval(submit, second["tenant"], second["workflow"], "stray")


async def test_status_names_jobs_stranded_by_a_frozen_flag(
    pool: asyncpg.Pool, seeded: Expected
) -> None:
    """A job flagged frozen (0037) under a tenant that is not frozen is outside the claim's
    index range: nothing claims it, ever. The seeded mix has none (control: its frozen
    tenant's jobs are flagged and not listed). A flag set behind the trigger's back is named,
    with the remedy the section's title gives: a freeze and a thaw of the tenant clear it,
    and the job is claimed."""
    assert (await snapshot(pool)).stranded == ()
    assert await pool.fetchval("SELECT count(*) FROM jobs.jobs WHERE tenant_frozen") > 0
    async with pool.acquire() as conn:
        store = Store(conn)
        await store.register_workflow("w_stranded", "o")
        async with conn.transaction():
            done = await submit(
                conn, tenant="acme", workflow="w_stranded", operation_id="s1", digest="d"
            )
        await conn.execute("UPDATE jobs.jobs SET tenant_frozen = true WHERE job_id = $1",
                           done.job_id)  # fmt: skip
        report = await snapshot(pool)
        assert [(j.job_id, j.tenant, j.state, j.cause) for j in report.stranded] == [
            (done.job_id, "acme", "queued", "tenant_frozen")
        ]
        assert "which no claim reads" in render_table(report)
        assert to_json(report)["stranded"][0]["job_id"] == done.job_id
        assert await store.claim("w_stranded", "o", lease_s=60, limit=5) == []
        await store.freeze("acme")
        await store.unfreeze("acme")
        assert (await snapshot(pool)).stranded == ()
        [lease] = await store.claim("w_stranded", "o", lease_s=60, limit=5)
        assert lease.job_id == done.job_id


async def test_status_names_jobs_parked_in_a_class_whose_effects_are_enabled(
    pool: asyncpg.Pool, seeded: Expected
) -> None:
    """A job parked for effects_disabled (run_after = 'infinity', 0038) is brought back by
    the trigger when its class's effects are enabled, so the seeded mix's parked job, in a
    class still disabled, is not listed (control). One parked behind the trigger's back under
    an enabled class is named with its cause, and the remedy the section's title gives (the
    class registered with effects disabled, then enabled) brings it back to a claim."""
    assert (await snapshot(pool)).stranded == ()
    assert await pool.fetchval("SELECT count(*) FROM jobs.jobs WHERE run_after = 'infinity'") > 0
    async with pool.acquire() as conn:
        store = Store(conn)
        await store.register_workflow("w_parked", "o", effects_enabled=True)
        async with conn.transaction():
            done = await submit(
                conn, tenant="acme", workflow="w_parked", operation_id="p1", digest="d"
            )
        await conn.execute(
            "UPDATE jobs.jobs SET run_after = 'infinity', last_error = 'effects_disabled'"
            " WHERE job_id = $1",
            done.job_id,
        )
        report = await snapshot(pool)
        assert [(j.job_id, j.cause) for j in report.stranded] == [(done.job_id, "effects_parked")]
        assert "effects_parked, parked for disabled effects" in render_table(report)
        assert await store.claim("w_parked", "o", lease_s=60, limit=5) == []
        await store.register_workflow("w_parked", "o", effects_enabled=False)
        await store.register_workflow("w_parked", "o", effects_enabled=True)
        assert (await snapshot(pool)).stranded == ()
        [lease] = await store.claim("w_parked", "o", lease_s=60, limit=5)
        assert lease.job_id == done.job_id


OLD_DELIVERIES = """
INSERT INTO consumers.deliveries (tenant, consumer, operation_id, event_id, redelivered,
                                  delivery_count, outcome, received_at)
SELECT 'acme', 'report', 'old-' || i, gen_random_uuid(), true, 1,
       CASE WHEN i <= 5 THEN 'conflict' ELSE 'duplicate' END, now() - interval '3 days'
FROM generate_series(1, $1) i
"""

# consumers.deliveries rows this transaction has read so far (scans and index fetches).
DELIVERIES_READ = (
    "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
    " WHERE schemaname = 'consumers' AND relname = 'deliveries'"
)

# The grouping of every retained delivery, as the snapshot read them before 0040.
GROUP_ALL = (
    "SELECT consumer, tenant, outcome, count(*) FROM consumers.deliveries"
    " GROUP BY consumer, tenant, outcome"
)


async def rows_read(conn: asyncpg.Connection, read: Any) -> int:
    """The consumers.deliveries rows ``read()`` read, in a transaction of its own."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        before = await conn.fetchval(DELIVERIES_READ)
        await read()
        return int(await conn.fetchval(DELIVERIES_READ)) - int(before)


async def test_inbox_decisions_cost_the_window_not_the_retained_deliveries(
    pool: asyncpg.Pool, seeded: Expected
) -> None:
    """20,000 deliveries received three days ago (retained: the replay window is 7 days), 5 of
    them conflicts, beside the seeded ones of today. `accord status` (a 24 h window) counts
    today's decisions only and reads none of the old rows (deliveries_received_idx, 0040);
    the conflicts of every retained delivery still count (deliveries_conflict_idx); a /metrics
    snapshot reads the conflicts and nothing else of the table. Control: the grouping the
    snapshot ran before 0040 reads all 20,000."""
    async with pool.acquire() as conn:
        await conn.execute(OLD_DELIVERIES, 20000)
        await conn.execute("ANALYZE consumers.deliveries")
        report = await snapshot(pool)
        assert {(d.consumer, d.tenant, d.outcome): d.deliveries
                for d in report.deliveries} == seeded.deliveries  # fmt: skip
        assert report.inbox_conflicts == 1 + 5
        recent = sum(seeded.deliveries.values())
        status = await rows_read(conn, lambda: collect_status(conn))
        metrics = await rows_read(conn, lambda: collect_status(conn, integrity=False, window=False))
        control = await rows_read(conn, lambda: conn.fetch(GROUP_ALL))
    assert metrics <= 6, metrics  # the conflicts, through their own index
    assert status <= 6 + recent + 5, status  # and today's, a probe per consumer
    assert control >= 20000, control


async def test_status_of_an_empty_database(pool: asyncpg.Pool) -> None:
    report = await snapshot(pool)
    assert report.jobs == report.waiting == report.effects == report.poison == ()
    assert report.miscounted == report.key_mismatches == report.stranded == ()
    assert (report.relay.pending, report.relay.held, report.relay.lag_s) == (0, 0, 0.0)
    assert report.relay.awake_s == 0.0  # no relay promised to poll
    assert to_json(report)["totals"]["queued"] == 0
    assert "jobs: none" in render_table(report)


async def test_status_says_how_long_a_relays_promise_to_poll_runs(pool: asyncpg.Pool) -> None:
    """While a relay promises to poll (relay.awake), enqueues skip their NOTIFY: status and
    /metrics say for how long more. Control: a promise that ran out reads 0."""
    await pool.execute("UPDATE relay.awake SET until = now() - interval '1 s'")
    assert (await snapshot(pool)).relay.awake_s == 0.0
    await pool.execute("UPDATE relay.awake SET until = now() + interval '30 s'")
    report = await snapshot(pool)
    assert 25 < report.relay.awake_s <= 30
    assert to_json(report)["totals"]["relay_awake_s"] == round(report.relay.awake_s, 3)
    assert "awake_s" in render_table(report)


def _stable(data: Any) -> Any:
    """Drop what changes between two snapshots (clock readings), keep every count."""
    if isinstance(data, dict):
        return {k: _stable(v) for k, v in data.items()
                if not k.endswith("_s") and k != "taken_at"}  # fmt: skip
    if isinstance(data, list):
        return [_stable(v) for v in data]
    return data


async def test_cli_json_agrees(pg_dsn: str, pool: asyncpg.Pool, seeded: Expected) -> None:
    done = run_cli(pg_dsn, "status", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert _stable(printed) == _stable(to_json(await snapshot(pool)))
    totals = printed["totals"]
    assert [totals[s] for s in REPORTED_STATES] == [8, 2, 1, 1, 1, 2]
    assert (totals["inbox_conflicts"], totals["poison_messages"], totals["rescued"]) == (1, 2, 1)
    assert totals["escalated_effects"] == 2
    table = run_cli(pg_dsn, "status")
    assert table.returncode == 0, table.stderr
    assert "why waiting work waits" in table.stdout and "unresolved_effect" in table.stdout
    assert SECRET not in done.stdout + table.stdout + done.stderr + table.stderr


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert SECRET not in text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def by(samples: dict[Any, float], name: str, *labels: str) -> dict[tuple[str, ...], int]:
    return {
        tuple(dict(k)[label] for label in labels): int(v)
        for (n, k), v in samples.items()
        if n == name
    }


async def test_metrics_endpoint_agrees(pg_dsn: str, pool: asyncpg.Pool, seeded: Expected) -> None:
    server = serve_metrics(0, dsn=pg_dsn)
    try:
        samples = scrape(server.port)
    finally:
        server.close()
    report = await snapshot(pool)
    check_report(report, seeded)
    assert samples[("accord_status_up", ())] == 1
    assert by(samples, "accord_jobs", "state", "tenant", "workflow") == seeded.jobs
    assert by(samples, "accord_job_attempts", "state", "tenant", "workflow") == seeded.attempts
    waiting = by(samples, "accord_waiting_jobs", "reason", "state", "tenant", "workflow")
    assert waiting == seeded.waiting
    effects = by(
        samples, "accord_unresolved_effects", "tenant", "workflow", "effect_state", "job_state"
    )
    assert effects == {k: n for k, (n, _) in seeded.effects.items()}
    escalated = by(
        samples, "accord_unresolved_effects_escalated", "tenant", "workflow", "effect_state",
        "job_state",
    )  # fmt: skip
    assert escalated == {k: x for k, (_, x) in seeded.effects.items()}
    assert samples[("accord_escalated_effects", ())] == 2
    assert by(samples, "accord_tenant_held_jobs", "tenant") == {
        (t,): held for t, (_, _, held, _) in seeded.tenants.items()
    }
    assert by(samples, "accord_tenant_restore_detected", "tenant") == {
        ("acme",): 0, ("globex",): 0, ("initech",): 1
    }  # fmt: skip
    assert by(samples, "accord_jobs_by_state", "state") == {
        (s,): report.count(s) for s in REPORTED_STATES
    }
    assert samples[("accord_relay_pending", ())] == seeded.relay_pending
    assert samples[("accord_relay_held", ())] == seeded.relay_held
    assert samples[("accord_relay_lag_seconds", ())] > 0
    assert samples[("accord_relay_awake_seconds", ())] == 0  # no relay promised to poll
    assert samples[("accord_inbox_conflicts", ())] == 1
    assert by(samples, "accord_poison_messages", "consumer", "reason") == seeded.poison
    assert by(samples, "accord_replay_refusals_total", "workflow", "reason") == seeded.refusals
    assert by(samples, "accord_tenant_frozen", "tenant") == {
        ("acme",): 0,
        ("globex",): 1,
        ("initech",): 1,
    }


async def test_never_payloads(pool: asyncpg.Pool, seeded: Expected) -> None:
    # Control: the marker really is in the database (payloads, errors, poison detail, bodies).
    found = await pool.fetchval(
        "SELECT (SELECT count(*) FROM jobs.jobs WHERE payload::text LIKE '%' || $1 || '%')"
        " + (SELECT count(*) FROM consumers.poison WHERE detail::text LIKE '%' || $1 || '%')"
        " + (SELECT count(*) FROM jobs.jobs WHERE last_error LIKE '%' || $1 || '%')",
        SECRET,
    )
    assert found > 10
    report = await snapshot(pool)
    assert SECRET not in render_table(report)
    assert SECRET not in json.dumps(to_json(report))
    assert SECRET not in repr(report)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://postgres@127.0.0.1:1/none",  # nothing answers
        "postgresql://postgres@127.0.0.1:5432/accord_no_such_database",  # refused: missing
        "postgresql://accord_no_such_user@127.0.0.1:5432/postgres",  # refused: the login
    ],
    ids=["unreachable", "missing", "login"],
)
async def test_scrape_reports_a_database_that_does_not_answer(dsn: str) -> None:
    """Unreachable or refused, the scrape says ``accord_status_up 0`` (before, a refused
    login or a missing database failed the whole scrape with HTTP 500, and the alert on
    ``accord_status_up == 0`` stayed silent)."""
    server = serve_metrics(0, dsn=dsn)
    try:
        samples = scrape(server.port)
    finally:
        server.close()
    assert samples[("accord_status_up", ())] == 0
    assert not [k for k in samples if k[0] == "accord_jobs"]


async def test_status_shows_each_consumer_s_declared_replay_window(
    pool: asyncpg.Pool, seeded: Expected
) -> None:
    """The horizons the database holds every pruner to (migration 0027), as declared."""
    assert (await snapshot(pool)).replay_windows == ()  # control: none declared yet
    async with pool.acquire() as conn:
        await declare_window(conn, Consumer("report", CATALOG, 7 * 86400.0))
        await declare_window(conn, Consumer("ledger", CATALOG, 30 * 86400.0))
    report = await snapshot(pool)
    assert [(w.consumer, w.replay_window_s, w.horizon_s) for w in report.replay_windows] == [
        ("ledger", 30 * 86400.0, 30 * 86400.0 + PRUNE_MARGIN_S),
        ("report", 7 * 86400.0, 7 * 86400.0 + PRUNE_MARGIN_S),
    ]
    assert all(0 <= w.declared_age_s < 600 for w in report.replay_windows)
    assert "replay windows" in render_table(report)
    assert to_json(report)["replay_windows"][1]["horizon_s"] == 605100.0
    [horizons] = [f for f in families(report) if f.name == "accord_replay_horizon_seconds"]
    assert {s.labels["consumer"]: s.value for s in horizons.samples} == {
        "ledger": 30 * 86400.0 + PRUNE_MARGIN_S,
        "report": 605100.0,
    }


# The counts by state and the relay's figures as they were before 0034, for the control.
JOB_GROUPS_BEFORE_0034 = (
    "SELECT j.state, count(*) FROM jobs.jobs j WHERE j.state = ANY ($1::text[]) GROUP BY j.state"
)
FIGURES_BEFORE_0034 = (
    "SELECT count(*) FILTER (WHERE state = 'pending') FROM relay.outbox"
    " WHERE state IN ('pending', 'held')"
)
# jobs.waiting's choice of jobs as 0022 spelled it (an OR over states), before 0035.
WAITING_BEFORE_0035 = (
    "SELECT count(*) FROM jobs.jobs j WHERE j.state IN ('queued', 'held', 'unknown', 'running')"
    " OR (j.state IN ('canceled', 'failed', 'poison') AND j.unresolved_effects > 0)"
)


async def test_a_metrics_snapshot_reads_the_work_not_done_not_the_history(
    pool: asyncpg.Pool, seeded: Expected
) -> None:
    """20,000 succeeded jobs and 20,000 published outbox rows kept beside the seeded work:
    the snapshot a /metrics scrape takes reads the jobs and rows not done by index (0034, and
    jobs.waiting's: 0035) and runs neither integrity check (they read every job kept, and
    /metrics exports neither), and its figures are the seeded ones. Control: the counts as
    they were spelled read the whole history."""
    async with pool.acquire() as conn:
        await conn.execute(
            "WITH o AS (INSERT INTO jobs.operations (tenant, workflow, operation_id, job_id)"
            " SELECT 'acme', 'w', 'kept' || i, nextval('jobs.jobs_job_id_seq')"
            " FROM generate_series(1, 20000) i RETURNING *)"
            " INSERT INTO jobs.jobs (job_id, tenant, workflow, operation_id, digest, state,"
            " updated_at) OVERRIDING SYSTEM VALUE SELECT job_id, tenant, workflow,"
            " operation_id, 'd', 'succeeded', now() - interval '2 days' FROM o"
        )
        await conn.execute(
            "INSERT INTO relay.outbox (event_id, tenant, operation_id, type, version, digest,"
            " body, occurred_at, state, published_at) SELECT gen_random_uuid(), 'acme',"
            " 'kept-' || i, 'report.accepted', 1, 'd', '{}'::bytea, now(), 'published',"
            " now() - interval '2 days' FROM generate_series(1, 20000) i"
        )
        await conn.execute("ANALYZE jobs.jobs, relay.outbox")
        walked = [
            r[0]
            for statement, args in (
                (JOB_GROUPS_BEFORE_0034, [list(REPORTED_STATES)]),
                (FIGURES_BEFORE_0034, []),
                (WAITING_BEFORE_0035, []),
            )
            for r in await conn.fetch(f"EXPLAIN (ANALYZE, COSTS OFF) {statement}", *args)
        ]
        removed = [n for line in walked for n in filtered_out(line)]
        assert sum(removed) >= 60_000, walked  # control

        async with logged_plans(conn) as plans:
            await conn.execute("SET auto_explain.log_analyze = on")
            report = await collect_status(conn, integrity=False)
    assert report.miscounted == () and report.key_mismatches == ()
    assert not any("FULL JOIN" in p or "unresolved_effects AS counted" in p for p in plans)
    counted = [
        p for p in plans if "jobs_attention_idx" in p or "relay.outbox" in p or "jobs.waiting" in p
    ]
    assert len(counted) >= 3 and any("jobs.waiting" in p for p in counted), plans
    for plan in counted:
        assert "Seq Scan on jobs" not in plan and "Seq Scan on outbox" not in plan, plan
        assert all(n < 100 for n in filtered_out(plan)), plan
    check_report(report, seeded)  # the seeded figures, the history beside them uncounted
