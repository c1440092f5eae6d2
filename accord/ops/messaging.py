"""OpenTelemetry messaging metrics, derived from the spans the relay and consumers already emit.

The relay's ``publish`` spans (``messaging.operation.type = send``) and the consumers'
``process`` spans carry the messaging semantic-convention attributes (schemas.telemetry), so
a span processor turns each finished span into the semconv messaging metrics, recorded with
OpenTelemetry SDK instruments and read by the Prometheus exporter's reader into the same
registry as the status collector:

- ``messaging.client.sent.messages`` and ``messaging.client.operation.duration`` per publish,
- ``messaging.client.consumed.messages`` and ``messaging.process.duration`` per delivery.

Attributes are low-cardinality only: system, operation name, destination, the typed error
(``error.type``) and, for deliveries, the inbox outcome (new, duplicate, conflict) — never
message ids, tenants or payloads. The modules that emit the spans stay unaware of metrics.
https://opentelemetry.io/docs/specs/semconv/messaging/messaging-metrics/
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.semconv._incubating.metrics import messaging_metrics as semconv
from opentelemetry.trace import Link, SpanKind, StatusCode, TraceState
from opentelemetry.util.types import Attributes
from prometheus_client import CollectorRegistry

from accord.schemas import telemetry

# Span attributes copied onto the metrics (all bounded sets of values).
_KEPT = (
    telemetry.ATTR_SYSTEM,
    telemetry.ATTR_OPERATION_NAME,
    telemetry.ATTR_DESTINATION,
    telemetry.ATTR_CONSUMER_GROUP,
)


class MessagingMetrics:
    """The semconv messaging instruments on a MeterProvider read into ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reader = PrometheusMetricReader(registry=registry)
        self.provider = MeterProvider(metric_readers=[self.reader])
        meter = self.provider.get_meter("accord.messaging")
        self.sent = semconv.create_messaging_client_sent_messages(meter)
        self.consumed = semconv.create_messaging_client_consumed_messages(meter)
        self.operation_duration = semconv.create_messaging_client_operation_duration(meter)
        self.process_duration = semconv.create_messaging_process_duration(meter)
        self._open = True

    def record(self, span: ReadableSpan) -> None:
        """Record one finished publish or process span (other spans are ignored)."""
        attrs = span.attributes or {}
        kind = attrs.get(telemetry.ATTR_OPERATION_TYPE)
        if not self._open or kind not in ("send", "process") or span.end_time is None:
            return
        seconds = max(0.0, (span.end_time - (span.start_time or span.end_time)) / 1e9)
        labels = _labels(attrs, span)
        if kind == "send":
            self.sent.add(1, labels)
            self.operation_duration.record(seconds, labels)
        else:
            outcome = attrs.get(telemetry.ATTR_INBOX_OUTCOME)
            if isinstance(outcome, str):
                labels[telemetry.ATTR_INBOX_OUTCOME] = outcome
            self.consumed.add(1, labels)
            self.process_duration.record(seconds, labels)

    def span_processor(self) -> SpanProcessor:
        return _SpanMetrics(self)

    def shutdown(self) -> None:
        """Stop recording and detach the reader from its registry."""
        self._open = False
        self.provider.shutdown()


def _labels(attrs: Mapping[str, Any], span: ReadableSpan) -> dict[str, Any]:
    """The kept attributes, and ``error.type`` for a failed operation: the span's own (a
    retried publish or delivery has no error status), else ``_OTHER`` for an error status
    (never its description: free text, perhaps an exception's, is no label value)."""
    labels = {k: attrs[k] for k in _KEPT if isinstance(attrs.get(k), str)}
    error = attrs.get(telemetry.ATTR_ERROR_TYPE)
    if isinstance(error, str):
        labels[telemetry.ATTR_ERROR_TYPE] = error
    elif span.status.status_code is StatusCode.ERROR:
        labels[telemetry.ATTR_ERROR_TYPE] = "_OTHER"
    return labels


class _SpanMetrics(SpanProcessor):
    def __init__(self, metrics: MessagingMetrics) -> None:
        self._metrics = metrics

    def on_end(self, span: ReadableSpan) -> None:
        self._metrics.record(span)


def install_span_metrics(metrics: MessagingMetrics) -> TracerProvider:
    """Attach the span-to-metrics processor to this process's tracer provider (creating and
    installing an SDK provider if none is set). Call once, from the composition root."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        # Not ours to change: its sampler decides what these metrics see, as for its own
        # processors (tracers it gave out keep their sampler whatever we did).
        current.add_span_processor(metrics.span_processor())
        return current
    provider = _MetricsOnlyProvider(metrics.span_processor())
    trace.set_tracer_provider(provider)
    return provider


class _MetricsOnlyProvider(TracerProvider):
    """The provider installed for span metrics alone: its spans stay in the process
    (``telemetry.exporting()`` is false) until another span processor is added to it, an
    exporter's (``accord.telemetry.configure``) or the application's own."""

    def __init__(self, metrics: SpanProcessor) -> None:
        super().__init__()
        # Before any tracer is made from it: every one records what its sampler drops.
        self.sampler = _RecordUnsampled(self.sampler)
        super().add_span_processor(metrics)
        setattr(self, telemetry.METRICS_ONLY, True)

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        setattr(self, telemetry.METRICS_ONLY, False)
        super().add_span_processor(span_processor)


class _RecordUnsampled(Sampler):
    """Another sampler's decisions (OTEL_TRACES_SAMPLER's), except that a span it drops is
    still recorded: span processors, these metrics among them, see every message, while
    exporters pass only sampled spans on (and ``telemetry.span_headers`` carries only their
    contexts). Without it, the metrics counted a sampling ratio's share of the messages."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        result = self.sampler.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )
        if result.decision is Decision.DROP:  # a dropped span's result carries no attributes
            return SamplingResult(Decision.RECORD_ONLY, attributes, result.trace_state)
        return result

    def get_description(self) -> str:
        return f"RecordUnsampled{{{self.sampler.get_description()}}}"
