"""enqueue: the caller's transaction, typed refusals before any write, one statement."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any

import asyncpg
import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from accord.demo.catalog import ReportPublishedV1
from accord.relay import DuplicateEvent, Prepared, outbox, prepare, sql
from accord.schemas.errors import InvalidEvent, NotInTransaction, PayloadTooLarge, UnknownEventType
from accord.schemas.events import Catalog, Event, EventType
from tests.integration.relay.helpers import make_event
from tests.support import DEMO_CATALOG, enqueue, filtered_out, logged_plans


async def count(pg: asyncpg.Connection) -> int:
    return int(await pg.fetchval("SELECT count(*) FROM relay.outbox"))


async def test_enqueue_writes_in_the_callers_transaction_and_never_commits(
    pg: asyncpg.Connection,
) -> None:
    async with pg.transaction():
        await enqueue(pg, make_event(1))  # control: committed by the caller
    assert await count(pg) == 1
    tx = pg.transaction()
    await tx.start()
    await enqueue(pg, make_event(2))
    assert pg.is_in_transaction()  # enqueue did not commit
    await tx.rollback()
    assert await count(pg) == 1


async def test_enqueue_without_a_transaction_is_refused(pg: asyncpg.Connection) -> None:
    with pytest.raises(NotInTransaction):
        await enqueue(pg, make_event(1))
    assert await count(pg) == 0


BAD_EVENTS = pytest.mark.parametrize(
    ("event", "error"),
    [
        (make_event(1, pad=1500), PayloadTooLarge),
        (
            Event(tenant="a", operation_id="o", type="no.such", version=1, payload={}),
            UnknownEventType,
        ),
        (
            Event(tenant="a", operation_id="o", type="report.accepted", version=7, payload={}),
            UnknownEventType,
        ),
        (
            Event(
                tenant="a",
                operation_id="o",
                type="report.accepted",
                version=1,
                payload={"report_id": "r\x00", "subject": "s"},
            ),
            InvalidEvent,
        ),
        (
            Event(
                tenant="a",
                operation_id="o",
                type="report.accepted",
                version=1,
                payload={"report_id": "r", "subject": "s", "unexpected": 1},
            ),
            InvalidEvent,
        ),
    ],
    ids=["oversize", "unknown-type", "unknown-version", "nul", "extra-field"],
)


@BAD_EVENTS
async def test_bad_events_raise_typed_errors_before_any_write(
    pg: asyncpg.Connection, event: Event, error: type[Exception]
) -> None:
    queries: list[str] = []
    pg.add_query_logger(lambda record: queries.append(record.query))
    async with pg.transaction():
        with pytest.raises(error):
            await enqueue(pg, event, max_payload_bytes=1024)
        assert not [q for q in queries if "relay.outbox" in q]
        # control: the transaction is still usable, and a fitting payload passes
        await enqueue(pg, make_event(9, pad=900), max_payload_bytes=1024)
    assert await count(pg) == 1


@BAD_EVENTS
def test_prepare_raises_the_same_typed_errors_with_no_database(
    event: Event, error: type[Exception]
) -> None:
    """``prepare`` runs before the transaction (no connection at all): it refuses what
    ``enqueue`` refuses, with the same errors."""
    with pytest.raises(error):
        prepare(event, catalog=DEMO_CATALOG, max_payload_bytes=1024)


async def test_a_prepared_event_is_written_as_prepared_and_checked_at_enqueue(
    pg: asyncpg.Connection,
) -> None:
    event = make_event(5, pad=900)
    ready = prepare(event, catalog=DEMO_CATALOG)
    assert isinstance(ready, Prepared) and ready.digest == DEMO_CATALOG.digest(event)
    queries: list[str] = []
    pg.add_query_logger(lambda record: queries.append(record.query))
    async with pg.transaction():
        # The enqueue's own limit still holds: this body is over 512 bytes.
        with pytest.raises(PayloadTooLarge):
            await enqueue(pg, ready, max_payload_bytes=512)
        # Another catalog judges it again: one without the type refuses it.
        other = Catalog([EventType("report.published", 1, ReportPublishedV1)])
        with pytest.raises(UnknownEventType):
            await enqueue(pg, ready, catalog=other)
        assert not [q for q in queries if "relay.outbox" in q]
        # control: the transaction goes on, and the prepared event is written as prepared
        row_id = await enqueue(pg, ready)
    row = await pg.fetchrow("SELECT event_id, body, digest FROM relay.outbox WHERE id = $1", row_id)
    assert (row["event_id"], bytes(row["body"]), row["digest"]) == (
        event.event_id,
        ready.body,
        ready.digest,
    )
    # Its event id is its identity: enqueued again, it is a duplicate.
    with pytest.raises(DuplicateEvent):
        async with pg.transaction():
            await enqueue(pg, ready)
    assert await count(pg) == 1


async def test_a_prepared_event_built_by_hand_is_prepared_again(
    pg: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only ``prepare`` issues a Prepared whose body and digest enqueue writes as given. One
    built by hand, or a prepared one with its body replaced, carries a body and a digest
    nobody computed from its event: enqueue prepares the event again and writes what that
    gives. Control: ``prepare``'s own is not prepared again."""
    calls: list[Event] = []
    real = Catalog.prepare

    def counting(self: Catalog, event: Event, limit: int) -> tuple[bytes, str]:
        calls.append(event)
        return real(self, event, limit)

    ready = prepare(make_event(1), catalog=DEMO_CATALOG)
    monkeypatch.setattr(Catalog, "prepare", counting)
    forged = [
        Prepared(make_event(2), b'{"forged":true}', "sha256:forged", DEMO_CATALOG),
        dataclasses.replace(prepare(make_event(3), catalog=DEMO_CATALOG), body=b"{}"),
    ]
    calls.clear()
    async with pg.transaction():
        await enqueue(pg, ready)  # control
        assert calls == []
        ids = [await enqueue(pg, p) for p in forged]
    assert [e.event_id for e in calls] == [p.event.event_id for p in forged]
    for row_id, p in zip(ids, forged, strict=True):
        row = await pg.fetchrow("SELECT body, digest FROM relay.outbox WHERE id = $1", row_id)
        assert row["digest"] == DEMO_CATALOG.digest(p.event)
        assert bytes(row["body"]) != p.body  # the event's own body, not the one given


async def test_enqueue_is_one_statement(pg: asyncpg.Connection) -> None:
    queries: list[str] = []
    async with pg.transaction():
        pg.add_query_logger(lambda record: queries.append(record.query))
        await enqueue(pg, make_event(1))
    assert queries[0] == sql.ENQUEUE
    assert queries[1:] == ["COMMIT;"] or len(queries) == 1


async def test_duplicate_event_id_is_a_typed_error(pg: asyncpg.Connection) -> None:
    event = make_event(1)
    async with pg.transaction():
        await enqueue(pg, event)
    other_tenant = event.model_copy(update={"tenant": "tenant-b"})
    async with pg.transaction():
        await enqueue(pg, other_tenant)  # control: unique within its tenant only
    with pytest.raises(DuplicateEvent):
        async with pg.transaction():
            await enqueue(pg, event)
    assert await count(pg) == 2


async def test_row_keeps_exact_body_digest_and_notifies(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    heard: list[str] = []
    listener = await asyncpg.connect(pg_dsn)
    await listener.add_listener(sql.NOTIFY_CHANNEL, lambda *args: heard.append(args[2]))
    event = make_event(3)
    async with pg.transaction():
        row_id = await enqueue(pg, event)
    row = await pg.fetchrow("SELECT * FROM relay.outbox WHERE id = $1", row_id)
    assert row["event_id"] == event.event_id
    assert json.loads(bytes(row["body"])) == event.payload
    assert row["state"] == "pending" and row["attempts"] == 0
    assert len(row["digest"]) == 64
    for _ in range(50):
        if heard:
            break
        await listener.execute("SELECT 1")
    await listener.close()
    assert heard == [sql.NOTIFY_CHANNEL]


def memory_exporter() -> InMemorySpanExporter:
    """Attach an in-memory exporter to the global SDK provider (installing one if needed)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


async def test_enqueue_stores_the_create_span_context(pg: asyncpg.Connection) -> None:
    """The create span is a child of the caller's current span (the request that enqueued),
    and the row stores the create span's own context, in the caller's trace."""
    exporter = memory_exporter()
    event = make_event(4)
    with trace.get_tracer("test").start_as_current_span("handle request") as request:
        async with pg.transaction():
            await enqueue(pg, event)
    stored = await pg.fetchval("SELECT trace FROM relay.outbox")
    create = [s for s in exporter.get_finished_spans() if s.name.startswith("create ")]
    assert len(create) == 1
    span = create[0]
    caller = request.get_span_context()
    assert span.parent is not None and span.parent.span_id == caller.span_id
    assert span.context.trace_id == caller.trace_id
    assert span.kind is SpanKind.PRODUCER
    assert span.attributes is not None
    assert span.attributes["messaging.system"] == "rabbitmq"
    assert span.attributes["messaging.operation.type"] == "create"
    assert span.attributes["messaging.message.id"] == str(event.event_id)
    traceparent = json.loads(stored)["traceparent"]
    assert traceparent.split("-")[1:3] == [
        format(caller.trace_id, "032x"),
        format(span.context.span_id, "016x"),
    ]


async def test_the_caller_s_baggage_is_not_kept_with_the_row(pg: asyncpg.Connection) -> None:
    """The row keeps what the wire carries (W3C traceparent, tracestate), not the caller's
    baggage: a user's e-mail in it would stay in the outbox for the retention, sent nowhere."""
    memory_exporter()
    with trace.get_tracer("test").start_as_current_span("handle request"):
        token = context.attach(baggage.set_baggage("user.email", "alice@example.com"))
        try:
            async with pg.transaction():
                await enqueue(pg, make_event(5))
        finally:
            context.detach(token)
    stored = json.loads(await pg.fetchval("SELECT trace FROM relay.outbox"))
    assert set(stored) == {"traceparent"}  # control: the context itself is kept


async def test_enum_mirrors_the_check_constraint(pg: asyncpg.Connection) -> None:
    definition = await pg.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'outbox_state_check'"
    )
    assert set(re.findall(r"'(\w+)'::text", definition)) == {s.value for s in outbox.OutboxState}


async def test_every_statement_prepares(pg: asyncpg.Connection) -> None:
    fragments = ("NOTIFY_CHANNEL", "JOINED_OUTBOX_ID", "OUTBOX_PARAMS", "AWAKE_MARGIN_S", "WAKE")
    names = [n for n in dir(sql) if n.isupper() and n not in fragments]
    assert {"ENQUEUE", "CLAIM", "SETTLE", "PRUNE"} <= set(names)
    for name in names:
        await pg.prepare(getattr(sql, name))
    assert f"pg_notify('{sql.NOTIFY_CHANNEL}'" in sql.ENQUEUE


async def test_claim_uses_the_eligibility_index(pg: asyncpg.Connection) -> None:
    await pg.execute("SET enable_seqscan = off")
    await pg.execute("SET plan_cache_mode = force_generic_plan")
    await pg.execute(f"PREPARE claim(int, uuid, float8) AS {sql.CLAIM}")
    rows = await pg.fetch(f"EXPLAIN EXECUTE claim(10, '{uuid.uuid4()}', 30)")
    plan = "\n".join(r[0] for r in rows)
    assert "outbox_eligible_idx" in plan and "Index Cond" in plan


# The claim as it was before 0019: pending rows in id order, rows in backoff skipped.
_CLAIM_BY_ID = sql.CLAIM.replace(
    "AND COALESCE(lease_expires_at, enqueued_at) <= now()\n", ""
).replace("ORDER BY COALESCE(lease_expires_at, enqueued_at), id", "ORDER BY id")


async def test_a_backlog_in_backoff_is_never_read_by_the_claim(pg: asyncpg.Connection) -> None:
    """20,000 pending rows waiting out a backoff ahead of 5 due ones: the claim takes the 5
    and reads none of the others (the index range stops at now()). Control: the claim in id
    order, as before 0019, takes the same 5 after reading every waiting row."""
    await pg.execute(
        "INSERT INTO relay.outbox (event_id, tenant, operation_id, type, version, digest, body,"
        " occurred_at, lease_expires_at, attempts)"
        " SELECT gen_random_uuid(), 'acme', 'op-' || i, 'report.accepted', 1, 'd', '{}'::bytea,"
        " now(), now() + interval '1 hour', 1 FROM generate_series(1, 20000) i"
    )  # ahead of the due rows in id order
    async with pg.transaction():
        for i in range(5):
            await enqueue(pg, make_event(100_000 + i))
    await pg.execute("ANALYZE relay.outbox")

    async def claim(statement: str) -> tuple[int, int]:
        tx = pg.transaction()
        await tx.start()
        try:  # measured, then rolled back: nothing is claimed for real
            plan = await pg.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", 50, uuid.uuid4(), 30.0
            )
        finally:
            await tx.rollback()
        nodes = _nodes(json.loads(plan)[0]["Plan"])
        scan = next(
            n
            for n in nodes
            if n.get("Relation Name") == "outbox"
            and "Scan" in n["Node Type"]
            and "Actual Rows" in n
            and n["Node Type"] != "ModifyTable"
        )
        return scan["Actual Rows"], scan.get("Rows Removed by Filter", 0)

    assert await claim(sql.CLAIM) == (5, 0)
    taken, skipped = await claim(_CLAIM_BY_ID)  # control
    assert taken == 5 and skipped >= 20_000


async def test_settling_a_batch_reads_its_rows_not_the_pending_backlog(
    pg: asyncpg.Connection,
) -> None:
    """Statistics of a quiet outbox (published rows, few pending), then 20,000 pending rows
    (a broker outage's backlog): settling a claimed batch of 10 reads those 10, by primary
    key, under a custom plan (a connection's first five executions, or every one behind a
    pooler). Control: with `state = 'pending'` as it was spelled, the plan reads the pending
    backlog through outbox_eligible_idx for each batch."""
    await pg.execute(
        "INSERT INTO relay.outbox (event_id, tenant, operation_id, type, version, digest, body,"
        " occurred_at, state, published_at)"
        " SELECT gen_random_uuid(), 'acme', 'old-' || i, 'report.accepted', 1, 'd', '{}'::bytea,"
        " now(), 'published', now() FROM generate_series(1, 2000) i"
    )
    await pg.execute("ANALYZE relay.outbox")
    async with pg.transaction():
        for i in range(10):
            await enqueue(pg, make_event(200_000 + i))
    await pg.execute(
        "INSERT INTO relay.outbox (event_id, tenant, operation_id, type, version, digest, body,"
        " occurred_at) SELECT gen_random_uuid(), 'acme', 'op-' || i, 'report.accepted', 1,"
        " 'd', '{}'::bytea, now() FROM generate_series(1, 20000) i"
    )
    token = uuid.uuid4()
    rows = await outbox.claim(pg, token, 10, 30.0)
    assert len(rows) == 10
    done = [
        outbox.Settlement(r.id, outbox.OutboxState.PUBLISHED, publish_id=uuid.uuid4()) for r in rows
    ]
    await pg.execute("SET plan_cache_mode = force_custom_plan")

    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        control = pg.transaction()
        await control.start()
        before = sql.SETTLE.replace("o.state IS NOT DISTINCT FROM 'pending'", "o.state = 'pending'")
        assert before != sql.SETTLE
        await pg.execute(before, token, [d.id for d in done], ["published"] * 10, [None] * 10,
                         [d.publish_id for d in done], [0.0] * 10)  # fmt: skip
        await control.rollback()
        walked = [n for p in plans for n in filtered_out(p)]
        assert max(walked, default=0) >= 20_000, plans

        plans.clear()
        assert await outbox.settle(pg, token, done) == 10
    plan = next(p for p in plans if "Update on outbox" in p)
    assert "outbox_pkey" in plan and "outbox_eligible_idx" not in plan, plan
    assert all(n <= 10 for n in filtered_out(plan)), plan


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in _nodes(child))]
