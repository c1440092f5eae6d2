-- 0037 A frozen tenant's queued jobs cost no other tenant's claim. Freezing lives in
-- jobs.tenants, so the claim walked jobs_claimable_idx through every queued job of a frozen
-- tenant that stood ahead in run_after order and dropped each one at the join: with 20,000 of
-- them (a tenant frozen while its producers kept submitting), every claim of the workflow read
-- them all, 7-15 ms against 0.26 (measured on a scratch database, 2026-12-04). Each job now
-- carries its tenant's frozen flag, and the claim's index is keyed by it, so a claim's range
-- holds thawed tenants' jobs only. The claim still joins jobs.tenants and refuses a frozen
-- tenant there: the flag chooses what the claim reads, never what it may take.
--
-- The flag is kept by one trigger on jobs.tenants (every path that freezes or thaws --
-- set_frozen, authority_set, authority_hold, repair_advance_epoch -- updates that row) and by
-- jobs.submit. A thaw that missed a job submitted while frozen would leave it out of every
-- claim for good, so the two are ordered by the tenant row's lock: submit reads the flag under
-- FOR KEY SHARE (which its foreign key takes anyway), and the trigger takes FOR UPDATE on the
-- row before it rewrites the jobs, so it waits for every submit that read the old value and
-- then sees its job; a submit after it waits for its commit and reads the new value.
ALTER TABLE jobs.jobs ADD COLUMN tenant_frozen boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN jobs.jobs.tenant_frozen IS 'jobs.tenants.frozen of the job''s tenant, for every job that is not finished (0037): the claim''s index leaves out frozen tenants'' jobs by it. Kept by jobs.tenant_frozen_sync and jobs.submit; the claim still checks jobs.tenants itself.';

-- The live states: every state a job can leave for queued (retry, rescue, release, resume,
-- requeue). A finished job keeps the flag it had; a thaw clears it wherever it is set.
UPDATE jobs.jobs j SET tenant_frozen = true
FROM jobs.tenants t
WHERE t.tenant = j.tenant AND t.frozen
  AND j.state IN ('queued', 'running', 'held', 'unknown', 'poison');

DROP INDEX jobs.jobs_claimable_idx;
CREATE INDEX jobs_claimable_idx ON jobs.jobs (workflow, tenant_frozen, run_after, job_id)
    WHERE state = 'queued';
-- A thaw finds the jobs it must clear here, not among all live work.
CREATE INDEX jobs_tenant_frozen_idx ON jobs.jobs (tenant) WHERE tenant_frozen;

-- Both rewrites go by index (jobs.jobs has none by tenant): a freeze reads the live work of
-- every tenant through the claim's, the rescue's and the attention index (the states spelled
-- as an OR so each arm matches one), a thaw the flagged jobs through jobs_tenant_frozen_idx;
-- never the finished history, which a sequential scan would read while the tenant's row, and
-- so its submits, wait (80 ms at 300,000 jobs on a scratch database). Sequential scans are
-- off as in jobs.claim (0033), so a plan cached while the table was small holds as it grows.
CREATE FUNCTION jobs.tenant_frozen_sync() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    -- Waits for every transaction that read the old flag in jobs.submit (FOR KEY SHARE) to
    -- end; the UPDATE below, a statement of its own, then sees the jobs they wrote.
    PERFORM 1 FROM jobs.tenants t WHERE t.tenant = NEW.tenant FOR UPDATE;
    IF NEW.frozen THEN
        UPDATE jobs.jobs j SET tenant_frozen = true
        WHERE j.tenant = NEW.tenant AND NOT j.tenant_frozen
          AND (j.state = 'queued' OR j.state = 'running'
               OR j.state IN ('held', 'unknown', 'poison'));
    ELSE
        UPDATE jobs.jobs j SET tenant_frozen = false
        WHERE j.tenant = NEW.tenant AND j.tenant_frozen;
    END IF;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobs.tenant_frozen_sync() FROM PUBLIC;

CREATE TRIGGER tenants_frozen_sync AFTER UPDATE OF frozen ON jobs.tenants
    FOR EACH ROW WHEN (OLD.frozen IS DISTINCT FROM NEW.frozen)
    EXECUTE FUNCTION jobs.tenant_frozen_sync();

-- Reads the tenant's flag under the row lock that orders it against the trigger.
CREATE OR REPLACE FUNCTION jobs.submit(p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb, p_max_attempts integer) RETURNS TABLE(job_id bigint, created boolean, state text, digest text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_job_id bigint;
    v_frozen boolean;
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    -- The lock the foreign key takes anyway, taken first: a freeze or thaw waits for this
    -- transaction before it rewrites the tenant's jobs (0037).
    SELECT t.frozen INTO v_frozen FROM jobs.tenants t WHERE t.tenant = p_tenant FOR KEY SHARE;
    FOR v_try IN 1..2 LOOP
        INSERT INTO jobs.operations AS o (tenant, workflow, operation_id, job_id)
        VALUES (p_tenant, p_workflow, p_operation_id, nextval('jobs.jobs_job_id_seq'))
        ON CONFLICT (tenant, workflow, operation_id) DO NOTHING
        RETURNING o.job_id INTO v_job_id;
        IF v_job_id IS NOT NULL THEN
            RETURN QUERY
                INSERT INTO jobs.jobs AS j
                    (job_id, tenant, workflow, operation_id, digest, payload, max_attempts, trace,
                     tenant_frozen)
                OVERRIDING SYSTEM VALUE
                VALUES (v_job_id, p_tenant, p_workflow, p_operation_id, p_digest, p_payload,
                        p_max_attempts, nullif(current_setting('accord.trace', true), '')::jsonb,
                        v_frozen)
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

-- The claim's range leaves frozen tenants' jobs out; its settings as 0033 and 0036 left them.
CREATE OR REPLACE FUNCTION jobs.claim(p_workflow text, p_owner text, p_lease_s double precision, p_limit integer) RETURNS TABLE(job_id bigint, tenant text, workflow text, operation_id text, owner text, attempt_id uuid, generation bigint, epoch bigint, lease_expires_at timestamp with time zone, payload jsonb, trace jsonb, attempt_trace jsonb, attempts integer, last_error text, created_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
BEGIN
    -- PL/pgSQL, not SQL: a SQL function's statement is planned again on every call.
    RETURN QUERY
    WITH registered AS (
        SELECT w.effects_enabled FROM jobs.workflows w
        WHERE w.workflow = p_workflow AND w.owner = p_owner
        FOR KEY SHARE
    ), picked AS (
        SELECT j.job_id, t.epoch
        FROM jobs.jobs j JOIN jobs.tenants t ON t.tenant = j.tenant
        WHERE j.workflow = p_workflow AND j.state = 'queued' AND j.run_after <= now()
          -- the index's range: thawed tenants' jobs only (0037); the join decides
          AND NOT j.tenant_frozen AND NOT t.frozen
          AND EXISTS (SELECT 1 FROM registered)
          -- refused for effects_disabled: it waits for effects, no attempt spent meanwhile
          AND (j.last_error IS DISTINCT FROM 'effects_disabled'
               OR (SELECT r.effects_enabled FROM registered r))
          AND NOT EXISTS (
              SELECT 1 FROM jobs.effects e
              WHERE e.job_id = j.job_id
                AND (e.state IN ('pending', 'unknown')
                     OR (e.state = 'succeeded'
                         AND j.resumed_generation IS DISTINCT FROM j.generation)))
        ORDER BY j.run_after, j.job_id
        LIMIT p_limit
        FOR NO KEY UPDATE OF j SKIP LOCKED
    )
    UPDATE jobs.jobs j
    SET state = 'running', owner = p_owner, attempt_id = gen_random_uuid(),
        generation = j.generation + 1, epoch = picked.epoch, attempts = j.attempts + 1,
        lease_expires_at = now() + make_interval(secs => p_lease_s), updated_at = now()
    FROM picked
    -- The redundant ANY lets the primary key find the picked rows (a hash join would scan
    -- the whole table per claim); picked, a locking CTE, runs exactly once.
    WHERE j.job_id = ANY (ARRAY(SELECT picked.job_id FROM picked)) AND j.job_id = picked.job_id
    RETURNING j.job_id, j.tenant, j.workflow, j.operation_id, j.owner, j.attempt_id,
              j.generation, j.epoch, j.lease_expires_at, j.payload,
              -- the attempt's context (0036): what Store.attempt_context read after
              j.trace, j.attempt_trace, j.attempts, j.last_error, j.created_at;
END $$;

-- The freeze at a detected restore holds the tenant's queued and running work the same way:
-- by the claim's and the rescue's index, not a sequential scan of every job kept (its
-- `state IN (queued, running)` matched neither partial index), while the tenant's row waits.
CREATE OR REPLACE FUNCTION jobs.authority_hold(p_tenant text, p_ledger_epoch bigint) RETURNS TABLE(restore_id bigint, tenant text, db_epoch bigint, ledger_epoch bigint, held_jobs integer, newly_detected boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    t jobs.tenants%ROWTYPE;
    v_held integer;
BEGIN
    INSERT INTO jobs.tenants AS x (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    -- Waits for a rotation holding the row (its ledger intent may be ahead until it commits).
    SELECT * INTO t FROM jobs.tenants x WHERE x.tenant = p_tenant FOR UPDATE;
    IF t.epoch >= p_ledger_epoch THEN
        RETURN;
    END IF;
    UPDATE jobs.tenants x SET frozen = true, updated_at = now() WHERE x.tenant = p_tenant;
    WITH h AS (
        UPDATE jobs.jobs j
        SET state = 'held', generation = j.generation + 1, lease_expires_at = NULL,
            last_error = 'restore_detected', updated_at = now()
        WHERE j.tenant = p_tenant AND (j.state = 'queued' OR j.state = 'running')
        RETURNING 1
    ) SELECT count(*) INTO v_held FROM h;
    RETURN QUERY
        INSERT INTO jobs.authority_restores AS r (tenant, db_epoch, ledger_epoch, held_jobs,
                                                  detected_by)
        VALUES (p_tenant, t.epoch, p_ledger_epoch, v_held, session_user)
        ON CONFLICT (tenant) WHERE resolved_at IS NULL DO UPDATE
        SET held_jobs = r.held_jobs + excluded.held_jobs,
            ledger_epoch = greatest(r.ledger_epoch, excluded.ledger_epoch),
            last_seen_at = now()
        RETURNING r.restore_id, r.tenant, r.db_epoch, r.ledger_epoch, r.held_jobs,
                  (r.detected_at = r.last_seen_at);
END $$;
