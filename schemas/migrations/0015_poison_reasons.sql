-- 0015 poison reasons: the typed reasons a consumer now poisons with at once, instead of
-- retrying them to the delivery limit (consumers/poison.py PoisonReason mirrors this list):
--   tenant_conflict      the body names another tenant than the tenantid header
--   too_large            the body is over the consumer's bound (max_body_bytes), unread
--   data_exception       PostgreSQL refused a value (SQLSTATE class 22), e.g. jsonb and \u0000
--   integrity_violation  PostgreSQL refused a row (SQLSTATE class 23), e.g. a CHECK
--   statement_refused    PostgreSQL refused a statement (SQLSTATE class 42)
-- The SQLSTATE itself is in the record's detail ({"sqlstate": "22P05", ...}).
ALTER TABLE consumers.poison
    DROP CONSTRAINT poison_reason_check,
    ADD CONSTRAINT poison_reason_check CHECK (reason IN (
        'malformed', 'malformed_json', 'duplicate_key', 'non_finite_number',
        'body_not_object', 'missing_header', 'bad_header', 'duplicate_header',
        'bad_specversion', 'bad_content_type', 'bad_attribute', 'unknown_type',
        'unknown_version', 'invalid_event', 'no_handler', 'digest_mismatch',
        'tenant_mismatch', 'conflict', 'too_old', 'rejected', 'retries_exhausted',
        'tenant_conflict', 'too_large', 'data_exception', 'integrity_violation',
        'statement_refused'));
