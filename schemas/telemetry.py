"""Tracing helpers shared by relay, consumers and jobs: W3C context in and out, and every
attribute name accord puts on a span, in one place (documented in docs/operations.md).

One trace per operation (DESIGN.md §10): the ``create`` span runs in the domain transaction
and its context is stored with the outbox row; each relay ``publish`` attempt and each
consumer ``process`` delivery *links* to that stored context, so a duplicate shows as two
``process`` spans linked to one ``create``. A job keeps the context of the ``process`` span
that submitted it (``jobs.jobs.trace``); each claim's ``attempt`` span is its child and
links to it, and each effect is a child of its attempt. An error status marks only a
terminal outcome (poison, held, failed, unknown), never an attempt a retry fixed.

Messaging attribute names come from the OpenTelemetry semantic conventions (the contrib
aio-pika instrumentation supports only aio-pika < 10); accord's own are ``accord.*``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import messaging_attributes as msg
from opentelemetry.trace import Link, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER_NAME = "accord"
SYSTEM = "rabbitmq"

# -- messaging semantic conventions -------------------------------------------------------
ATTR_SYSTEM = msg.MESSAGING_SYSTEM
ATTR_OPERATION_TYPE = msg.MESSAGING_OPERATION_TYPE
ATTR_OPERATION_NAME = msg.MESSAGING_OPERATION_NAME
ATTR_DESTINATION = msg.MESSAGING_DESTINATION_NAME
ATTR_MESSAGE_ID = msg.MESSAGING_MESSAGE_ID
ATTR_ROUTING_KEY = msg.MESSAGING_RABBITMQ_DESTINATION_ROUTING_KEY
ATTR_DELIVERY_TAG = msg.MESSAGING_RABBITMQ_MESSAGE_DELIVERY_TAG
ATTR_CONSUMER_GROUP = msg.MESSAGING_CONSUMER_GROUP_NAME
# RabbitMQ delivery facts with no semconv name (yet), kept under its namespace.
ATTR_REDELIVERED = "messaging.rabbitmq.redelivered"
ATTR_DELIVERY_COUNT = "messaging.rabbitmq.delivery_count"

# -- accord's own ---------------------------------------------------------------------------
ATTR_TENANT = "accord.tenant"
ATTR_OPERATION_ID = "accord.operation_id"
# The relay: one publish attempt of one outbox row.
ATTR_PUBLISH_ID = "accord.publish_id"
ATTR_PUBLISH_ATTEMPT = "accord.attempt"  # the outbox row's attempts, this one included
ATTR_PREVIOUS_REASON = "accord.previous_reason"  # why the attempt before this one failed
ATTR_RELAY_REASON = "accord.relay.reason"  # why this attempt failed
ATTR_RELAY_OUTCOME = "accord.relay.outcome"  # published | retry | held
# The consumer: one delivery.
ATTR_INBOX_OUTCOME = "accord.inbox.outcome"  # new | duplicate | conflict
ATTR_POISON_REASON = "accord.poison.reason"
# Semconv: the typed failure of an operation that failed (a publish to be retried, a delivery
# requeued or poisoned), whatever the span's status; the messaging metrics label it.
ATTR_ERROR_TYPE = "error.type"
# The jobs module: one claim of one job (an attempt) and what it did.
ATTR_JOB_ID = "accord.job.id"
ATTR_WORKFLOW = "accord.job.workflow"
ATTR_JOB_ATTEMPT = "accord.job.attempt"  # the job's attempts, this claim included
ATTR_ATTEMPT_ID = "accord.job.attempt_id"
ATTR_GENERATION = "accord.job.generation"
ATTR_JOB_PREVIOUS_REASON = "accord.job.previous_reason"  # how attempt N-1 ended (last_error)
ATTR_JOB_ENDING = "accord.job.ending"  # published | failed | deadline | stopped | fence_lost ...
ATTR_JOB_STATE = "accord.job.state"  # the job's state after this attempt's write-back
ATTR_JOB_REASON = "accord.job.reason"  # the typed reason of this attempt's ending
ATTR_EFFECT_KEY = "accord.effect.key"
ATTR_EFFECT_SEQ = "accord.effect.seq"
ATTR_IDEMPOTENCY_KEY = "accord.effect.idempotency_key"
ATTR_EFFECT_OUTCOME = "accord.effect.outcome"  # succeeded | failed_before_dispatch | unknown
ATTR_EFFECT_REUSED = "accord.effect.reused"  # an earlier attempt's receipt, not dispatched
ATTR_RECONCILE_JOB_STATE = "accord.reconcile.job_state"  # the job's state after resolving
# A link's own attribute: why this span points at the other one.
ATTR_LINK_REASON = "accord.link"  # create | job | resolves

# Span events (each with ATTR_JOB_REASON or ATTR_RELAY_REASON naming the typed reason).
EVENT_FENCE_REFUSED = "accord.fence_refused"  # a write-back the fence refused
EVENT_EFFECT_BEGUN = "accord.effect.begun"  # recorded pending, before dispatch
EVENT_RESCUED = "accord.job.rescued"  # this attempt exists because rescue re-queued the job
EVENT_CANCELED = "accord.job.canceled"  # the job was canceled under this attempt

# Terminal job states: the only ones that mark an attempt span as an error.
TERMINAL_JOB_STATES = frozenset({"failed", "poison", "unknown"})


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


# The providers that mean nothing is traced (a tuple: isinstance with ``A | B`` builds the
# union at every call, and enqueue asks between the awaits of the caller's transaction).
_NOT_TRACING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def tracing_on() -> bool:
    """Whether this process installed a tracer provider (else every span is a no-op, and work
    done only for spans can be skipped)."""
    return not isinstance(trace.get_tracer_provider(), _NOT_TRACING)


#: Set on a tracer provider whose spans never leave the process: the one
#: accord.ops.install_span_metrics installs so that spans feed the messaging metrics when
#: nothing traces (it clears it once any other span processor is added to it).
METRICS_ONLY = "accord_metrics_only"


def exporting() -> bool:
    """Whether this process's spans may leave it: a tracer provider other than one that only
    feeds this process's metrics. A round trip done only so that a later span can link to
    this one (an attempt's or an effect's context kept with the job) is skipped otherwise:
    measured, a worker serving /metrics without tracing paid about three more commits per
    job for them (docs/bench-log.md, 2026-12-04)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, _NOT_TRACING) and not getattr(provider, METRICS_ONLY, False)


# W3C Trace Context alone: what the wire carries (traceparent, tracestate). The global
# propagator also writes the caller's baggage, which an outbox row would keep (perhaps
# personal data) and nothing would send.
_W3C = TraceContextTextMapPropagator()


def current_context_headers() -> dict[str, str]:
    """The current span's W3C ``traceparent``/``tracestate`` (empty when not tracing)."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier


def span_headers(span: trace.Span) -> dict[str, str]:
    """``span``'s W3C context as a carrier (empty for a span not sampled: not exported, even
    when recorded for the messaging metrics)."""
    if not span.is_recording() or not span.get_span_context().trace_flags.sampled:
        return {}
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def carrier_from_json(value: Any) -> dict[str, str]:
    """A stored carrier (jsonb, as text or decoded) as a dict of strings; {} when absent."""
    if value is None:
        return {}
    loaded = json.loads(value) if isinstance(value, str) else value
    if not isinstance(loaded, Mapping):
        return {}
    return {str(k): v for k, v in loaded.items() if isinstance(v, str)}


def span_context_from(carrier: Mapping[str, str] | None) -> SpanContext | None:
    """The remote span context in a stored or received carrier, if any is valid."""
    if not carrier:
        return None
    ctx = _W3C.extract(dict(carrier))
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def links_from(carrier: Mapping[str, str] | None, why: str = "create") -> list[Link]:
    """A link to the span whose context the carrier holds (the producer's ``create`` by
    default), naming why; [] when the carrier holds none."""
    span_context = span_context_from(carrier)
    if span_context is None:
        return []
    return [Link(span_context, {ATTR_LINK_REASON: why})]


def parent_from(carrier: Mapping[str, str] | None) -> Any:
    """An OpenTelemetry Context whose parent is the span in the carrier (None: no parent)."""
    span_context = span_context_from(carrier)
    if span_context is None:
        return None
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))
