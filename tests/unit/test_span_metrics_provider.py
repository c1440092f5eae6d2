"""The tracer provider /metrics installs when nothing traces keeps its spans in the process
until another span processor joins it (accord.ops.messaging, schemas.telemetry.exporting)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from accord.ops.messaging import MessagingMetrics, _MetricsOnlyProvider
from accord.schemas.telemetry import METRICS_ONLY


def test_a_metrics_only_provider_exports_once_another_processor_joins_it() -> None:
    metrics = MessagingMetrics(CollectorRegistry())
    try:
        provider = _MetricsOnlyProvider(metrics.span_processor())
        assert getattr(provider, METRICS_ONLY) is True
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))  # an exporter's, say
        assert getattr(provider, METRICS_ONLY) is False
        provider.get_tracer("test").start_span("s").end()
        assert [s.name for s in exporter.get_finished_spans()] == ["s"]
        provider.shutdown()
    finally:
        metrics.shutdown()


def test_the_metrics_see_every_span_the_sampler_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under OTEL_TRACES_SAMPLER=always_off the metrics-only provider still records each span
    (for the messaging metrics) and exports none once an exporter joins."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    metrics = MessagingMetrics(CollectorRegistry())
    try:
        provider = _MetricsOnlyProvider(metrics.span_processor())
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        span = provider.get_tracer("test").start_span("s")
        assert span.is_recording() and not span.get_span_context().trace_flags.sampled
        span.end()
        assert exporter.get_finished_spans() == ()
        provider.shutdown()
    finally:
        metrics.shutdown()
