-- 0024 a publish's result in its fenced succeeded statement: jobs.succeed_with_result marks
-- the lease's job succeeded exactly as jobs.succeed does (the whole fence, re-checked on the
-- locked row in the same UPDATE) and, only then, writes the jobs.results manifest row naming
-- the result object, in the same round trip. It is jobs.record_result followed by
-- jobs.succeed without the second fence of the row (a publish callback's record_result
-- fenced it once more). A refusal writes nothing; inside the publish transaction it rolls
-- the callback's writes back as any refusal does.
CREATE FUNCTION jobs.succeed_with_result(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text, p_content_digest text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status text;
BEGIN
    v_status := jobs.succeed(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                             p_attempt_id, p_generation, p_epoch);
    IF v_status IS NULL THEN
        INSERT INTO jobs.results (job_id, tenant, object_key, content_digest)
        VALUES (p_job_id, p_tenant, p_object_key, p_content_digest);
    END IF;
    RETURN v_status;
END $$;

REVOKE EXECUTE ON FUNCTION jobs.succeed_with_result(bigint, text, text, text, text, uuid, bigint, bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.succeed_with_result(bigint, text, text, text, text, uuid, bigint, bigint, text, text) TO accord_worker;
