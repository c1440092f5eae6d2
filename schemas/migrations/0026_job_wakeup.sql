-- 0026 a new job wakes the workers that wait for its class: jobs.submit notifies the channel
-- jobs_submitted with the job's workflow class when it creates a job (a redelivery that finds
-- the existing job notifies nothing), delivered when the caller's transaction commits. A
-- worker LISTENs on its own connection and claims at once instead of at its next poll;
-- the poll stays the truth (a job made runnable any other way, by rescue, backoff expiry
-- or the repair role, is found by it). Everything else as in 0023.
CREATE OR REPLACE FUNCTION jobs.submit(p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb, p_max_attempts integer) RETURNS TABLE(job_id bigint, created boolean, state text, digest text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_job_id bigint;
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    FOR v_try IN 1..2 LOOP
        INSERT INTO jobs.operations AS o (tenant, workflow, operation_id, job_id)
        VALUES (p_tenant, p_workflow, p_operation_id, nextval('jobs.jobs_job_id_seq'))
        ON CONFLICT (tenant, workflow, operation_id) DO NOTHING
        RETURNING o.job_id INTO v_job_id;
        IF v_job_id IS NOT NULL THEN
            -- Wakes the workers that LISTEN when the caller commits (a hint; their poll is
            -- the truth). One per class and transaction: PostgreSQL folds the same
            -- notification within a transaction into one.
            PERFORM pg_notify('jobs_submitted', p_workflow);
            RETURN QUERY
                INSERT INTO jobs.jobs AS j
                    (job_id, tenant, workflow, operation_id, digest, payload, max_attempts, trace)
                OVERRIDING SYSTEM VALUE
                VALUES (v_job_id, p_tenant, p_workflow, p_operation_id, p_digest, p_payload,
                        p_max_attempts, nullif(current_setting('accord.trace', true), '')::jsonb)
                RETURNING j.job_id, true, j.state, j.digest;
            RETURN;
        END IF;
        -- The existing job, held until our caller commits: jobs.prune (FOR UPDATE SKIP
        -- LOCKED) passes it by; claims and fences (FOR NO KEY UPDATE) do not wait for it.
        RETURN QUERY
            SELECT j.job_id, false, j.state, j.digest
            FROM jobs.operations o
            JOIN jobs.jobs j ON j.job_id = o.job_id AND j.tenant = o.tenant
                            AND j.workflow = o.workflow AND j.operation_id = o.operation_id
            WHERE o.tenant = p_tenant AND o.workflow = p_workflow
              AND o.operation_id = p_operation_id
            FOR KEY SHARE OF j;
        IF FOUND THEN
            RETURN;
        END IF;
        -- Not found: jobs.prune removed the job (and its key) while we waited for its lock;
        -- the next insert creates the job anew.
    END LOOP;
    -- Only a bypassed foreign key leaves a key without its job (accord status lists it).
    RAISE EXCEPTION 'operation % of tenant % (workflow %) has a key row but no job',
        p_operation_id, p_tenant, p_workflow
        USING ERRCODE = 'foreign_key_violation';
END $$;
