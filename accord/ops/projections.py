"""Projections: read models rebuilt from events, and the demo's ``report_projection``.

A projection is a workflow class whose handlers only write projection tables. Its handlers
run twice in the system's life: live, inside the consumer runtime's transaction (after the
inbox reserved the operation), and on replay, under the ``accord_projection`` principal
(accord.ops.replay). They must therefore be deterministic in the event alone and idempotent
(an upsert where the later event wins), so the rebuilt projection equals the live one
whatever the delivery order or the number of redeliveries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accord.ops import sql
from accord.ops.errors import UnknownProjection
from consumers import Handlers
from schemas.catalog import ReportPublishedV1
from schemas.events import Catalog, Event

REPORT_PROJECTION = "report_projection"


@dataclass(frozen=True, slots=True)
class Projection:
    """A projection's handlers and how to empty its tables before a rebuild."""

    workflow: str
    handlers: Handlers
    reset_statements: tuple[str, ...]

    @property
    def event_types(self) -> list[str]:
        """The versioned event types the projection is built from."""
        return list(self.handlers)

    async def reset(self, tx: Any) -> None:
        """Runs in the caller's transaction (under the projection principal); never commits."""
        for statement in self.reset_statements:
            await tx.execute(statement)


def report_projection(catalog: Catalog) -> Projection:
    """``report_projection``: one row per published report in demo_projection.published_reports."""
    handlers = Handlers(REPORT_PROJECTION)

    @handlers.on("report.published", 1)
    async def project_published(tx: Any, event: Event) -> None:
        report = ReportPublishedV1.model_validate(event.payload)
        await tx.execute(
            sql.UPSERT_PUBLISHED_REPORT,
            event.tenant,
            report.report_id,
            event.operation_id,
            event.event_id,
            report.object_key,
            report.provider_receipt,
            event.occurred_at,
        )

    return Projection(REPORT_PROJECTION, handlers, (sql.RESET_PUBLISHED_REPORTS,))


PROJECTIONS: dict[str, Callable[[Catalog], Projection]] = {REPORT_PROJECTION: report_projection}


def projection_for(workflow: str, catalog: Catalog) -> Projection:
    """The registered projection of ``workflow``; UnknownProjection otherwise (replay only
    ever runs projections: a workflow class that starts work has none)."""
    try:
        build = PROJECTIONS[workflow]
    except KeyError:
        raise UnknownProjection(workflow=workflow, known=sorted(PROJECTIONS)) from None
    return build(catalog)
