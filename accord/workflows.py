"""The demo's handler registry: what each workflow class's consumer does with its events.

A consumer starts work only through the jobs module's idempotent ``submit`` (DESIGN.md
§7), in the consumer's own transaction, so the job exists if and only if the inbox row
does. Redelivering an event never resets an existing job: ``submit`` returns it untouched
whatever its state; a job under the same operation with another digest is a permanent
conflict (poisoned), never an overwrite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accord.ops.projections import report_projection
from consumers import Handlers, InboxConflict
from jobs import JobConflict, store
from schemas.errors import ConfigError
from schemas.events import Catalog, Event


def report_handlers(catalog: Catalog) -> Handlers:
    """Workflow class ``report``: report.accepted.v1 submits the report job."""
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def submit_report(tx: Any, event: Event) -> None:
        digest = catalog.digest(event)
        try:
            await store.submit(
                tx,
                tenant=event.tenant,
                workflow="report",
                operation_id=event.operation_id,
                digest=digest,
                payload=dict(event.payload),
            )
        except JobConflict as exc:
            raise InboxConflict(
                "the job for this operation was submitted with another digest",
                tenant=event.tenant,
                operation_id=event.operation_id,
                job_id=getattr(exc, "job_id", None),
                stored_digest=getattr(exc, "existing_digest", None),
                incoming_digest=digest,
            ) from exc

    return handlers


def report_projection_handlers(catalog: Catalog) -> Handlers:
    """``report_projection``: the live read model of published reports (replayable)."""
    return report_projection(catalog).handlers


WORKFLOWS: dict[str, Callable[[Catalog], Handlers]] = {
    "report": report_handlers,
    "report_projection": report_projection_handlers,
}


def handlers_for(workflow: str, catalog: Catalog) -> Handlers:
    """The registered handlers of one workflow class; ConfigError for an unknown class."""
    try:
        build = WORKFLOWS[workflow]
    except KeyError:
        raise ConfigError(
            "no handlers are registered for this workflow class",
            workflow=workflow,
            known=sorted(WORKFLOWS),
        ) from None
    return build(catalog)
