-- The invoicing consumers run as accord_consumer (accord's 0014; `accord consume` sets that
-- role by default). `invoice_delivery` only calls jobs.submit, which accord grants it;
-- `invoice_ledger` upserts the ledger (UPSERT_SENT_INVOICE: INSERT ... ON CONFLICT DO UPDATE
-- ... WHERE, which reads the existing row) and never deletes (the reset is replay's, as
-- accord_projection). It has no privilege on invoicing.invoices.
--
-- A migration of its own rather than an edit of 0001: a changed applied file is refused
-- (MigrationTampered) in every database that already applied it.
GRANT USAGE ON SCHEMA invoicing_ledger TO accord_consumer;
GRANT SELECT, INSERT, UPDATE ON invoicing_ledger.sent_invoices TO accord_consumer;
