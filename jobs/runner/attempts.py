"""An attempt's trace: its ``attempt`` span (a child of the span that submitted the job, linked
to it and to the attempt before), the stored context it is built from, the context kept for
the next attempt, and how the attempt ended, on the span. Tracing and metrics only: with
neither on, nothing here reads or writes the database.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from accord import observe
from accord.jobs.models import Lease
from accord.jobs.runner.endings import Ending, Finished
from accord.jobs.store import Store
from accord.schemas import telemetry
from accord.schemas.db import DB_RETRY_LATER

log = logging.getLogger("accord.worker")
_TRACER = telemetry.tracer()

# The reasons jobs.rescue gives a job it takes back from an expired or rotated lease.
RESCUE_REASONS = frozenset({"lease_expired", "epoch_rotated"})


def seen(leases: list[Lease]) -> dict[int, Any]:
    """For the attempt spans and the submit-to-finish histogram only (none unless tracing
    or serving metrics): each claimed job's stored trace context, its attempts, how the
    previous attempt ended and when it was submitted, as its claim returned them (0036: no
    read of its own)."""
    if not (telemetry.tracing_on() or observe.measuring()):
        return {}
    return {lease.job_id: lease.context for lease in leases if lease.context is not None}


async def keep_trace(store: Store, lease: Lease, span: trace.Span) -> None:
    """Keep the attempt span's context with the job, so the next attempt can link to it
    (only while spans leave the process; a lost connection only costs the link)."""
    if not telemetry.exporting():
        return
    carrier = telemetry.span_headers(span)
    if not carrier:
        return
    try:
        await store.note_trace(lease, carrier)
    except DB_RETRY_LATER as exc:
        log.warning("attempt trace not kept (%s)", type(exc).__name__)


def start_span(lease: Lease, seen: Any) -> trace.Span:
    """The ``attempt`` span of this claim: a child of the ``process`` span that submitted
    the job (every attempt in the operation's one trace), linked to it, with the attempt
    number and how the attempt before it ended."""
    stored = telemetry.carrier_from_json(seen["trace"]) if seen is not None else {}
    attributes: dict[str, Any] = {
        telemetry.ATTR_JOB_ID: lease.job_id,
        telemetry.ATTR_WORKFLOW: lease.workflow,
        telemetry.ATTR_TENANT: lease.tenant,
        telemetry.ATTR_OPERATION_ID: lease.operation_id,
        telemetry.ATTR_ATTEMPT_ID: str(lease.attempt_id),
        telemetry.ATTR_GENERATION: lease.generation,
    }
    previous = None
    if seen is not None:
        attributes[telemetry.ATTR_JOB_ATTEMPT] = seen["attempts"]
        previous = seen["last_error"] if seen["attempts"] > 1 else None
        if previous is not None:
            attributes[telemetry.ATTR_JOB_PREVIOUS_REASON] = previous
    # Linked to the span that submitted the job and, from the second attempt on, to the
    # attempt before it (its context kept by jobs.note_trace while tracing).
    before = telemetry.carrier_from_json(seen["attempt_trace"]) if seen is not None else {}
    span = _TRACER.start_span(
        f"attempt {lease.workflow}",
        context=telemetry.parent_from(stored),
        kind=trace.SpanKind.CONSUMER,
        links=[
            *telemetry.links_from(stored, "job"),
            *telemetry.links_from(before, "previous_attempt"),
        ],
        attributes=attributes,
    )
    if previous in RESCUE_REASONS:
        span.add_event(telemetry.EVENT_RESCUED, {telemetry.ATTR_JOB_REASON: previous})
    return span


def end_span(span: trace.Span, finished: Finished) -> None:
    """How the attempt ended, on its span; an error only when the job's state is terminal."""
    if not span.is_recording():
        return
    span.set_attribute(telemetry.ATTR_JOB_ENDING, str(finished.ending))
    if finished.state is not None:
        span.set_attribute(telemetry.ATTR_JOB_STATE, str(finished.state))
    if finished.reason is not None:
        span.set_attribute(telemetry.ATTR_JOB_REASON, finished.reason)
    if finished.ending is Ending.FENCE_LOST:
        span.add_event(
            telemetry.EVENT_FENCE_REFUSED, {telemetry.ATTR_JOB_REASON: str(finished.reason)}
        )
    if finished.state is not None and str(finished.state) in telemetry.TERMINAL_JOB_STATES:
        span.set_status(Status(StatusCode.ERROR, finished.reason or str(finished.state)))
