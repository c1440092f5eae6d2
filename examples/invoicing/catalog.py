"""The invoicing application's versioned event types."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from accord import Catalog, EventType

ISSUED = "invoice.issued"
SENT = "invoice.sent"


class InvoiceIssuedV1(BaseModel):
    """An invoice was issued: mail it to ``email`` and archive it."""

    model_config = ConfigDict(frozen=True)

    invoice_id: str = Field(min_length=1, max_length=128)
    email: str = Field(min_length=3, max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")
    amount_cents: int = Field(ge=0)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    # Optional additive field (allowed within v1): a note that does not change the meaning.
    memo: str | None = Field(default=None, max_length=500)


class InvoiceSentV1(BaseModel):
    """An invoice was mailed (and archived, when the archive gave a receipt)."""

    model_config = ConfigDict(frozen=True)

    invoice_id: str = Field(min_length=1, max_length=128)
    mail_receipt: str = Field(min_length=1, max_length=200)
    archive_receipt: str | None = Field(default=None, max_length=200)


def invoicing_catalog() -> Catalog:
    return Catalog(
        [
            EventType(
                ISSUED,
                1,
                InvoiceIssuedV1,
                material=("invoice_id", "email", "amount_cents", "currency"),
            ),
            EventType(SENT, 1, InvoiceSentV1),
        ]
    )


CATALOG = invoicing_catalog()
