-- 0011 the operation key gets its own table, and no fenced write-back can be planned as a
-- scan of running work.
--
-- 1. jobs.operations holds the idempotency key (tenant, workflow, operation id) of each job.
--    Before, the key was a unique constraint on jobs.jobs (jobs_operation_key). No claim or
--    write-back changes those columns, but every claim, publish, renew and fail changes the
--    state or the lease, both indexed, so none of those updates is HOT: each one inserted a
--    new entry into the key's three-column text index. The key's own table is written once,
--    by jobs.submit. A foreign key from jobs.jobs (job_id and the three columns) to
--    jobs.operations ties every job to the one operation row that names it, so the database
--    still holds at most one job per operation, and the job row's copy of the columns (which
--    the fence compares) cannot differ from the key. The non-empty CHECKs on workflow and
--    operation id move with the key: every job's values are an operation row's. A deferred
--    foreign key the other way (operations.job_id to jobs.jobs) keeps an operation row from
--    outliving its job: emptying jobs.jobs takes jobs.operations with it (TRUNCATE needs
--    both, or CASCADE), so a resubmit can never find a key that names a missing or a reused
--    job id. submit's lookup compares all four columns and raises if the job is not there.
--
-- 2. A publish, renew, fail or rescue's re-check addresses its jobs by primary key. Their UPDATEs also said
--    state = 'running', the predicate of jobs_running_idx, so the planner could drive them
--    from that index instead. With statistics taken while nothing ran (a backlog submitted,
--    then analyzed, as autovacuum does), that index looks empty and cheaper than the primary
--    key, and each write-back then visited every running job
--    (tests/integration/jobs/test_schema.py shows the plans). Now:
--    * jobs.succeed and jobs.succeed_many check the unexpired lease alone: jobs_lease_check
--      makes a lease exist exactly while the job runs, so that check already says running.
--    * jobs.renew and jobs.fail update a row that jobs.fence_check has just locked and found
--      running under this lease; their UPDATE no longer repeats the state.
--    * jobs.rescue's second step re-checks its locked candidates by id and says running as
--      "has a lease" (the same CHECK). Its first step still finds them by jobs_running_idx.
--    So these fences now lean on jobs_lease_check; a comment on the constraint says so.
--
-- The migration takes jobs.jobs whole (ACCESS EXCLUSIVE: no reads, no writes) for its one
-- transaction, which copies every key and validates the foreign keys: plan it, since it grows
-- with the table. It asks for that lock first, so a write-back in flight (holding a weaker
-- lock on jobs.jobs) finishes before it rather than deadlocking against a later upgrade, and
-- gives up after lock_timeout instead of queueing every reader behind it; run it again then.

SET LOCAL lock_timeout = '60s';
LOCK TABLE jobs.jobs IN ACCESS EXCLUSIVE MODE;

CREATE TABLE jobs.operations (
    tenant       text   NOT NULL,
    workflow     text   NOT NULL CHECK (workflow <> ''),
    operation_id text   NOT NULL CHECK (operation_id <> ''),
    job_id       bigint NOT NULL,
    CONSTRAINT operations_pkey PRIMARY KEY (tenant, workflow, operation_id),
    -- The target of jobs_operation_fkey: the operation row names its job.
    CONSTRAINT operations_job_key UNIQUE (job_id, tenant, workflow, operation_id)
);
GRANT SELECT ON jobs.operations TO accord_worker, accord_repair;

INSERT INTO jobs.operations (tenant, workflow, operation_id, job_id)
SELECT j.tenant, j.workflow, j.operation_id, j.job_id FROM jobs.jobs j;

ALTER TABLE jobs.jobs
    ADD CONSTRAINT jobs_operation_fkey FOREIGN KEY (job_id, tenant, workflow, operation_id)
        REFERENCES jobs.operations (job_id, tenant, workflow, operation_id),
    DROP CONSTRAINT jobs_operation_key,
    DROP CONSTRAINT jobs_workflow_check,
    DROP CONSTRAINT jobs_operation_id_check;
-- Checked at commit: submit writes the operation row before the job row it names.
ALTER TABLE jobs.operations
    ADD CONSTRAINT operations_job_fkey FOREIGN KEY (job_id) REFERENCES jobs.jobs (job_id)
        DEFERRABLE INITIALLY DEFERRED;

COMMENT ON CONSTRAINT jobs_lease_check ON jobs.jobs IS
    'A lease exists exactly while the job runs. jobs.succeed, jobs.succeed_many and '
    'jobs.rescue read an unexpired (or any) lease as running (0011): relaxing this check '
    'weakens their fences.';

-- submit: idempotent on (tenant, workflow, operation id); never resets an existing job.
-- The operation row comes first, with the id its job will carry. ON CONFLICT DO NOTHING waits
-- for a concurrent submit of the same operation, so the SELECT below (a new snapshot) sees
-- the winner's two rows, which committed together.
CREATE OR REPLACE FUNCTION jobs.submit(
    p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb,
    p_max_attempts integer
) RETURNS TABLE (job_id bigint, created boolean, state text, digest text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
                (job_id, tenant, workflow, operation_id, digest, payload, max_attempts)
            OVERRIDING SYSTEM VALUE
            VALUES (v_job_id, p_tenant, p_workflow, p_operation_id, p_digest, p_payload,
                    p_max_attempts)
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

-- renew: extend the caller's own unexpired lease; never revives an expired one.
CREATE OR REPLACE FUNCTION jobs.renew(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_lease_s double precision
) RETURNS TABLE (status text, lease_expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_reason text;
    v_until timestamptz;
BEGIN
    v_reason := jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                                 p_attempt_id, p_generation, p_epoch);
    IF v_reason IS NOT NULL THEN
        RETURN QUERY SELECT v_reason, NULL::timestamptz;
        RETURN;
    END IF;
    -- jobs.fence_check holds this row and found it running under this lease.
    UPDATE jobs.jobs j
    SET lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_s),
        updated_at = now()
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
    RETURNING j.lease_expires_at INTO v_until;
    RETURN QUERY SELECT CASE WHEN v_until IS NULL THEN 'row_count' END, v_until;
END $$;

-- fail: the worker gives the job up (fenced).
CREATE OR REPLACE FUNCTION jobs.fail(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_error text, p_retry boolean,
    p_backoff_base_s double precision, p_backoff_max_s double precision
) RETURNS TABLE (status text, state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_reason text;
    v_state text;
BEGIN
    v_reason := jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                                 p_attempt_id, p_generation, p_epoch);
    IF v_reason IS NOT NULL THEN
        RETURN QUERY SELECT v_reason, NULL::text;
        RETURN;
    END IF;
    -- jobs.fence_check holds this row and found it running under this lease.
    UPDATE jobs.jobs j
    SET state = jobs.next_state(j.job_id, j.attempts, j.max_attempts, p_retry),
        lease_expires_at = NULL, last_error = p_error, updated_at = now(),
        run_after = now() + jobs.backoff(j.attempts, p_backoff_base_s, p_backoff_max_s)
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
    RETURNING j.state INTO v_state;
    RETURN QUERY SELECT CASE WHEN v_state IS NULL THEN 'row_count' END, v_state;
END $$;

-- The publish: the whole fence in one UPDATE (0009, 0010); `running` is the unexpired lease.
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
      AND j.epoch = p_epoch AND t.epoch = p_epoch AND NOT t.frozen
      AND j.lease_expires_at > clock_timestamp()
      AND j.unresolved_effects = 0
      AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                      WHERE e.job_id = p_job_id AND e.state IN ('pending', 'unknown'));
    IF FOUND THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(
        jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                         p_attempt_id, p_generation, p_epoch),
        CASE WHEN jobs.unresolved_effects(p_job_id) THEN 'unresolved_effect' ELSE 'row_count' END);
END $$;

-- The batch spelling of the same WHERE clause (see 0009 for why there are two).
CREATE OR REPLACE FUNCTION jobs.succeed_many(
    p_job_ids bigint[], p_tenants text[], p_workflows text[], p_operation_ids text[],
    p_owners text[], p_attempt_ids uuid[], p_generations bigint[], p_epochs bigint[]
) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Operation fields compare with IS NOT DISTINCT FROM (never NULL here) so that only the
    -- primary key can drive this update: an equality on tenant lets a planner without fresh
    -- statistics scan a whole tenant once per lease.
    RETURN QUERY
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
          AND j.epoch = l.epoch AND t.epoch = l.epoch AND NOT t.frozen
          AND j.lease_expires_at > clock_timestamp()
          AND j.unresolved_effects = 0
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id AND e.state IN ('pending', 'unknown'))
        RETURNING j.job_id;
END $$;

-- rescue: the one loop that returns abandoned running work (0004; only step 2's spelling of
-- `running` changed, see this file's header).
CREATE OR REPLACE FUNCTION jobs.rescue(p_limit integer, p_backoff_base_s double precision,
                                       p_backoff_max_s double precision)
RETURNS TABLE (job_id bigint, tenant text, state text, generation bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
BEGIN
    -- Step 1: lock candidates; a row a fenced writer holds right now is skipped, not waited on.
    SELECT array_agg(c.job_id) INTO v_ids FROM (
        SELECT j.job_id FROM jobs.jobs j JOIN jobs.tenants t ON t.tenant = j.tenant
        WHERE j.state = 'running'
          AND (j.lease_expires_at <= clock_timestamp() OR j.epoch <> t.epoch)
        ORDER BY j.lease_expires_at
        LIMIT p_limit
        FOR NO KEY UPDATE OF j SKIP LOCKED
    ) c;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    -- Step 2: a new snapshot, taken while we hold the locks: re-check our own candidates
    -- (a renewal, publish or effect that committed before we locked is visible here).
    -- Still running = still leased (jobs_lease_check), spelled so the primary key finds them.
    RETURN QUERY
        UPDATE jobs.jobs j
        SET state = jobs.next_state(j.job_id, j.attempts, j.max_attempts, true),
            generation = j.generation + 1, lease_expires_at = NULL,
            last_error = CASE WHEN j.epoch <> t.epoch THEN 'epoch_rotated' ELSE 'lease_expired' END,
            run_after = now() + jobs.backoff(j.attempts, p_backoff_base_s, p_backoff_max_s),
            updated_at = now()
        FROM jobs.tenants t
        WHERE j.job_id = ANY (v_ids) AND t.tenant = j.tenant AND j.lease_expires_at IS NOT NULL
          AND (j.lease_expires_at <= clock_timestamp() OR j.epoch <> t.epoch)
        RETURNING j.job_id, j.tenant, j.state, j.generation;
END $$;
