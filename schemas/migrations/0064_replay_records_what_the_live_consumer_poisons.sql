-- 0064 A replay records the events the live consumer would have poisoned, and goes on (a
-- review of replay: a handler's statement that PostgreSQL refuses for its content, SQLSTATE
-- class 22 or 23, stopped the run; after a rebuild's reset had committed with its first
-- batch the projection then held only part of its rows, and a run again stopped at the same
-- event, for ever, while the live consumer had poisoned that event and moved on).
--   * ops.replay_refusals.reason takes the live consumer's poison reasons for such refusals
--     (data_exception, integrity_violation) and for events that no longer
--     decode with the application's catalog (malformed, unknown_type, invalid_event: before,
--     counted as skipped and not recorded, and the run ended as a success).
--   * sqlstate is NULL for an event that never reached a handler (it did not decode).
ALTER TABLE ops.replay_refusals DROP CONSTRAINT replay_refusals_reason_check;
ALTER TABLE ops.replay_refusals ADD CONSTRAINT replay_refusals_reason_check CHECK (reason IN (
    'insufficient_privilege', 'data_exception', 'integrity_violation', 'malformed',
    'unknown_type', 'invalid_event'));
ALTER TABLE ops.replay_refusals ALTER COLUMN sqlstate DROP NOT NULL;
COMMENT ON COLUMN ops.replay_refusals.reason IS 'insufficient_privilege: the handler reached past the projection principal; data_exception, integrity_violation: PostgreSQL refused its statement for the event''s content (the live consumer poisons these); malformed, unknown_type, invalid_event: the event no longer decodes with the catalog (0064)';
