"""What a batch tells observability: each message's own trace context for the job it submits,
a conflict counted as one, and the settle-time log lines carrying the message's trace ids.

The batch is handed to ``BatchProcessor.process`` directly (as in test_refusals), with a
real OpenTelemetry SDK tracer whose sampler keeps every other span, so that sampled and
unsampled messages share one transaction.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import asyncpg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import StatusCode, Tracer

from accord import observe
from accord.consumers import ConnectionLost, Consumer, Handlers, TransientFailure
from accord.consumers.batch import BatchProcessor
from accord.logs import JsonFormatter
from accord.schemas import telemetry
from accord.schemas.events import Event
from tests.integration.consumers.support import CATALOG, report
from tests.integration.consumers.test_refusals import DOCS, delivered, doc_handlers, with_doc

CONSUMER = "report"


class EveryOther(Sampler):
    """Samples the first span, drops the second, and so on (admit starts them in order)."""

    def __init__(self) -> None:
        self.calls = 0

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        self.calls += 1
        keep = self.calls % 2 == 1
        return SamplingResult(Decision.RECORD_AND_SAMPLE if keep else Decision.DROP)

    def get_description(self) -> str:
        return "every other span"


def tracer() -> Tracer:
    return TracerProvider(sampler=EveryOther()).get_tracer("test")


def processor(handlers: Handlers, spans: Tracer) -> BatchProcessor:
    return BatchProcessor(
        consumer=Consumer(CONSUMER, CATALOG, 7 * 24 * 3600.0),
        handlers=handlers,
        tenants=frozenset({"acme"}),
        queue="t.report",
        delivery_limit=3,
        tracer=spans,
    )


def recording(seen: dict[str, str | None]) -> Handlers:
    """Records what jobs.submit would store as the job's trace context (``accord.trace``);
    a ``doc`` the CHECK refuses sends the batch down the savepoint path."""
    handlers = Handlers(CONSUMER)

    @handlers.on("report.accepted", 1)
    async def store(tx: Any, event: Event) -> None:
        seen[event.operation_id] = await tx.fetchval(
            "SELECT nullif(current_setting('accord.trace', true), '')"
        )
        await tx.execute(
            "INSERT INTO public.docs (operation_id, doc) VALUES ($1, $2::jsonb)",
            event.operation_id,
            event.payload["doc"],
        )

    return handlers


def traceparent(carrier: str | None) -> str | None:
    """The version, trace id and span id of a stored carrier (not the flags)."""
    return None if carrier is None else json.loads(carrier)["traceparent"].rsplit("-", 1)[0]


@pytest.mark.parametrize("path", ["one transaction", "savepoints"])
async def test_each_message_s_job_takes_its_own_trace_context_or_none(
    pg: asyncpg.Connection, path: str
) -> None:
    """Before, an unsampled message's job took the context an earlier sampled message of the
    same transaction had set: its attempts became another operation's children. Control:
    every sampled message's job takes its own span's context."""
    await pg.execute(DOCS)
    events = [with_doc(f'{{"n": {n}}}') for n in range(6)]
    refused = with_doc("[1]")  # 23514: the fast path fails, savepoints follow
    if path == "savepoints":
        events.insert(3, refused)
    messages = [delivered(e, tag) for tag, e in enumerate(events, start=1)]
    seen: dict[str, str | None] = {}
    batch = processor(recording(seen), tracer())
    items = [batch.admit(m) for m in messages]  # type: ignore[arg-type]
    expected = {}
    for item, event in zip(items, events, strict=True):
        ctx = item.span.get_span_context()
        expected[event.operation_id] = (
            f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}" if item.span.is_recording() else None
        )
    await batch._apply(pg, [i for i in items if i.permanent is None])
    assert sum(v is not None for v in expected.values()) >= 3  # control: some were sampled
    applied = {op: traceparent(c) for op, c in seen.items() if op != refused.operation_id}
    assert applied == {op: v for op, v in expected.items() if op in applied}
    assert len(applied) == 6


def deliveries(outcome: str) -> float:
    value = observe.REGISTRY.get_sample_value(
        "accord_consumer_deliveries_total", {"consumer": CONSUMER, "outcome": outcome}
    )
    return value or 0.0


async def test_a_conflict_is_counted_as_one_and_its_log_line_names_its_trace(
    pg: asyncpg.Connection,
) -> None:
    """The same operation with a changed digest is poisoned as a conflict: counted as
    ``conflict`` (before: ``poisoned``, so the series the docs name never appeared), and its
    log line carries the message's trace id (before: logged outside its span). Control: a
    malformed message is counted as ``poisoned``."""
    await pg.execute(DOCS)
    first = with_doc('{"n": 1}')
    changed = first.model_copy(update={"payload": {**first.payload, "subject": "other"}})
    seen: dict[str, str | None] = {}
    spans = TracerProvider().get_tracer("test")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("consumers")
    logger.addHandler(handler)
    before = {o: deliveries(o) for o in ("new", "conflict", "poisoned")}
    try:
        await processor(recording(seen), spans).process(pg, [delivered(first, 1)])  # type: ignore[list-item]
        conflicting = delivered(changed, 2)
        broken = delivered(report(), 3)
        broken.body = b"{not json"
        await processor(recording(seen), spans).process(pg, [conflicting, broken])  # type: ignore[list-item]
    finally:
        logger.removeHandler(handler)
    after = {o: deliveries(o) - before[o] for o in before}
    assert after == {"new": 1.0, "conflict": 1.0, "poisoned": 1.0}
    assert conflicting.settled == ["reject"]
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    poisoned = [line for line in lines if line["message"].startswith("poison reason=conflict")]
    assert len(poisoned) == 1 and len(poisoned[0].get("trace_id", "")) == 32


def exported() -> tuple[Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


async def test_a_retried_delivery_is_no_error_and_its_exception_text_stays_out_of_the_trace(
    pg: asyncpg.Connection,
) -> None:
    """DESIGN §10: an error status only for a terminal outcome. A handler's transient failure
    is retried: its span says why by ``error.type`` (a type name), never by the exception's
    text, which may quote data and would become a metric label."""
    await pg.execute(DOCS)
    spans, exporter = exported()
    secret = "provider busy for alice@example.com"
    batch = processor(doc_handlers([TransientFailure(secret)]), spans)
    retried, refused = delivered(with_doc('{"n": 1}'), 1), delivered(with_doc("not json"), 2)
    await batch.process(pg, [retried])
    await batch.process(pg, [refused])  # control: a poisoned delivery is an error, by reason
    assert (retried.settled, refused.settled) == (["requeue"], ["reject"])
    first, second = exporter.get_finished_spans()
    assert first.status.status_code is StatusCode.UNSET
    assert first.attributes is not None
    assert first.attributes[telemetry.ATTR_ERROR_TYPE] == "TransientFailure"
    assert [e.name for e in first.events] == []
    assert secret not in repr((first.status.description, first.attributes))
    assert second.status.status_code is StatusCode.ERROR
    assert second.status.description == "data_exception"


async def test_a_batch_that_loses_its_connection_marks_each_unsettled_span(
    pg: asyncpg.Connection, pg_dsn: str
) -> None:
    """A batch that ends unsettled (its connection lost) is redelivered: none of its spans may
    read as a successful consume. Control: the same batch on a live connection."""
    await pg.execute(DOCS)
    handlers = Handlers(CONSUMER)
    kill: list[bool] = []

    @handlers.on("report.accepted", 1)
    async def store(tx: Any, event: Event) -> None:
        if kill:
            await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        await tx.execute("INSERT INTO public.docs VALUES ($1, '{}')", event.operation_id)

    for dies in (False, True):
        kill[:] = [True] if dies else []
        spans, exporter = exported()
        batch = processor(handlers, spans)
        messages = [delivered(with_doc("{}"), tag) for tag in (1, 2)]
        conn = await asyncpg.connect(pg_dsn)
        try:
            if dies:
                with pytest.raises(ConnectionLost):
                    await batch.process(conn, messages)  # type: ignore[arg-type]
            else:
                await batch.process(conn, messages)  # type: ignore[arg-type]
        finally:
            await conn.close()
        ended = [s.attributes or {} for s in exporter.get_finished_spans()]
        if dies:
            assert [m.settled for m in messages] == [[], []]
            assert [a.get(telemetry.ATTR_ERROR_TYPE) for a in ended] == ["connection_lost"] * 2
        else:
            assert [m.settled for m in messages] == [[], ["ack-multiple"]]
            assert [a.get(telemetry.ATTR_ERROR_TYPE) for a in ended] == [None, None]
            assert [a.get(telemetry.ATTR_INBOX_OUTCOME) for a in ended] == ["new", "new"]
