-- 0018 job trace: the W3C trace context a job was submitted under, for its attempt spans.
--
-- One trace per operation (DESIGN.md §10): the consumer's `process` span that submitted the
-- job is its parent, and every `attempt` span of the job is parented on it, whichever worker
-- claims it and however often. jobs.submit stores that context from the transaction-local
-- setting `accord.trace` (a JSON object of `traceparent`/`tracestate`), which the consumer
-- sets in the handler's transaction only while tracing: trace context is ambient in
-- OpenTelemetry, and carrying it the same way here keeps submit's signature and every caller
-- as they were. Unset or empty, the column stays NULL. Excluded from the digest, like the
-- outbox row's trace: a redelivery submits the same job, and the first context stays.
-- https://www.postgresql.org/docs/15/functions-admin.html#FUNCTIONS-ADMIN-SET

ALTER TABLE jobs.jobs ADD COLUMN trace jsonb;

CREATE OR REPLACE FUNCTION jobs.submit(p_tenant text, p_workflow text, p_operation_id text,
                                       p_digest text, p_payload jsonb, p_max_attempts integer)
RETURNS TABLE(job_id bigint, created boolean, state text, digest text)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path TO 'pg_catalog', 'pg_temp'
AS $$
#variable_conflict use_column
DECLARE
    v_job_id bigint;
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    INSERT INTO jobs.operations AS o (tenant, workflow, operation_id, job_id)
    VALUES (p_tenant, p_workflow, p_operation_id, nextval('jobs.jobs_job_id_seq'))
    ON CONFLICT (tenant, workflow, operation_id) DO NOTHING
    RETURNING o.job_id INTO v_job_id;
    IF v_job_id IS NOT NULL THEN
        RETURN QUERY
            INSERT INTO jobs.jobs AS j
                (job_id, tenant, workflow, operation_id, digest, payload, max_attempts, trace)
            OVERRIDING SYSTEM VALUE
            VALUES (v_job_id, p_tenant, p_workflow, p_operation_id, p_digest, p_payload,
                    p_max_attempts, nullif(current_setting('accord.trace', true), '')::jsonb)
            RETURNING j.job_id, true, j.state, j.digest;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT j.job_id, false, j.state, j.digest
        FROM jobs.operations o
        JOIN jobs.jobs j ON j.job_id = o.job_id AND j.tenant = o.tenant
                        AND j.workflow = o.workflow AND j.operation_id = o.operation_id
        WHERE o.tenant = p_tenant AND o.workflow = p_workflow AND o.operation_id = p_operation_id;
    IF NOT FOUND THEN
        -- Only a bypassed foreign key leaves a key without its job (accord status lists it).
        RAISE EXCEPTION 'operation % of tenant % (workflow %) has a key row but no job',
            p_operation_id, p_tenant, p_workflow
            USING ERRCODE = 'foreign_key_violation';
    END IF;
END $$;
