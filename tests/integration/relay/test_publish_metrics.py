"""A publish that failed and will be retried is a failed send in the messaging metrics, and
the metrics count every message whatever the trace sampler keeps (accord.ops.messaging)."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from accord.ops.messaging import MessagingMetrics, _MetricsOnlyProvider
from accord.relay import Relay, outbox
from accord.relay.errors import PublishTimeout
from accord.relay.outbox import OutboxState
from accord.schemas import telemetry
from accord.schemas.topology import Topology
from accord.schemas.wire import WireMessage
from tests.integration.relay import helpers

SENT = "messaging_client_sent_messages_total"


class TimingOut:
    """A double at the broker seam: every other publish gets no confirm in time."""

    def __init__(self) -> None:
        self.calls = 0

    async def publish(self, message: WireMessage, *, confirm_timeout_s: float) -> None:
        self.calls += 1
        if self.calls % 2 == 0:
            raise PublishTimeout(event_id=message.message_id)

    def broken(self) -> bool:
        return False

    async def writable(self) -> None:
        return None


def sent(registry: CollectorRegistry) -> dict[str | None, float]:
    """Sent messages by error.type (None: no error)."""
    totals: dict[str | None, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == SENT:
                key = sample.labels.get("error_type") or None
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


async def test_a_publish_to_be_retried_is_a_failed_send_and_unsampled_ones_count(
    pg_dsn: str, amqp_url: str, topo: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six rows, three published and three timed out (retried later: no error status on
    their spans). Before, all six were counted as sent with no error.type, and under a
    sampler keeping nothing none were counted. Control: no span is exported."""
    await helpers.enqueue_committed(pg_dsn, [helpers.make_event(n) for n in range(6)])
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    registry = CollectorRegistry()
    metrics = MessagingMetrics(registry)
    provider = _MetricsOnlyProvider(metrics.span_processor())  # what /metrics installs
    exported = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    relay._tracer = provider.get_tracer("test")
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            rows = await outbox.claim(conn, uuid.uuid4(), 10, 30.0)
        outcomes = await relay._publish_batch(TimingOut(), rows)
    finally:
        await conn.close()
        provider.shutdown()
    states = sorted(str(o.state) for o in outcomes)
    assert states == sorted([str(OutboxState.PUBLISHED)] * 3 + [str(OutboxState.PENDING)] * 3)
    try:
        assert sent(registry) == {None: 3.0, "timeout": 3.0}
    finally:
        metrics.shutdown()
    assert exported.get_finished_spans() == ()  # sampled out: recorded for metrics only
    span = provider.get_tracer("t").start_span("s")
    assert span.is_recording() and telemetry.span_headers(span) == {}
