-- 0057 One poison record per decision (a left-alone defect of the consumer). The runtime
-- commits a message's poison record, then rejects it to the poison queue. A reject lost
-- with its channel after that commit returned the message, redelivered, and the consumer
-- decided it again and wrote a second record for the one message the poison queue then
-- held (twice the poison count, and a conflict counted twice).
--   * consumers.record_poison writes the record, unless the message is redelivered and
--     this consumer already recorded the same life of it: the same publish id (a fresh UUID
--     per relay publish; a message without one is always recorded), body hash, message id
--     and move id. It returns the record's id and whether it wrote it.
--   * move_id: the `accord-move-id` header `accord dead-letters` stamps on each message it
--     moves back (a fresh UUID per move). A moved message keeps its publish id, so without
--     it the decision after a move, when a retry or a restart redelivered the moved copy
--     first, would have been taken for the decision before the move.
--   * SECURITY DEFINER, as consumers.prune_poison: the consumer role still reads no poison
--     record (docs/authority.md); the lookup reads poison_redelivery_idx.
ALTER TABLE consumers.poison ADD COLUMN move_id text;
COMMENT ON COLUMN consumers.poison.move_id IS 'The accord-move-id header of a message accord dead-letters moved back (a fresh UUID per move); NULL for one never moved (0057)';

CREATE INDEX poison_redelivery_idx ON consumers.poison (consumer, publish_id)
    WHERE publish_id IS NOT NULL;

CREATE FUNCTION consumers.record_poison(
    p_consumer text, p_queue text, p_reason text, p_detail jsonb, p_tenant text,
    p_operation_id text, p_event_id text, p_event_type text, p_message_id text,
    p_publish_id text, p_redelivered boolean, p_delivery_count integer, p_headers jsonb,
    p_body_size integer, p_body_sha256 text, p_move_id text)
    RETURNS TABLE(poison_id bigint, written boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_redelivered AND p_publish_id IS NOT NULL THEN
        SELECT p.id INTO v_id FROM consumers.poison p
        WHERE p.consumer = p_consumer AND p.publish_id = p_publish_id
          AND p.body_sha256 = p_body_sha256
          AND p.message_id IS NOT DISTINCT FROM p_message_id
          AND p.move_id IS NOT DISTINCT FROM p_move_id
        ORDER BY p.id DESC LIMIT 1;
        IF FOUND THEN
            RETURN QUERY SELECT v_id, false;
            RETURN;
        END IF;
    END IF;
    INSERT INTO consumers.poison
        (consumer, queue, reason, detail, tenant, operation_id, event_id, event_type,
         message_id, publish_id, redelivered, delivery_count, headers, body_size, body_sha256,
         move_id)
    VALUES (p_consumer, p_queue, p_reason, p_detail, p_tenant, p_operation_id, p_event_id,
            p_event_type, p_message_id, p_publish_id, p_redelivered, p_delivery_count,
            p_headers, p_body_size, p_body_sha256, p_move_id)
    RETURNING id INTO v_id;
    RETURN QUERY SELECT v_id, true;
END $$;

COMMENT ON FUNCTION consumers.record_poison(text, text, text, jsonb, text, text, text, text, text, text, boolean, integer, jsonb, integer, text, text) IS 'Write one poison record and return its id, or, for a redelivered message this consumer already recorded in the same life (publish id, body hash, message id, move id), return that record''s id and write nothing (0057)';

REVOKE ALL ON FUNCTION consumers.record_poison(text, text, text, jsonb, text, text, text, text, text, text, boolean, integer, jsonb, integer, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION consumers.record_poison(text, text, text, jsonb, text, text, text, text, text, text, boolean, integer, jsonb, integer, text, text) TO accord_consumer;
