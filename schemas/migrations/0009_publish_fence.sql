-- 0009 publish in one fenced statement.
--
-- Before: jobs.succeed locked the job row (jobs.fence_check: a SELECT ... FOR NO KEY UPDATE,
-- then a SELECT of the tenant row) and then updated it: three statements and a lock record in
-- the WAL per publish. Now it is one UPDATE whose WHERE clause is the whole fence, as
-- jobs.succeed_many already spelled it for a batch; jobs.fence_check runs only after a refusal,
-- to name it. The two spellings (scalar parameters here, arrays in jobs.succeed_many: one
-- function over arrays of one is planned anew on every call, because PostgreSQL's generic plan
-- for an array of unknown length never looks cheaper than a custom one) must refuse exactly
-- what jobs.fence_check refuses: tests/integration/jobs/test_store.py checks both, lease by
-- lease, so change them together.
--
-- Why a single statement is sound here (see the concurrency notes of 0004):
-- * Rotation, freeze and owner transfer revoke the running leases on the job rows. An UPDATE
--   that waited for such a writer re-checks the *new* version of the job row (EvalPlanQual),
--   whose lease is revoked, so it refuses; one that got the row first makes the writer wait.
-- * Effects are the exception: begin_effect only *locks* the job row, then inserts the effect.
--   An UPDATE that waited for that lock proceeds on the same row version without a re-check,
--   and its NOT EXISTS saw the effects of its own (older) snapshot. So once the UPDATE holds
--   the rows, a new statement (new snapshot) looks again: every effect write fences on the job
--   row first, so none can appear after it. Finding one raises (SQLSTATE AJ409), which rolls
--   the publish back. Only the lease's own holder can begin an effect, so this needs a worker
--   that publishes and begins an effect of one lease at the same time
--   (tests/isolation/publish_vs_begin_effect.spec).

CREATE OR REPLACE FUNCTION jobs.succeed(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint
) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE jobs.jobs j
    SET state = 'succeeded', lease_expires_at = NULL, last_error = NULL, updated_at = now()
    FROM jobs.tenants t
    WHERE j.job_id = p_job_id AND t.tenant = j.tenant
      AND j.tenant = p_tenant AND j.workflow = p_workflow AND j.operation_id = p_operation_id
      AND j.owner = p_owner AND j.attempt_id = p_attempt_id AND j.generation = p_generation
      AND j.state = 'running'
      AND j.epoch = p_epoch AND t.epoch = p_epoch AND NOT t.frozen
      AND j.lease_expires_at > clock_timestamp()
      AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                      WHERE e.job_id = p_job_id AND e.state IN ('pending', 'unknown'));
    IF FOUND THEN
        -- Spelled out: jobs.unresolved_effects, a SQL function with a sublink, is never
        -- inlined and would be planned again on every call.
        IF EXISTS (SELECT 1 FROM jobs.effects e
                   WHERE e.job_id = p_job_id AND e.state IN ('pending', 'unknown')) THEN
            RAISE EXCEPTION 'an effect of job % was begun while it was being published', p_job_id
                USING ERRCODE = 'AJ409', HINT = 'the publish is rolled back';
        END IF;
        RETURN NULL;
    END IF;
    RETURN coalesce(
        jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                         p_attempt_id, p_generation, p_epoch),
        CASE WHEN jobs.unresolved_effects(p_job_id) THEN 'unresolved_effect' ELSE 'row_count' END);
END $$;

-- succeed_many: publish a batch of leases without callbacks in one statement, lease by lease;
-- returns the job ids that succeeded. The caller names the refusal of the others with
-- jobs.fence.
CREATE OR REPLACE FUNCTION jobs.succeed_many(
    p_job_ids bigint[], p_tenants text[], p_workflows text[], p_operation_ids text[],
    p_owners text[], p_attempt_ids uuid[], p_generations bigint[], p_epochs bigint[]
) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_done bigint[];
BEGIN
    -- Operation fields compare with IS NOT DISTINCT FROM (never NULL here) so that only the
    -- primary key can drive this update: an equality on tenant lets a planner without fresh
    -- statistics scan a whole tenant through jobs_operation_key once per lease.
    WITH done AS (
        UPDATE jobs.jobs j
        SET state = 'succeeded', lease_expires_at = NULL, last_error = NULL, updated_at = now()
        FROM unnest(p_job_ids, p_tenants, p_workflows, p_operation_ids, p_owners, p_attempt_ids,
                    p_generations, p_epochs)
                 AS l(job_id, tenant, workflow, operation_id, owner, attempt_id, generation,
                      epoch),
             jobs.tenants t
        WHERE j.job_id = ANY (p_job_ids) AND j.job_id = l.job_id AND t.tenant = j.tenant
          AND j.tenant IS NOT DISTINCT FROM l.tenant
          AND j.workflow IS NOT DISTINCT FROM l.workflow
          AND j.operation_id IS NOT DISTINCT FROM l.operation_id AND j.owner = l.owner
          AND j.attempt_id = l.attempt_id AND j.generation = l.generation
          AND j.state = 'running'
          AND j.epoch = l.epoch AND t.epoch = l.epoch AND NOT t.frozen
          AND j.lease_expires_at > clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id AND e.state IN ('pending', 'unknown'))
        RETURNING j.job_id
    )
    SELECT coalesce(array_agg(done.job_id), '{}') INTO v_done FROM done;
    IF EXISTS (SELECT 1 FROM jobs.effects e
               WHERE e.job_id = ANY (v_done) AND e.state IN ('pending', 'unknown')) THEN
        RAISE EXCEPTION 'an effect of a job in this batch was begun while it was being published'
            USING ERRCODE = 'AJ409', HINT = 'the publish is rolled back';
    END IF;
    RETURN QUERY SELECT unnest(v_done);
END $$;
