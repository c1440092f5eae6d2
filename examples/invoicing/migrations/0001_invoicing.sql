-- The invoicing application's tables: its domain (schema `invoicing`) and its projection
-- (schema `invoicing_ledger`). Applied by `accord migrate --app examples.invoicing.app:app`
-- after accord's own chain, in the same ledger (component `invoicing`).
--
-- invoicing.invoices is written by issue_invoice, in the same transaction as the outbox row
-- of invoice.issued.v1, and updated to 'sent' only by the delivery job's fenced publish, in
-- the same transaction as the outbox row of invoice.sent.v1.
CREATE SCHEMA invoicing;

CREATE TABLE invoicing.invoices (
    tenant          text        NOT NULL CHECK (tenant <> ''),
    invoice_id      text        NOT NULL CHECK (invoice_id <> ''),
    email           text        NOT NULL,
    amount_cents    bigint      NOT NULL CHECK (amount_cents >= 0),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    -- The operation this invoice started and the event that announced it (an idempotent
    -- re-issue returns that same event).
    operation_id    text        NOT NULL,
    event_id        uuid        NOT NULL,
    issued_at       timestamptz NOT NULL,
    state           text        NOT NULL DEFAULT 'issued',
    mail_receipt    text,
    archive_receipt text,
    sent_job_id     bigint,
    sent_generation bigint,
    sent_at         timestamptz,
    PRIMARY KEY (tenant, invoice_id),
    CONSTRAINT invoices_state_check CHECK (state IN ('issued', 'sent')),
    CONSTRAINT invoices_sent_check CHECK ((state = 'sent') = (mail_receipt IS NOT NULL))
);

-- The delivery job runs as the execution principal (accord_worker): its fenced publish marks
-- the invoice sent; it never inserts or deletes invoices on its own account.
GRANT USAGE ON SCHEMA invoicing TO accord_worker;
GRANT SELECT, INSERT, UPDATE ON invoicing.invoices TO accord_worker;

-- The ledger of sent invoices, rebuilt from invoice.sent.v1 alone (no wall-clock columns:
-- a rebuild by `accord replay` compares row for row with the live projection).
CREATE SCHEMA invoicing_ledger;

CREATE TABLE invoicing_ledger.sent_invoices (
    tenant          text        NOT NULL,
    invoice_id      text        NOT NULL,
    operation_id    text        NOT NULL,
    event_id        uuid        NOT NULL,
    mail_receipt    text        NOT NULL,
    archive_receipt text,
    sent_at         timestamptz NOT NULL,  -- the event's occurred_at
    CONSTRAINT sent_invoices_pkey PRIMARY KEY (tenant, invoice_id)
);

-- Projection replay runs as accord_projection; the live consumer as the DSN's user.
GRANT USAGE ON SCHEMA invoicing_ledger TO accord_projection;
GRANT SELECT, INSERT, UPDATE, DELETE ON invoicing_ledger.sent_invoices TO accord_projection;
