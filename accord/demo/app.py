"""The demo application, declared as one ``accord.App`` (``--app accord.demo:app``).

What it declares: the report catalog; the ``report`` consumer class (report.accepted.v1
submits the report job) and the ``report_projection`` projection (report.published.v1 →
demo_projection.published_reports); the ``report`` job, whose one effect
(``provider.create_report``) belongs to the report provider, which offers a receipt lookup by
idempotency key; and its own migrations (accord/demo/migrations).

Its settings are its own (``ACCORD_DEMO_PROVIDER_URL``, ``ACCORD_DEMO_DRAFT_S``), read once,
when a process first needs them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from accord.app import App, Receipt, ReceiptLookup
from accord.demo import job, sql
from accord.demo.catalog import ReportPublishedV1, demo_catalog
from accord.demo.provider import ProviderClient
from accord.jobs.runner import JobContext
from accord.schemas.db import Tx
from accord.schemas.events import Event
from accord.schemas.topology import Topology

WORKFLOW = job.WORKFLOW
PROJECTION = "report_projection"


class DemoSettings(BaseSettings):
    """The demo's own configuration (environment prefix ``ACCORD_DEMO_``)."""

    model_config = SettingsConfigDict(env_prefix="ACCORD_DEMO_", frozen=True, extra="ignore")

    # The provider simulator the report job calls (`python -m accord.demo.provider`) and
    # whose receipt lookup `accord reconcile` asks.
    provider_url: str = "http://127.0.0.1:8077"
    # The report job's drafting time before its provider call (0: none).
    draft_s: float = Field(default=0.0, ge=0)


@cache
def settings() -> DemoSettings:
    return DemoSettings()


@cache
def provider_client() -> ProviderClient:
    return ProviderClient(settings().provider_url)


app = App("demo", catalog=demo_catalog(), migrations=Path(__file__).parent / "migrations")

report = app.consumer(WORKFLOW)


@report.on("report.accepted", 1)
async def submit_report(tx: Tx, event: Event) -> None:
    await app.submit(tx, event, workflow=WORKFLOW)


projection = app.projection(PROJECTION, reset=(sql.RESET_PUBLISHED_REPORTS,))


@projection.on("report.published", 1)
async def project_published(tx: Tx, event: Event) -> None:
    """One row per published report; the later event wins (see sql.UPSERT_PUBLISHED_REPORT)."""
    published = ReportPublishedV1.model_validate(event.payload)
    await tx.execute(
        sql.UPSERT_PUBLISHED_REPORT,
        event.tenant,
        published.report_id,
        event.operation_id,
        event.event_id,
        published.object_key,
        published.provider_receipt,
        event.occurred_at,
    )


def receipt_lookup(client: ProviderClient) -> ReceiptLookup:
    """The report provider's receipt lookup by idempotency key."""

    async def lookup(key: str) -> Receipt | None:
        found = await client.lookup(key)  # ProviderLookupFailed: no definite answer
        if found is None:
            return None
        return Receipt(
            found.receipt_id,
            f"provider receipt {found.receipt_id} for key {key}"
            f" (body sha256 {found.body_sha256}, accepted at {found.accepted_at})",
        )

    return lookup


async def _lookup(key: str) -> Receipt | None:
    return await receipt_lookup(provider_client())(key)


report_provider = app.provider("report_provider", owns=(job.EFFECT_KEY,), lookup=_lookup)


@app.job(
    WORKFLOW,
    owner=job.DEFAULT_OWNER,
    timeout_s=job.DEFAULT_TIMEOUT_S,
    effects=(job.EFFECT_KEY,),
)
async def generate_report(ctx: JobContext) -> None:
    await job.report_handler(provider_client(), draft_s=settings().draft_s)(ctx)


def demo_topology(prefix: str = "demo", delivery_limit: int | None = None) -> Topology:
    """The demo's broker topology under ``prefix`` (tests give each run its own)."""
    topology = app.topology(prefix)
    if delivery_limit is None:
        return topology
    return Topology(
        topology.prefix,
        tuple(replace(wf, delivery_limit=delivery_limit) for wf in topology.workflows),
    )
