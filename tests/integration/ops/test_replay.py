"""Projection replay: the rebuilt projection equals the live one, and the replay principal
cannot submit jobs, begin effects or enqueue events (refused by PostgreSQL, counted)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from accord.cli import temporary
from accord.consumers import Consumer, ConsumerRuntime, Delivery, Handlers, RuntimeConfig, reserve
from accord.consumers import sql as consumer_sql
from accord.demo.app import PROJECTION as REPORT_PROJECTION
from accord.demo.app import app as demo_app
from accord.demo.catalog import demo_catalog
from accord.jobs import Store, submit
from accord.ops import (
    Projection,
    ProjectionPrincipalLost,
    RebuildIncomplete,
    ReplayHandlerFailed,
    ReplayInterrupted,
    ReplayWindowExceeded,
    UnknownProjection,
    collect_status,
    install_span_metrics,
    prune_ledger,
    replay,
    serve_metrics,
)
from accord.ops import sql as replay_sql
from accord.relay import Relay, RelayConfig
from accord.relay import outbox as relay_outbox
from accord.schemas.events import Event
from tests.conftest import BrokerNames
from tests.integration.relay.helpers import declare_demo
from tests.support import enqueue, wait_for

CATALOG = demo_catalog()
# Event times within the inbox's replay window (an older event is refused as too old).
BASE = datetime.now(UTC) - timedelta(hours=1)
PROJECTION_ROWS = (
    "SELECT tenant, report_id, operation_id, event_id, object_key, provider_receipt, published_at"
    " FROM demo_projection.published_reports ORDER BY tenant, report_id"
)


def published(n: int, *, tenant: str = "acme", report: int | None = None, minute: int = 0) -> Event:
    """A report.published event; several may name one report (the later one wins)."""
    rid = n if report is None else report
    return Event(
        tenant=tenant, operation_id=f"pub-{n}", type="report.published", version=1,
        payload={"report_id": f"r{rid}", "object_key": f"k{n}", "provider_receipt": f"rc{n}"},
        occurred_at=BASE + timedelta(minutes=minute),
    )  # fmt: skip


def events(count: int) -> list[Event]:
    found = [published(n, tenant="acme" if n % 3 else "globex", minute=n) for n in range(count)]
    # Two later versions of report r1, enqueued out of time order: the latest must win.
    return [*found, published(count, report=1, minute=50), published(count + 1, report=1)]


async def enqueue_all(conn: asyncpg.Connection, batch: list[Event]) -> None:
    for event in batch:
        async with conn.transaction():
            await enqueue(conn, event)


def run_cli(dsn: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accord", *args],
        env={**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": dsn, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def do_replay(dsn: str, projection: Projection, **kwargs: Any) -> Any:
    reader, writer = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        options: dict[str, Any] = {"since": datetime.now(UTC) - timedelta(hours=1)}
        options |= {"catalog": CATALOG, "retention_s": 86400.0, **kwargs}
        return await replay(reader, writer, projection, **options)
    finally:
        await reader.close()
        await writer.close()


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            totals[s.name] = totals.get(s.name, 0.0) + s.value
    return totals


@pytest.mark.timeout(120)
async def test_rebuilt_projection_matches_the_live_one(
    pg_dsn: str, pg: asyncpg.Connection, amqp_url: str, broker_names: BrokerNames
) -> None:
    topo = await declare_demo(amqp_url, broker_names)
    batch = events(24)
    metrics = serve_metrics(0, dsn=pg_dsn)
    install_span_metrics(metrics.messaging)
    consumer = ConsumerRuntime(
        config=RuntimeConfig(workflow=REPORT_PROJECTION, tenants=frozenset({"*"})),
        amqp_url=amqp_url, pg_dsn=pg_dsn, topology=topo, catalog=CATALOG,
        handlers=demo_app.projection_of(REPORT_PROJECTION).handlers,
    )  # fmt: skip
    relay = Relay(
        RelayConfig(pg_dsn=pg_dsn, amqp_url=amqp_url, exchange=topo.exchange, poll_s=0.05)
    )
    inbox_rows = "SELECT count(*) FROM consumers.inbox WHERE consumer = 'report_projection'"
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run)
            tg.start_soon(relay.run)
            await enqueue_all(pg, batch)
            await wait_for(lambda: _equals(pg, inbox_rows, len(batch)), within=30)
            consumer.stop()
            relay.stop()
        live = [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)]
        assert len(live) == len(batch) - 2  # r1 has three events, one row
        r1 = [row for row in live if row[:2] == ("acme", "r1")]
        assert r1[0][4] == "k24"  # the latest occurred_at won, live
        sent = scrape(metrics.port)
    finally:
        metrics.close()
    # OpenTelemetry messaging metrics from the relay's and the consumer's spans.
    assert sent["messaging_client_sent_messages_total"] >= len(batch)
    assert sent["messaging_client_consumed_messages_total"] >= len(batch)
    assert sent["messaging_process_duration_seconds_count"] >= len(batch)

    # Rebuild through the CLI, then again through the API: both equal the live projection.
    await pg.execute("DELETE FROM demo_projection.published_reports")
    done = run_cli(pg_dsn, "replay", "--workflow", REPORT_PROJECTION, "--since", "1h", "--rebuild")
    assert done.returncode == 0, done.stderr
    assert f"events={len(batch)} applied={len(batch)} refused=0" in done.stdout
    assert [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)] == live
    summary = await do_replay(pg_dsn, demo_app.projection_of(REPORT_PROJECTION), rebuild=True)
    assert (summary.events, summary.applied, summary.refused) == (len(batch), len(batch), 0)
    assert [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)] == live


async def _equals(conn: asyncpg.Connection, query: str, expected: int) -> bool:
    return bool(await conn.fetchval(query) == expected)


async def _published(conn: asyncpg.Connection, expected: int) -> bool:
    return await _equals(
        conn, "SELECT count(*) FROM relay.outbox WHERE state = 'published'", expected
    )


# -- refusals -------------------------------------------------------------------------------


async def mark_published(pg: asyncpg.Connection, batch: list[Event]) -> None:
    """Seed retained events without a broker (a direct write of the relay's settlement)."""
    await enqueue_all(pg, batch)
    await pg.execute(
        "UPDATE relay.outbox SET state = 'published', published_at = now(),"
        " publish_id = gen_random_uuid()"
    )


async def forbidden_submit(tx: Any, event: Event) -> None:
    await submit(tx, tenant=event.tenant, workflow="report", operation_id=event.operation_id,
                 digest="d", payload={})  # fmt: skip


async def forbidden_begin_effect(tx: Any, event: Event) -> None:
    lease = await tx.fetchrow("SELECT * FROM jobs.jobs WHERE state = 'running' LIMIT 1")
    status = await tx.fetchval(
        "SELECT status FROM jobs.begin_effect($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        lease["job_id"], lease["tenant"], lease["workflow"], lease["operation_id"],
        lease["owner"], lease["attempt_id"], lease["generation"], lease["epoch"],
        f"charge-{event.operation_id}", "intent",
    )  # fmt: skip
    assert status is None  # begun


async def forbidden_effect_insert(tx: Any, event: Event) -> None:
    await tx.execute(
        "INSERT INTO jobs.effects (tenant, job_id, effect_key, seq, intent_digest, attempt_id,"
        " generation) SELECT tenant, job_id, $1, 1, 'x', attempt_id, generation"
        " FROM jobs.jobs WHERE state = 'running' LIMIT 1",
        f"direct-{event.operation_id}",
    )


async def forbidden_enqueue(tx: Any, event: Event) -> None:
    await enqueue(tx, published(900 + int(event.operation_id.split("-")[1]), tenant=event.tenant))


ATTEMPTS = {
    "submit": forbidden_submit,
    "begin_effect": forbidden_begin_effect,
    "effect_insert": forbidden_effect_insert,
    "enqueue": forbidden_enqueue,
}
COUNTS = (
    "SELECT (SELECT count(*) FROM jobs.jobs), (SELECT count(*) FROM jobs.effects),"
    " (SELECT count(*) FROM relay.outbox)"
)


PRUNE_ONE = "SELECT runs, refusals FROM ops.prune_replay($1, $2)"


def greedy(attempt: Callable[[Any, Event], Awaitable[None]], every: int) -> Projection:
    """The demo projection whose handler also tries ``attempt`` on every ``every``-th event."""
    honest = demo_app.projection_of(REPORT_PROJECTION)
    handlers = Handlers(REPORT_PROJECTION)
    project = honest.handlers.get(published(0))

    @handlers.on("report.published", 1)
    async def project_and_overreach(tx: Any, event: Event) -> None:
        await project(tx, event)
        if int(event.operation_id.split("-")[1]) % every == 0:
            await attempt(tx, event)

    return Projection(REPORT_PROJECTION, handlers, honest.reset_statements)


async def running_job(pool: asyncpg.Pool) -> None:
    """A running job with effects enabled: what begin_effect needs to be allowed at all."""
    store = Store(pool)
    await store.register_workflow("report", "w", effects_enabled=True)
    async with pool.acquire() as conn, conn.transaction():
        await submit(conn, tenant="acme", workflow="report", operation_id="job-1", digest="d")
    await store.claim("report", "w", lease_s=600)


@pytest.mark.parametrize("action", sorted(ATTEMPTS))
async def test_replay_principal_is_refused_and_counted(
    pg_dsn: str, pg: asyncpg.Connection, action: str
) -> None:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    assert pool is not None
    try:
        await running_job(pool)
    finally:
        await pool.close()
    attempt = ATTEMPTS[action]
    # Control: the same call, outside the projection principal, is allowed.
    before = tuple(await pg.fetchrow(COUNTS))
    async with pg.transaction():
        await attempt(pg, published(1000))
    assert tuple(await pg.fetchrow(COUNTS)) != before
    await pg.execute("DELETE FROM relay.outbox")

    batch = [published(n) for n in range(12)]
    await mark_published(pg, batch)
    before = tuple(await pg.fetchrow(COUNTS))
    summary = await do_replay(pg_dsn, greedy(attempt, every=4), rebuild=True)
    refused = {f"pub-{n}" for n in (0, 4, 8)}
    assert (summary.events, summary.applied, summary.refused) == (12, 9, 3)
    assert {r.operation_id for r in summary.refusals} == refused
    assert {r.sqlstate for r in summary.refusals} == {"42501"}
    # Nothing was submitted, begun or enqueued; the refused events' own upserts rolled back.
    assert tuple(await pg.fetchrow(COUNTS)) == before
    rows = await pg.fetch("SELECT operation_id FROM demo_projection.published_reports")
    assert {r["operation_id"] for r in rows} == {e.operation_id for e in batch} - refused
    ledger = await pg.fetch(
        "SELECT operation_id, reason FROM ops.replay_refusals WHERE run_id = $1", summary.run_id
    )
    assert {(r["operation_id"], r["reason"]) for r in ledger} == {
        (op, "insufficient_privilege") for op in refused
    }
    run = await pg.fetchrow("SELECT * FROM ops.replay_runs WHERE run_id = $1", summary.run_id)
    assert (run["events"], run["applied"], run["refused"]) == (12, 9, 3)
    assert run["finished_at"] is not None
    report = await collect_status(pg)
    assert [(x.workflow, x.refusals) for x in report.replay_refusals] == [(REPORT_PROJECTION, 3)]


async def test_a_handler_that_leaves_the_principal_is_caught(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    batch = [published(n) for n in range(3)]
    await mark_published(pg, batch)

    async def escape(tx: Any, event: Event) -> None:
        await tx.execute("RESET ROLE")

    with pytest.raises(ProjectionPrincipalLost):
        await do_replay(pg_dsn, greedy(escape, every=2))
    assert await pg.fetchval("SELECT count(*) FROM demo_projection.published_reports") == 0
    # Control: the honest projection replays the same events.
    summary = await do_replay(pg_dsn, demo_app.projection_of(REPORT_PROJECTION))
    assert summary.applied == 3


async def test_a_handler_s_own_failure_is_a_typed_refusal_naming_the_event_not_its_text(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """A handler bug while replaying: ReplayHandlerFailed naming the event and the error's
    type, never its text (which may quote the event); its batch rolled back; the run left
    unfinished. Before: a raw traceback with the text, exit 1 ("events refused"). Control:
    the honest projection replays the same events."""
    batch = [published(n) for n in range(3)]
    await mark_published(pg, batch)

    async def bug(tx: Any, event: Event) -> None:
        raise RuntimeError(f"handler bug quoting {event.payload['provider_receipt']}")

    with pytest.raises(ReplayHandlerFailed) as failed:
        await do_replay(pg_dsn, greedy(bug, every=2))
    assert failed.value.fields["error"] == "RuntimeError"
    assert failed.value.fields["operation_id"] == "pub-0"
    assert "rc0" not in str(failed.value)
    assert await pg.fetchval("SELECT count(*) FROM demo_projection.published_reports") == 0
    assert await pg.fetchval("SELECT count(*) FROM ops.replay_runs WHERE finished_at IS NULL") == 1
    summary = await do_replay(pg_dsn, demo_app.projection_of(REPORT_PROJECTION))
    assert summary.applied == 3


async def test_a_rebuild_records_what_postgresql_refuses_for_its_content_and_goes_on(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """A handler's statement PostgreSQL refuses for the event's content (SQLSTATE class 22,
    23 or 42: the live consumer poisons such an event and goes on) is recorded with the
    consumer's poison reason, and the rebuild goes on: every other event is applied, the run
    finished. Before, the run stopped at the first one with ReplayHandlerFailed, after the
    reset had committed with the first batch: the projection held part of its rows, and a
    run again stopped at the same event. An event that no longer decodes is recorded too
    (reason by its error, no SQLSTATE), and `accord replay` exits 1 for either."""
    batch = [published(n) for n in range(12)]
    await mark_published(pg, batch)

    async def refused_content(tx: Any, event: Event) -> None:
        await tx.execute("SELECT 1 / 0")  # 22012: the same every time

    summary = await do_replay(pg_dsn, greedy(refused_content, every=4), rebuild=True, batch=5)
    refused = {"pub-0", "pub-4", "pub-8"}
    assert (summary.events, summary.applied, summary.refused) == (12, 9, 3)
    assert {(r.operation_id, r.reason, r.sqlstate) for r in summary.refusals} == {
        (op, "data_exception", "22012") for op in refused
    }
    rows = await pg.fetch("SELECT operation_id FROM demo_projection.published_reports")
    assert {r["operation_id"] for r in rows} == {e.operation_id for e in batch} - refused
    ledger = await pg.fetch(
        "SELECT operation_id, reason, sqlstate FROM ops.replay_refusals WHERE run_id = $1",
        summary.run_id,
    )
    assert {tuple(r) for r in ledger} == {(op, "data_exception", "22012") for op in refused}
    run = await pg.fetchrow("SELECT * FROM ops.replay_runs WHERE run_id = $1", summary.run_id)
    assert run["finished_at"] is not None and run["refused"] == 3

    # an event that no longer decodes: recorded, the others applied, the command exits 1
    await pg.execute(
        "UPDATE relay.outbox SET body = 'not json'::bytea WHERE operation_id = 'pub-5'"
    )
    done = run_cli(pg_dsn, "replay", "--workflow", REPORT_PROJECTION, "--since", "2h")
    assert done.returncode == 1, done.stderr
    assert "operation_id=pub-5" in done.stdout and "reason=malformed\n" in done.stdout
    assert "applied=11 refused=0 skipped=1" in done.stdout
    [(reason, sqlstate)] = await pg.fetch(
        "SELECT reason, sqlstate FROM ops.replay_refusals WHERE operation_id = 'pub-5'"
    )
    assert (reason, sqlstate) == ("malformed", None)


async def test_a_rebuild_that_a_defect_refuses_everywhere_changes_nothing(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """What refuses every event is the handler's or the schema's defect, not the events'
    content: a missing table (class 42) ends the run with ReplayHandlerFailed, and a content
    refusal met by every event of a rebuild's first batch is refused with RebuildIncomplete;
    either way the reset is rolled back with the first batch and the projection keeps its
    rows (before the review of 0064, both were recorded and passed: the reset committed and
    the rebuild left an empty projection). Control: the honest rebuild."""
    batch = [published(n) for n in range(6)]
    await mark_published(pg, batch)
    honest = demo_app.projection_of(REPORT_PROJECTION)
    assert (await do_replay(pg_dsn, honest)).applied == 6
    count = "SELECT count(*) FROM demo_projection.published_reports"

    async def missing_table(tx: Any, event: Event) -> None:
        await tx.execute("INSERT INTO demo_projection.no_such_table VALUES (1)")  # 42P01

    async def refused_content(tx: Any, event: Event) -> None:
        await tx.execute("SELECT 1 / 0")

    with pytest.raises(ReplayHandlerFailed) as failed:
        await do_replay(pg_dsn, greedy(missing_table, every=1), rebuild=True, batch=4)
    assert failed.value.fields["sqlstate"] == "42P01" and failed.value.fields["run_id"] is None
    assert await pg.fetchval(count) == 6
    with pytest.raises(RebuildIncomplete) as incomplete:
        await do_replay(pg_dsn, greedy(refused_content, every=1), rebuild=True, batch=4)
    assert incomplete.value.fields["refused"] == 4
    assert incomplete.value.fields["first_reason"] == "data_exception"
    assert await pg.fetchval(count) == 6
    assert (await do_replay(pg_dsn, honest, rebuild=True)).applied == 6  # control


async def test_a_deadlock_or_a_timeout_is_tried_again_then_interrupts_the_run(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """A statement timeout (the server's state, not the event's) is tried again on the
    event's savepoint: met once, every event is applied; met at every try, the run stops
    with ReplayInterrupted, which the command reports as temporary (exit 75), its batch
    rolled back (control: the first case)."""
    batch = [published(n) for n in range(6)]
    await mark_published(pg, batch)
    tries: dict[str, int] = {}

    def timing_out(times: int) -> Callable[[Any, Event], Awaitable[None]]:
        async def slow(tx: Any, event: Event) -> None:
            tries[event.operation_id] = tries.get(event.operation_id, 0) + 1
            if tries[event.operation_id] <= times:
                await tx.execute("SET LOCAL statement_timeout = '10ms'")
                await tx.execute("SELECT pg_sleep(1)")

        return slow

    summary = await do_replay(pg_dsn, greedy(timing_out(1), every=3))
    assert (summary.applied, summary.refused, tries) == (6, 0, {"pub-0": 2, "pub-3": 2})
    tries.clear()
    with pytest.raises(ReplayInterrupted) as stopped:
        await do_replay(pg_dsn, greedy(timing_out(99), every=3))
    assert stopped.value.fields["error"] == "QueryCanceledError"
    assert (stopped.value.fields["operation_id"], tries) == ("pub-0", {"pub-0": 3})
    assert temporary(stopped.value)


async def test_replay_older_than_retention_is_refused(pg_dsn: str, pg: asyncpg.Connection) -> None:
    await mark_published(pg, [published(1)])
    # Control: inside the window.
    since = datetime.now(UTC) - timedelta(seconds=30)
    summary = await do_replay(
        pg_dsn, demo_app.projection_of(REPORT_PROJECTION), since=since, retention_s=60.0
    )
    assert summary.applied == 1
    with pytest.raises(ReplayWindowExceeded):
        await do_replay(pg_dsn, demo_app.projection_of(REPORT_PROJECTION), retention_s=60.0)
    too_old = run_cli(pg_dsn, "replay", "--workflow", REPORT_PROJECTION, "--since", "2h",
                      ACCORD_RELAY_RETENTION_S="60")  # fmt: skip
    assert too_old.returncode == 2
    assert "ReplayWindowExceeded" in too_old.stderr
    with pytest.raises(UnknownProjection):
        demo_app.projection_of("report")


async def test_a_run_in_progress_is_kept_however_long_ago_it_began(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """A replay holds its run (HOLD_RUN) until it finishes: another replay's prune of the
    ledger keeps it and its refusals, however long ago it began (0053; before, a run begun
    before the retention was removed under the replay, whose next refusal then failed on
    its foreign key). Control: the same run once its replay let go of it."""
    replaying = await asyncpg.connect(pg_dsn)
    try:
        run_id = await replaying.fetchval(replay_sql.START_RUN, REPORT_PROJECTION, BASE)
        await replaying.execute(replay_sql.HOLD_RUN, run_id)
        await pg.execute(
            "UPDATE ops.replay_runs SET started_at = now() - interval '100 days' WHERE run_id = $1",
            run_id,
        )
        assert await prune_ledger(pg, retention_s=86400.0) == (0, 0)
        await replaying.execute(  # the replay goes on: its refusal is recorded
            replay_sql.RECORD_REFUSAL, run_id, REPORT_PROJECTION, "acme", "op", uuid.uuid4(),
            "report.published.v1", 1, "insufficient_privilege", "42501", "refused",
        )  # fmt: skip
        assert await prune_ledger(pg, retention_s=86400.0) == (0, 0)
        await replaying.execute(replay_sql.RELEASE_RUN, run_id)
        assert await prune_ledger(pg, retention_s=86400.0) == (1, 1)
    finally:
        await replaying.close()


async def test_the_replay_ledger_is_bounded_and_its_counter_never_goes_back(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """Two replays refused 3 events each; the first one ended 100 days ago. The ledger's
    retention (90 days, batches of 2) removes the old run and its 3 refusals and keeps the
    recent run's (control: the recent run is inside the retention). The refusal counter that
    status and /metrics read stays at 6: its totals are kept apart (0041). A run in progress
    is never taken: a run that began long ago and never ended is."""
    batch = [published(n) for n in range(12)]
    await mark_published(pg, batch)
    old = await do_replay(pg_dsn, greedy(forbidden_submit, every=4), rebuild=True)
    recent = await do_replay(pg_dsn, greedy(forbidden_submit, every=4), rebuild=True)
    assert (old.refused, recent.refused) == (3, 3)
    await pg.execute(
        "UPDATE ops.replay_runs SET started_at = started_at - interval '100 days',"
        " finished_at = finished_at - interval '100 days' WHERE run_id = $1",
        old.run_id,
    )
    dead = await pg.fetchval(
        "INSERT INTO ops.replay_runs (workflow, since, started_at) VALUES ($1, now(),"
        " now() - interval '100 days') RETURNING run_id",
        REPORT_PROJECTION,
    )
    running = await pg.fetchval(
        "INSERT INTO ops.replay_runs (workflow, since) VALUES ($1, now()) RETURNING run_id",
        REPORT_PROJECTION,
    )
    ninety_days = 90 * 86400.0
    # bounded: 2 of the old run's 3 refusals, and the dead run (it has none)
    assert tuple(await pg.fetchrow(PRUNE_ONE, ninety_days, 2)) == (1, 2)
    assert await prune_ledger(pg, retention_s=ninety_days, batch=2) == (1, 1)
    assert await prune_ledger(pg, retention_s=ninety_days, batch=2) == (0, 0)
    runs = {r["run_id"] for r in await pg.fetch("SELECT run_id FROM ops.replay_runs")}
    assert runs == {recent.run_id, running}  # not old, not dead
    assert await pg.fetchval("SELECT count(*) FROM ops.replay_refusals") == 3
    report = await collect_status(pg)
    assert [(x.workflow, x.refusals) for x in report.replay_refusals] == [(REPORT_PROJECTION, 6)]
    assert dead not in runs
    with pytest.raises(asyncpg.InvalidParameterValueError):
        await pg.fetchrow(PRUNE_ONE, ninety_days, 0)


async def test_accord_replay_prunes_the_ledger_it_writes(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """The ledger's one writer prunes it at its start: a run that ended 100 days ago is gone
    after `accord replay`, the run it just made is kept."""
    await mark_published(pg, [published(1)])
    old = await do_replay(pg_dsn, demo_app.projection_of(REPORT_PROJECTION))
    await pg.execute(
        "UPDATE ops.replay_runs SET started_at = now() - interval '100 days',"
        " finished_at = now() - interval '100 days'"
    )
    done = run_cli(pg_dsn, "replay", "--workflow", REPORT_PROJECTION, "--since", "1h")
    assert done.returncode == 0, done.stderr
    assert "replay ledger: removed 1 runs and 0 refused events" in done.stdout
    runs = [r["run_id"] for r in await pg.fetch("SELECT run_id FROM ops.replay_runs")]
    assert len(runs) == 1 and old.run_id not in runs


async def test_a_rebuild_that_could_not_apply_every_event_is_refused(
    pg: asyncpg.Connection, pg_dsn: str
) -> None:
    """A rebuild empties the projection and applies the retained events again: refused,
    nothing changed, when a row's event would not be applied (older than --since, or pruned
    by the relay), instead of deleting that row for good. Control: from the oldest retained
    event, before any prune, the rebuild runs and equals the projection. A replay without
    --rebuild from before the latest pruned event is refused too (before, with a longer
    retention than the relay's, it applied the events left and exited 0)."""
    projection = demo_app.projection_of(REPORT_PROJECTION)
    await mark_published(pg, [published(n, minute=n) for n in range(3)])
    await pg.execute(
        "UPDATE relay.outbox SET enqueued_at = now() - interval '2 hours' WHERE id = 1"
    )
    await do_replay(pg_dsn, projection, since=datetime.now(UTC) - timedelta(hours=3), rebuild=True)
    rows = [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)]
    assert len(rows) == 3
    with pytest.raises(RebuildIncomplete) as refused:  # --since 1h leaves the first one out
        await do_replay(pg_dsn, projection, rebuild=True)
    assert "oldest" in refused.value.fields
    assert [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)] == rows
    # The relay prunes the oldest event: no rebuild from then on, whatever --since.
    await pg.execute(
        "UPDATE relay.outbox SET published_at = now() - interval '2 days' WHERE id = 1"
    )
    async with pg.transaction():
        assert await relay_outbox.prune(pg, 86400.0, 100) == 1
    since = datetime.now(UTC) - timedelta(hours=3)
    after = await pg.fetchval("SELECT through + interval '1 microsecond' FROM relay.pruned")
    for start in (since, after):
        with pytest.raises((RebuildIncomplete, ReplayWindowExceeded)) as refused:
            await do_replay(pg_dsn, projection, since=start, rebuild=True)
        assert "pruned_through" in refused.value.fields
    assert isinstance(refused.value, RebuildIncomplete)  # from after the pruned event too
    assert [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)] == rows
    # Without --rebuild it applies on top, from after what the relay pruned; from before,
    # it would be incomplete: refused whatever retention this process was given.
    with pytest.raises(ReplayWindowExceeded) as window:
        await do_replay(pg_dsn, projection, since=since)
    assert "pruned_through" in window.value.fields
    summary = await do_replay(pg_dsn, projection, since=after)
    assert (summary.events, summary.refused) == (2, 0)
    assert [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)] == rows


async def test_a_replay_applies_only_the_tenants_the_projection_serves(
    pg: asyncpg.Connection, pg_dsn: str
) -> None:
    """A projection whose consumer serves acme only (the live consumer refuses globex's
    events): its replay applies acme's events, not globex's. Before, replay applied every
    tenant's. Control: served for every tenant (none declared, or '*'), it applies both;
    `--tenant` on the command line decides too."""
    demo = demo_app.projection_of(REPORT_PROJECTION)
    await mark_published(pg, [published(n, tenant="acme" if n % 2 else "globex") for n in range(4)])
    acme = demo_app.projection_of(REPORT_PROJECTION, ("acme",))
    assert acme.tenant_filter == ["acme"] and demo.tenant_filter == []
    summary = await do_replay(pg_dsn, acme)
    assert (summary.events, summary.applied) == (2, 2)
    assert {r["tenant"] for r in await pg.fetch(PROJECTION_ROWS)} == {"acme"}
    everyone = demo_app.projection_of(REPORT_PROJECTION, ("*",))
    summary = await do_replay(pg_dsn, everyone, rebuild=True)
    assert (summary.events, summary.applied) == (4, 4)
    assert {r["tenant"] for r in await pg.fetch(PROJECTION_ROWS)} == {"acme", "globex"}
    done = run_cli(pg_dsn, "replay", "--workflow", REPORT_PROJECTION, "--since", "1h",
                   "--tenant", "globex")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "events=2 applied=2" in done.stdout
    refused = run_cli(pg_dsn, "replay", "--workflow", REPORT_PROJECTION, "--since", "1h",
                      "--tenant", "acme,globex")  # fmt: skip
    assert refused.returncode == 2 and "ConfigError" in refused.stderr


async def test_a_rebuild_of_some_tenants_is_refused_while_others_have_events(
    pg: asyncpg.Connection, pg_dsn: str
) -> None:
    """The reset empties every tenant's rows. A rebuild of acme alone, where globex's events
    made rows too, would leave those gone for good: their live consumer takes redeliveries
    for duplicates. Refused, nothing changed, whether or not the live consumer's inbox
    still names globex (it is pruned after its own window; the outbox, which a rebuild needs
    whole, holds every event). Before: globex's rows deleted, exit 0. Control: every
    tenant rebuilds; acme alone replays on top."""
    batch = [published(n, tenant="acme" if n % 2 else "globex") for n in range(4)]
    await mark_published(pg, batch)
    live = Consumer(REPORT_PROJECTION, CATALOG, 7 * 86400.0)
    async with pg.transaction():  # the live consumer's inbox: it applied all four
        for event in batch:
            assert await reserve(pg, live, event, Delivery())
    everyone = demo_app.projection_of(REPORT_PROJECTION, ("*",))
    await do_replay(pg_dsn, everyone, rebuild=True)  # control: the rows it made
    rows = [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)]
    assert {r[0] for r in rows} == {"acme", "globex"}
    acme = demo_app.projection_of(REPORT_PROJECTION, ("acme",))
    for inbox in ("kept", "pruned"):
        if inbox == "pruned":
            await pg.execute("DELETE FROM consumers.inbox")
        with pytest.raises(RebuildIncomplete) as refused:
            await do_replay(pg_dsn, acme, rebuild=True)
        assert refused.value.fields["other_tenants"] == ["globex"]
    done = run_cli(pg_dsn, "replay", "--workflow", REPORT_PROJECTION, "--since", "1h",
                   "--rebuild", "--tenant", "acme")  # fmt: skip
    assert done.returncode == 2 and "other_tenants" in done.stderr, done.stderr
    assert [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)] == rows
    summary = await do_replay(pg_dsn, acme)  # without --rebuild: on top, nothing emptied
    assert (summary.events, summary.applied) == (2, 2)
    assert [tuple(r) for r in await pg.fetch(PROJECTION_ROWS)] == rows


# -- a rebuild beside the live consumer ---------------------------------------------------

# Advisory locks waited for under the rebuild guard's key (accord.ops.sql.REBUILD_GUARD).
GUARD_WAITS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    " AND classid = 1633903460::oid"
)


async def test_a_rebuild_beside_the_live_consumer_loses_no_event(
    pg: asyncpg.Connection, pg_dsn: str
) -> None:
    """The projection's consumer and a rebuild never interleave so that an event is emptied
    and not applied again (before, one the consumer applied between the rebuild's snapshot and
    its reset was lost, and so was one applied before the relay marked its row published).
    1. A consumer transaction in flight (its event's outbox row still pending): the rebuild
       waits for it, then reads that event and applies it again.
    2. A consumer transaction that begins while the rebuild's reset is not committed does not
       get the guard (it rolls back and tries again later), then commits on top: its row
       stays."""
    projection = demo_app.projection_of(REPORT_PROJECTION)
    project = projection.handlers.get(published(0))
    await mark_published(pg, [published(n, minute=n) for n in range(3)])
    in_flight, newer = published(10, minute=10), published(11, minute=11)
    async with pg.transaction():
        await enqueue(pg, in_flight)  # pending: the relay has not settled it yet
    entered, gate = anyio.Event(), anyio.Event()
    handlers = Handlers(REPORT_PROJECTION)

    @handlers.on("report.published", 1)
    async def pausing(tx: Any, event: Event) -> None:
        await project(tx, event)
        if event.operation_id == "pub-0" and not gate.is_set():
            entered.set()  # in the first batch: the reset is done, not committed
            await gate.wait()

    paused = Projection(REPORT_PROJECTION, handlers, projection.reset_statements)
    consumer = await asyncpg.connect(pg_dsn)
    summaries: list[Any] = []

    async def rebuild(target: Projection) -> None:
        summaries.append(await do_replay(pg_dsn, target, rebuild=True))

    try:
        # 1. The consumer's transaction holds the guard, shared, and applied its event.
        live = consumer.transaction()
        await live.start()
        assert await consumer.fetchval(consumer_sql.PROJECTION_GUARD, REPORT_PROJECTION)
        await project(consumer, in_flight)
        async with anyio.create_task_group() as tg:
            tg.start_soon(rebuild, projection)
            await wait_for(lambda: _equals(pg, GUARD_WAITS, 1), within=10)
            assert not summaries  # the rebuild waits for the consumer's commit
            await live.commit()
        assert (summaries[0].events, summaries[0].applied) == (4, 4)
        ops = {r["operation_id"] for r in await pg.fetch(PROJECTION_ROWS)}
        assert ops == {"pub-0", "pub-1", "pub-2", "pub-10"}

        # 2. The rebuild holds the guard until its reset commits: the consumer cannot have it.
        async with anyio.create_task_group() as tg:
            tg.start_soon(rebuild, paused)
            await entered.wait()
            async with pg.transaction():
                await enqueue(pg, newer)  # after the rebuild's snapshot
            async with consumer.transaction():
                assert not await consumer.fetchval(consumer_sql.PROJECTION_GUARD, REPORT_PROJECTION)
            gate.set()
        async with consumer.transaction():  # the reset committed: it has it, and applies
            assert await consumer.fetchval(consumer_sql.PROJECTION_GUARD, REPORT_PROJECTION)
            await project(consumer, newer)
        assert (summaries[1].events, summaries[1].applied) == (4, 4)  # newer: not in it
        ops = {r["operation_id"] for r in await pg.fetch(PROJECTION_ROWS)}
        assert ops == {"pub-0", "pub-1", "pub-2", "pub-10", "pub-11"}
    finally:
        await consumer.close()


@pytest.mark.timeout(120)
async def test_a_projection_s_consumer_runtime_waits_for_a_rebuild_s_reset(
    pg_dsn: str, pg: asyncpg.Connection, amqp_url: str, broker_names: BrokerNames
) -> None:
    """The consumer runtime of a projection (``RuntimeConfig(projection=True)``, what `accord
    consume` sets for one) takes the rebuild guard first in its transaction: while a rebuild
    holds it, a delivery is neither reserved nor applied; once it is released, it is. The
    wait is no message's fault: it outlasts the database's statement_timeout here (0.5 s)
    and costs no retry, however long the rebuild's first batch takes (before, the consumer
    waited inside a statement: a timeout requeued the message as a retry, and a few such
    rebuilds poisoned it as retries_exhausted, lost to the projection)."""
    topo = await declare_demo(amqp_url, broker_names)
    config = RuntimeConfig(workflow=REPORT_PROJECTION, tenants=frozenset({"*"}), projection=True)
    consumer = ConsumerRuntime(
        config=config, amqp_url=amqp_url, pg_dsn=pg_dsn, topology=topo, catalog=CATALOG,
        handlers=demo_app.projection_of(REPORT_PROJECTION).handlers,
    )  # fmt: skip
    relay = Relay(
        RelayConfig(pg_dsn=pg_dsn, amqp_url=amqp_url, exchange=topo.exchange, poll_s=0.05)
    )
    inbox_rows = "SELECT count(*) FROM consumers.inbox WHERE consumer = 'report_projection'"
    rebuilder = await asyncpg.connect(pg_dsn)
    database = await pg.fetchval("SELECT current_database()")
    await pg.execute(f'ALTER DATABASE "{database}" SET statement_timeout = 500')
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer.run)
            tg.start_soon(relay.run)
            await enqueue_all(pg, [published(1)])
            await wait_for(lambda: _equals(pg, inbox_rows, 1), within=30)  # control: applied
            async with rebuilder.transaction():
                await rebuilder.execute(replay_sql.REBUILD_GUARD, REPORT_PROJECTION)
                await enqueue_all(pg, [published(2)])
                await wait_for(lambda: _published(pg, 2), within=30)
                await anyio.sleep(2.0)  # four statement timeouts
                assert await pg.fetchval(inbox_rows) == 1  # reserved nothing meanwhile
            await wait_for(lambda: _equals(pg, inbox_rows, 2), within=30)
            consumer.stop()
            relay.stop()
    finally:
        await rebuilder.close()
        await pg.execute(f'ALTER DATABASE "{database}" RESET statement_timeout')
    assert (consumer.stats.retried, consumer.stats.poisoned) == (0, 0)
    ops = {r["operation_id"] for r in await pg.fetch(PROJECTION_ROWS)}
    assert ops == {"pub-1", "pub-2"}
