"""The invoicing application, declared as one ``accord.App``
(``--app examples.invoicing.app:app``), written only against accord's public API.

What it declares:

* the ``invoice_delivery`` consumer class: ``invoice.issued.v1`` submits the delivery job;
* the ``invoice_delivery`` job, with two effects owned by two providers: ``mail.send``
  (provider ``mailer``) then ``archive.store`` (provider ``archive``), then a fenced publish
  that marks the invoice sent and announces ``invoice.sent.v1``;
* the providers: each owns its own keys, and only the owner's receipt lookup is ever asked
  about an effect (``accord reconcile``). With ``INVOICING_ARCHIVE_LOOKUP=false`` the archive
  offers no lookup, so its unknown effects are never resolved by reconcile (a person resolves
  them with ``accord repair resolve-effect``; reconcile only escalates them);
* the ``invoice_ledger`` projection (``invoice.sent.v1`` → ``invoicing_ledger.sent_invoices``);
* its migrations (``migrations/``).

Its settings are its own (``INVOICING_MAILER_URL``, ``INVOICING_ARCHIVE_URL``,
``INVOICING_ARCHIVE_LOOKUP``), read once, when first needed. Whether the archive has a lookup
is a declaration, so that one setting is read when this module is imported.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, SettingsConfigDict

from accord import (
    AccordError,
    App,
    Event,
    FailedBeforeDispatch,
    JobContext,
    Receipt,
    ReceiptLookup,
    Success,
    Tx,
)
from examples.invoicing.catalog import CATALOG, ISSUED, SENT, InvoiceIssuedV1, InvoiceSentV1
from examples.invoicing.mailer import MailRefused, ServiceClient

WORKFLOW = "invoice_delivery"
LEDGER = "invoice_ledger"
OWNER = "invoicing-worker"
MAIL_SEND = "mail.send"
ARCHIVE_STORE = "archive.store"


class InvoicingSettings(BaseSettings):
    """The application's own configuration (environment prefix ``INVOICING_``)."""

    model_config = SettingsConfigDict(env_prefix="INVOICING_", frozen=True, extra="ignore")

    # The mail service the delivery job calls and whose receipt lookup reconcile asks.
    mailer_url: str = "http://127.0.0.1:8081"
    # The archive service (the same simulator module, another instance).
    archive_url: str = "http://127.0.0.1:8082"
    # False: the archive provider is declared without a receipt lookup.
    archive_lookup: bool = True


@cache
def settings() -> InvoicingSettings:
    return InvoicingSettings()


@cache
def mailer() -> ServiceClient:
    return ServiceClient(settings().mailer_url, resource="messages")


@cache
def archive() -> ServiceClient:
    return ServiceClient(settings().archive_url, resource="documents")


class InvoiceConflict(AccordError):
    """This invoice id was already issued with other material fields."""

    reason = "invoice_conflict"


# -- SQL (values only as $n parameters; tables in migrations/0001_invoicing.sql) -----------

INSERT_INVOICE = (
    "INSERT INTO invoicing.invoices"
    " (tenant, invoice_id, email, amount_cents, currency, operation_id, event_id, issued_at)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    " ON CONFLICT (tenant, invoice_id) DO NOTHING RETURNING invoice_id"
)
INVOICE = (
    "SELECT tenant, invoice_id, email, amount_cents, currency, operation_id, event_id,"
    " issued_at, state FROM invoicing.invoices WHERE tenant = $1 AND invoice_id = $2"
)
MARK_SENT = (
    "UPDATE invoicing.invoices SET state = 'sent', mail_receipt = $3, archive_receipt = $4,"
    " sent_job_id = $5, sent_generation = $6, sent_at = now()"
    " WHERE tenant = $1 AND invoice_id = $2 AND state = 'issued' RETURNING invoice_id"
)
# The later event (occurred_at, then event id) wins, so the ledger does not depend on
# delivery order, and a redelivery changes nothing.
UPSERT_SENT_INVOICE = """
INSERT INTO invoicing_ledger.sent_invoices AS s
    (tenant, invoice_id, operation_id, event_id, mail_receipt, archive_receipt, sent_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (tenant, invoice_id) DO UPDATE
SET operation_id = EXCLUDED.operation_id, event_id = EXCLUDED.event_id,
    mail_receipt = EXCLUDED.mail_receipt, archive_receipt = EXCLUDED.archive_receipt,
    sent_at = EXCLUDED.sent_at
WHERE (EXCLUDED.sent_at, EXCLUDED.event_id) > (s.sent_at, s.event_id)
"""
RESET_LEDGER = "DELETE FROM invoicing_ledger.sent_invoices"


# -- the application -------------------------------------------------------------------------

app = App("invoicing", catalog=CATALOG, migrations=Path(__file__).parent / "migrations")

delivery = app.consumer(WORKFLOW)


@delivery.on(ISSUED, 1)
async def start_delivery(tx: Tx, event: Event) -> None:
    """Start the delivery job of the invoice's operation (idempotent on the operation)."""
    await app.submit(tx, event, workflow=WORKFLOW)


ledger = app.projection(LEDGER, reset=(RESET_LEDGER,))


@ledger.on(SENT, 1)
async def project_sent(tx: Tx, event: Event) -> None:
    """One ledger row per sent invoice, deterministic in the event."""
    sent = InvoiceSentV1.model_validate(event.payload)
    await tx.execute(
        UPSERT_SENT_INVOICE,
        event.tenant,
        sent.invoice_id,
        event.operation_id,
        event.event_id,
        sent.mail_receipt,
        sent.archive_receipt,
        event.occurred_at,
    )


# -- providers -------------------------------------------------------------------------------


def receipt_lookup(service: str, client: Callable[[], ServiceClient]) -> ReceiptLookup:
    """``service``'s receipt lookup by idempotency key: its receipt, None when it definitely
    never accepted the key; MailLookupFailed (no definite answer) propagates."""

    async def lookup(key: str) -> Receipt | None:
        found = await client().lookup(key)
        if found is None:
            return None
        if found.service != service:  # evidence from another service is no evidence here
            raise RuntimeError(f"{service} lookup answered by {found.service}")
        return Receipt(
            found.receipt_id,
            f"{found.service} receipt {found.receipt_id} for key {key}"
            f" (body sha256 {found.body_sha256}, accepted at {found.accepted_at:.3f})",
        )

    return lookup


mailer_provider = app.provider("mailer", owns=("mail.",), lookup=receipt_lookup("mailer", mailer))
archive_provider = app.provider(
    "archive",
    owns=("archive.",),
    lookup=receipt_lookup("archive", archive) if settings().archive_lookup else None,
)


# -- the delivery job ------------------------------------------------------------------------


async def _effect(
    ctx: JobContext, effect_key: str, client: ServiceClient, intent: dict[str, Any]
) -> str | None:
    """One provider call as an effect: a definite refusal is FailedBeforeDispatch (the job
    may retry); anything else that is not a receipt leaves the effect unknown."""
    key = ctx.idempotency_key(effect_key)

    async def call() -> Success:
        try:
            receipt_id = await client.send(key, {"tenant": ctx.lease.tenant, **intent})
        except MailRefused as exc:
            raise FailedBeforeDispatch(reason=f"{effect_key} refused: {exc}") from exc
        return Success(receipt_id)

    done = await ctx.effect(effect_key, intent, call, idempotency_key=key)
    return done.receipt


def mark_sent(
    ctx: JobContext, issued: InvoiceIssuedV1, mail_receipt: str, archive_receipt: str | None
) -> Callable[[Tx], Awaitable[None]]:
    """The publish callback: database-only writes in the fenced publish transaction."""
    lease = ctx.lease

    async def write(tx: Tx) -> None:
        # The invoice marked sent and invoice.sent enqueued in one statement: the event
        # exists only if the invoice was still issued (the affected-row count, checked by
        # the joined statement itself), so it never announces what was not recorded.
        await app.enqueue_joined(
            tx,
            MARK_SENT,
            lease.tenant,
            issued.invoice_id,
            mail_receipt,
            archive_receipt,
            lease.job_id,
            lease.generation,
            event=Event(
                tenant=lease.tenant,
                operation_id=lease.operation_id,
                type=SENT,
                version=1,
                payload=InvoiceSentV1(
                    invoice_id=issued.invoice_id,
                    mail_receipt=mail_receipt,
                    archive_receipt=archive_receipt,
                ).model_dump(),
            ),
        )

    return write


@app.job(WORKFLOW, owner=OWNER, timeout_s=30, effects=(MAIL_SEND, ARCHIVE_STORE))
async def deliver_invoice(ctx: JobContext) -> None:
    """Mail the invoice, archive it, then mark it sent (fenced) and announce it."""
    issued = InvoiceIssuedV1.model_validate(ctx.payload)
    mail_receipt = await _effect(
        ctx,
        MAIL_SEND,
        mailer(),
        {
            "to": issued.email,
            "subject": f"Invoice {issued.invoice_id}",
            "amount_cents": issued.amount_cents,
            "currency": issued.currency,
        },
    )
    if mail_receipt is None:
        raise RuntimeError("the mailer's success carried no receipt")
    archive_receipt = await _effect(
        ctx,
        ARCHIVE_STORE,
        archive(),
        {
            "invoice_id": issued.invoice_id,
            "amount_cents": issued.amount_cents,
            "currency": issued.currency,
            "mail_receipt": mail_receipt,
        },
    )
    await ctx.publish(mark_sent(ctx, issued, mail_receipt, archive_receipt))


# -- the domain write ------------------------------------------------------------------------


def operation_for(invoice_id: str) -> str:
    """The operation id of issuing (and delivering) invoice ``invoice_id``."""
    return f"invoice:{invoice_id}"


async def issue_invoice(
    tx: Tx, tenant: str, invoice_id: str, email: str, amount_cents: int, currency: str
) -> Event:
    """Runs in the caller's transaction; never commits. Records the invoice and enqueues
    ``invoice.issued.v1`` for it, in that transaction; returns the event.

    Idempotent on (tenant, invoice id): the same invoice again returns the original event and
    enqueues nothing; the same id with other material fields raises InvoiceConflict.
    InvalidEvent (before writing) for fields the catalog refuses.
    """
    if not tx.is_in_transaction():
        raise AccordError("issue_invoice runs in the caller's open transaction")
    payload = {
        "invoice_id": invoice_id,
        "email": email,
        "amount_cents": amount_cents,
        "currency": currency,
    }
    event = Event(
        tenant=tenant,
        operation_id=operation_for(invoice_id),
        type=ISSUED,
        version=1,
        payload=payload,
    )
    # Validated, encoded and digested once, before the first write (InvalidEvent here).
    ready = app.prepare(event)
    inserted = await tx.fetchval(
        INSERT_INVOICE,
        tenant,
        invoice_id,
        email,
        amount_cents,
        currency,
        event.operation_id,
        event.event_id,
        event.occurred_at,
    )
    if inserted is not None:
        await app.enqueue(tx, ready)
        return event
    row = await tx.fetchrow(INVOICE, tenant, invoice_id)
    stored = {k: row[k] for k in payload}
    if stored != payload:
        raise InvoiceConflict(tenant=tenant, invoice_id=invoice_id)
    return event.model_copy(update={"event_id": row["event_id"], "occurred_at": row["issued_at"]})
