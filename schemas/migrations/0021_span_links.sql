-- 0021 span links: where an attempt's and an effect's trace context are kept, so the next
-- attempt links to the one before it and a reconcile resolution links to the effect it
-- resolves. Written only while tracing (accord.telemetry), through jobs.note_trace, which
-- writes only for the attempt that holds the job (a stale worker's note is a no-op). The
-- effect records themselves stay as they are (jobs.effects_guard): an effect's context
-- lives beside it, in jobs.effect_traces.
ALTER TABLE jobs.jobs ADD COLUMN attempt_trace jsonb;

CREATE TABLE jobs.effect_traces (
    job_id     bigint  NOT NULL,
    effect_key text    NOT NULL,
    seq        integer NOT NULL,
    trace      jsonb   NOT NULL,
    CONSTRAINT effect_traces_pkey PRIMARY KEY (job_id, effect_key, seq)
);
GRANT SELECT ON jobs.effect_traces TO accord_worker, accord_repair;

CREATE FUNCTION jobs.note_trace(
    p_job_id bigint, p_attempt_id uuid, p_effect_key text, p_seq integer, p_trace jsonb
) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_effect_key IS NULL THEN
        UPDATE jobs.jobs SET attempt_trace = p_trace
        WHERE job_id = p_job_id AND attempt_id = p_attempt_id;
        RETURN FOUND;
    END IF;
    INSERT INTO jobs.effect_traces (job_id, effect_key, seq, trace)
    SELECT e.job_id, e.effect_key, e.seq, p_trace FROM jobs.effects e
    WHERE e.job_id = p_job_id AND e.effect_key = p_effect_key AND e.seq = p_seq
      AND e.attempt_id = p_attempt_id
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION jobs.note_trace(bigint, uuid, text, integer, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.note_trace(bigint, uuid, text, integer, jsonb) TO accord_worker;
