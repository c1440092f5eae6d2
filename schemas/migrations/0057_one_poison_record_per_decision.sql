-- 0057 One poison record per decision (a left-alone defect of the consumer). The runtime
-- commits a message's poison record, then rejects it to the poison queue. A reject lost
-- with its channel after that commit returned the message, redelivered, and the consumer
-- decided it again and wrote a second record for the one message the poison queue then
-- held (twice the poison count for one message).
--   * consumers/sql.py's INSERT_POISON writes no record for a redelivered message that
--     already has one from this consumer with the same reason, body hash, message id and
--     publish id; it returns that record's id. A message delivered afresh (not redelivered:
--     a put-back by `accord dead-letters`, a publish again) is a new decision and gets a
--     record of its own, as before.
--   * The lookup reads poison_redelivery_idx, and the consumer role may read the columns it
--     compares (identifiers and a hash, never a payload).
CREATE INDEX poison_redelivery_idx ON consumers.poison (consumer, body_sha256);

GRANT SELECT (consumer, reason, message_id, publish_id, body_sha256)
    ON consumers.poison TO accord_consumer;
