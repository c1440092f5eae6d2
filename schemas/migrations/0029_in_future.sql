-- 0029 poison reason in_future: a consumer refuses an event dated more than its inbox's prune
-- margin (300 s) ahead of the database's clock (consumers.errors.OccurredInFuture). Its age is
-- reckoned from that date, so its inbox row and its job's operation key, kept from when they
-- were written, would not outlive every redelivery that could still be admitted.
ALTER TABLE consumers.poison
    DROP CONSTRAINT poison_reason_check,
    ADD CONSTRAINT poison_reason_check CHECK (reason IN (
        'malformed', 'malformed_json', 'duplicate_key', 'non_finite_number',
        'body_not_object', 'missing_header', 'bad_header', 'duplicate_header',
        'bad_specversion', 'bad_content_type', 'bad_attribute', 'unknown_type',
        'unknown_version', 'invalid_event', 'no_handler', 'digest_mismatch',
        'tenant_mismatch', 'conflict', 'too_old', 'rejected', 'retries_exhausted',
        'tenant_conflict', 'too_large', 'data_exception', 'integrity_violation',
        'statement_refused', 'in_future'));
