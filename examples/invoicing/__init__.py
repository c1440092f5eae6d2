"""invoicing: a second accord application (``--app examples.invoicing.app:app``).

An issued invoice is mailed to the customer (effect ``mail.send``, provider ``mailer``) and
stored in an archive (effect ``archive.store``, provider ``archive``), then marked sent in one
fenced transaction that also announces ``invoice.sent.v1``; a projection keeps a ledger of
sent invoices. See README.md.
"""
