"""The demo's domain write: accepting a report submission announces it, in one commit.

Invariant: a submission row exists if and only if its ``report.accepted.v1`` outbox row does
(both are written in the caller's transaction), so the relay delivers exactly the
submissions that committed. The operation id is minted here, once per business request
(``report:<report id>``); accepting the same report again is idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from accord.demo import sql
from accord.demo.catalog import demo_catalog
from accord.demo.errors import SubmissionConflict
from accord.relay import enqueue_joined
from accord.schemas.db import Tx, require_transaction
from accord.schemas.errors import InvalidEvent
from accord.schemas.events import Catalog, Event

ACCEPTED = "report.accepted"
PUBLISHED = "report.published"


class SubmissionState(StrEnum):
    """Mirrors ``submissions_state_check``."""

    ACCEPTED = "accepted"
    PUBLISHED = "published"


@dataclass(frozen=True, slots=True)
class Report:
    """One published report row (written by the report job's fenced publish)."""

    tenant: str
    report_id: str
    job_id: int | None  # None once retention has removed the job's history (0003)
    object_key: str
    provider_receipt: str | None
    published_at: datetime
    generation: int

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> Report:
        return cls(
            tenant=row["tenant"],
            report_id=row["report_id"],
            job_id=row["job_id"],
            object_key=row["object_key"],
            provider_receipt=row["provider_receipt"],
            published_at=row["published_at"],
            generation=row["generation"],
        )


def operation_for(report_id: str) -> str:
    """The operation id of the request to produce report ``report_id``."""
    return f"report:{report_id}"


def _accepted_event(tenant: str, report_id: str, subject: str, **identity: Any) -> Event:
    try:
        return Event(
            tenant=tenant,
            operation_id=operation_for(report_id),
            type=ACCEPTED,
            version=1,
            payload={"report_id": report_id, "subject": subject},
            **identity,
        )
    except ValidationError as exc:
        fields = sorted({".".join(map(str, e["loc"])) for e in exc.errors()})
        raise InvalidEvent(event_type=f"{ACCEPTED}.v1", fields=fields) from None


async def accept_submission(
    tx: Tx, tenant: str, report_id: str, subject: str, *, catalog: Catalog | None = None
) -> Event:
    """Runs in the caller's transaction; never commits. Records the submission and enqueues
    ``report.accepted.v1`` for it, in that transaction; returns the event.

    Idempotent: the same (tenant, report id, subject) again returns the original event and
    enqueues nothing. Raises SubmissionConflict for the same report id with another subject,
    InvalidEvent (before writing) for identifiers or a subject the catalog refuses, and
    NotInTransaction without an open transaction.
    """
    require_transaction(tx)
    catalog = catalog if catalog is not None else demo_catalog()
    event = _accepted_event(tenant, report_id, subject)
    # The submission and its event's outbox row in one statement (relay.enqueue_joined,
    # which validates the event before writing): the row only when the submission is new.
    joined = await enqueue_joined(
        tx,
        sql.INSERT_SUBMISSION,
        tenant,
        report_id,
        subject,
        event.operation_id,
        event.event_id,
        event.occurred_at,
        event=event,
        catalog=catalog,
    )
    if joined.rows:
        return event
    row = await tx.fetchrow(sql.SUBMISSION, tenant, report_id)
    if row["subject"] != subject:
        raise SubmissionConflict(tenant=tenant, report_id=report_id)
    return _accepted_event(
        tenant, report_id, subject, event_id=row["event_id"], occurred_at=row["accepted_at"]
    )


async def report(conn: Any, tenant: str, report_id: str) -> Report | None:
    """Read-only: the published report, if any."""
    row = await conn.fetchrow(sql.REPORT, tenant, report_id)
    return None if row is None else Report.from_record(row)
