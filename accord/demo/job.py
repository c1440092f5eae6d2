"""The demo's ``report`` job: call the provider once, render the report, publish it fenced.

Steps, each with its own guarantee:

1. ``ctx.effect("provider.create_report", intent, call)``: the provider request is recorded
   pending (fenced) and journaled before it is sent, with an idempotency key derived from
   (tenant, operation id, effect key), so every attempt of this job asks for the same thing.
   A refusal (nothing accepted) is FailedBeforeDispatch and the job may retry; any other
   failure, including a lost reply, leaves the effect unknown and the job is never retried
   on its own.
2. The report body is rendered and stored as an immutable, content-addressed object. It is
   not authoritative yet: a stale worker's object stays unreferenced (``accord gc-objects``).
3. ``ctx.publish(callback, object_key=...)``: one fenced transaction writes demo.reports,
   marks the submission published and enqueues ``report.published.v1`` (all three in one
   statement, ``enqueue_joined``), and its fenced succeeded statement writes the
   ``jobs.results`` manifest row naming the object; or (fence lost) none of them.
"""

from __future__ import annotations

import json

import anyio

from accord.demo import sql
from accord.demo.catalog import ReportAcceptedV1, demo_catalog
from accord.demo.domain import PUBLISHED
from accord.demo.provider import ProviderClient, ProviderRefused
from accord.jobs.models import Registration
from accord.jobs.runner.config import Handler
from accord.jobs.runner.context import JobContext
from accord.jobs.runner.effects import FailedBeforeDispatch, Success
from accord.jobs.store import Callback, Store
from accord.relay import enqueue, enqueue_joined
from accord.schemas.db import Tx
from accord.schemas.events import Event

WORKFLOW = "report"
#: The queue owner the demo registers for its workflow class.
DEFAULT_OWNER = "accord-worker"
EFFECT_KEY = "provider.create_report"
DEFAULT_TIMEOUT_S = 60.0
CATALOG = demo_catalog()


def render_report(ctx: JobContext, request: ReportAcceptedV1, receipt: str | None) -> bytes:
    """The report body. It names the generation that rendered it, so two attempts' objects
    differ and an unpublished one is visibly not the published one."""
    lease = ctx.lease
    document = {
        "tenant": lease.tenant,
        "report_id": request.report_id,
        "subject": request.subject,
        "provider_receipt": receipt,
        "job_id": lease.job_id,
        "generation": lease.generation,
        "lines": [f"Report on {request.subject}", f"provider receipt: {receipt or 'none'}"],
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def publish_report(
    ctx: JobContext, request: ReportAcceptedV1, object_key: str, receipt: str | None
) -> Callback:
    """The publish callback: database-only writes in the fenced publish transaction."""
    lease = ctx.lease

    async def write(tx: Tx) -> None:
        published = Event(
            tenant=lease.tenant,
            operation_id=lease.operation_id,
            type=PUBLISHED,
            version=1,
            payload={
                "report_id": request.report_id,
                "object_key": object_key,
                "provider_receipt": receipt,
            },
        )
        # The submission marked published, its report row and the event enqueued in one
        # statement. A job submitted without the demo's acceptance (another producer's
        # report.accepted) has no submission: no report row either (its key names one), and
        # the event is enqueued on its own.
        joined = await enqueue_joined(
            tx,
            sql.PUBLISH_REPORT,
            lease.tenant,
            request.report_id,
            lease.job_id,
            object_key,
            receipt,
            lease.generation,
            event=published,
            catalog=CATALOG,
        )
        if not joined.rows:
            await enqueue(tx, published, catalog=CATALOG)

    return write


async def create_at_provider(
    ctx: JobContext, provider: ProviderClient, request: ReportAcceptedV1
) -> str | None:
    """The provider call as an effect; returns the provider's receipt id."""
    intent = {"report_id": request.report_id, "subject": request.subject}
    key = ctx.idempotency_key(EFFECT_KEY)

    async def call() -> Success:
        try:
            receipt = await provider.create_report(key, {"tenant": ctx.lease.tenant, **intent})
        except ProviderRefused as exc:
            raise FailedBeforeDispatch(reason="provider_refused") from exc
        return Success(receipt.receipt_id)

    done = await ctx.effect(EFFECT_KEY, intent, call, idempotency_key=key)
    return done.receipt


def report_handler(provider: ProviderClient, *, draft_s: float = 0.0) -> Handler:
    """The ``report`` job handler, calling ``provider``.

    ``draft_s`` stands for the computation before the external call (a model drafting the
    report): work a lost lease may waste, but that never needs reconciliation.
    """

    async def generate_report(ctx: JobContext) -> None:
        request = ReportAcceptedV1.model_validate(ctx.payload)
        if draft_s > 0:
            await anyio.sleep(draft_s)
        receipt = await create_at_provider(ctx, provider, request)
        object_key = await ctx.put_object(render_report(ctx, request, receipt))
        await ctx.publish(publish_report(ctx, request, object_key, receipt), object_key=object_key)

    return generate_report


async def register_demo(store: Store, owner: str = DEFAULT_OWNER) -> Registration:
    """Register ``owner`` as the queue owner of the demo's class, with effects enabled."""
    return await store.register_workflow(WORKFLOW, owner, effects_enabled=True)
