-- 0026 each consumer prunes only its own rows. The inbox, the delivery log and the poison
-- records of every consumer share one table each, and their pruning (0023) took every
-- consumer's expired rows by the window of whichever process ran it: a consumer whose
-- window was shorter removed the inbox rows of one with a longer window, and a redelivery
-- the longer window still promised to absorb ran again as new. Now each prune names its
-- consumer, and the retention indexes lead with the consumer, so that a pass reads only its
-- own expired rows however many another consumer keeps (or leaves behind if it stopped).
-- The indexes are rebuilt in this file's transaction (a lock on writes for the build: these
-- tables hold one replay window since 0023).
DROP INDEX consumers.inbox_retention_idx;
CREATE INDEX inbox_retention_idx
    ON consumers.inbox (consumer, GREATEST(first_seen_at, occurred_at));
DROP INDEX consumers.deliveries_received_idx;
CREATE INDEX deliveries_received_idx ON consumers.deliveries (consumer, received_at);
DROP INDEX consumers.poison_created_idx;
CREATE INDEX poison_created_idx ON consumers.poison (consumer, created_at);

DROP FUNCTION consumers.prune_poison(double precision, integer);

-- consumers.poison: typed evidence of a dead-lettered message, removed by age after its own
-- retention (poison_retention_s, never shorter than the replay horizon), one consumer's at a
-- time. A poison record has no open state in accord (the message waits in the dead-letter
-- queue, the broker's to keep); the consumer role may remove old records only through this
-- function, never at will.
CREATE FUNCTION consumers.prune_poison(
    p_consumer text, p_retention_s double precision, p_limit integer
)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_consumer IS NULL OR p_limit IS NULL OR p_limit < 1 OR p_limit > 10000
       OR p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'consumers.prune_poison: consumer %, retention % s, batch %',
            p_consumer, p_retention_s, p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH doomed AS (
        SELECT p.id FROM consumers.poison p
        WHERE p.consumer = p_consumer
          AND p.created_at < now() - make_interval(secs => p_retention_s)
        ORDER BY p.created_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM consumers.poison p USING doomed d WHERE p.id = d.id RETURNING 1
    ) SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END $$;

COMMENT ON FUNCTION consumers.prune_poison(text, double precision, integer) IS
    'Remove one bounded batch of one consumer''s poison records older than the retention; the count (0026)';

REVOKE EXECUTE ON FUNCTION consumers.prune_poison(text, double precision, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION consumers.prune_poison(text, double precision, integer)
    TO accord_consumer;
