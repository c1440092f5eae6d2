"""Tracing helpers shared by relay and consumers: W3C context in and out, messaging attributes.

The ``create`` span runs in the domain transaction and its context is stored with the
outbox row; the relay's ``publish`` span and each consumer ``process`` span *link* to
that stored context (DESIGN.md §10), so a duplicate shows as two ``process`` spans
linked to one ``create``. Attribute names come from the OpenTelemetry messaging
semantic conventions (the contrib aio-pika instrumentation supports only aio-pika < 10).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.semconv._incubating.attributes import messaging_attributes as msg
from opentelemetry.trace import Link, SpanContext

TRACER_NAME = "accord"
SYSTEM = "rabbitmq"

ATTR_SYSTEM = msg.MESSAGING_SYSTEM
ATTR_OPERATION_TYPE = msg.MESSAGING_OPERATION_TYPE
ATTR_OPERATION_NAME = msg.MESSAGING_OPERATION_NAME
ATTR_DESTINATION = msg.MESSAGING_DESTINATION_NAME
ATTR_MESSAGE_ID = msg.MESSAGING_MESSAGE_ID
ATTR_ROUTING_KEY = msg.MESSAGING_RABBITMQ_DESTINATION_ROUTING_KEY
ATTR_DELIVERY_TAG = msg.MESSAGING_RABBITMQ_MESSAGE_DELIVERY_TAG
ATTR_CONSUMER_GROUP = msg.MESSAGING_CONSUMER_GROUP_NAME
# accord's own attributes (no semconv equivalent)
ATTR_REDELIVERED = "messaging.rabbitmq.redelivered"
ATTR_DELIVERY_COUNT = "messaging.rabbitmq.delivery_count"
ATTR_INBOX_OUTCOME = "accord.inbox.outcome"
ATTR_TENANT = "accord.tenant"
ATTR_OPERATION_ID = "accord.operation_id"


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def current_context_headers() -> dict[str, str]:
    """The current span's W3C ``traceparent``/``tracestate`` (empty when not tracing)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def span_context_from(carrier: Mapping[str, str] | None) -> SpanContext | None:
    """The remote span context in a stored or received carrier, if any is valid."""
    if not carrier:
        return None
    ctx = propagate.extract(dict(carrier))
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def links_from(carrier: Mapping[str, str] | None) -> list[Link]:
    """A link to the producer's ``create`` span, when the carrier holds one."""
    span_context = span_context_from(carrier)
    return [Link(span_context)] if span_context is not None else []
