"""The demo application's versioned event types (the report workflow).

An application builds its own ``Catalog`` and hands it to its ``accord.App``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from accord.schemas.events import Catalog, EventType


class ReportAcceptedV1(BaseModel):
    """A report request was accepted: generate the report for ``subject``."""

    model_config = ConfigDict(frozen=True)

    report_id: str = Field(min_length=1, max_length=128)
    subject: str = Field(min_length=1, max_length=2000)
    # Optional additive field (allowed within v1): a hint that does not change the meaning.
    priority: int | None = Field(default=None, ge=0, le=9)


class ReportPublishedV1(BaseModel):
    """A report was generated and published under the fence."""

    model_config = ConfigDict(frozen=True)

    report_id: str = Field(min_length=1, max_length=128)
    object_key: str = Field(min_length=1, max_length=200)
    provider_receipt: str | None = None


def demo_catalog() -> Catalog:
    return Catalog(
        [
            # priority is a scheduling hint, not part of what the report means.
            EventType("report.accepted", 1, ReportAcceptedV1, material=("report_id", "subject")),
            EventType("report.published", 1, ReportPublishedV1),
        ]
    )
