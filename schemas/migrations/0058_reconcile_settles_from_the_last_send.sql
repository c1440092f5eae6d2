-- 0058 A provider's "never seen" is trusted only once no attempt of the job can still be
-- sending (a review's finding). Reconcile measured its settle window from the effect's
-- begin: an effect begun 90 s before its job was rescued (a lease cut by a class transfer or
-- an epoch rotation, a worker cut off from the database, a long call) was resolved
-- failed_before_dispatch at once on "never seen", the job queued and the effect dispatched
-- again, while the first attempt's request could still land after the lookup.
--   * jobs.jobs.lease_granted_until: the latest lease end the job ever granted an attempt
--     (jobs.claim and jobs.renew set it; no cut, drain, cancel or rescue lowers it). A
--     worker stops its handler, and the effect call in it, at its own lease end, which it
--     counts from before its claim or renewal was sent: never after this. Running jobs take
--     their current lease end at the upgrade; a job stopped before it has none. jobs.fail
--     sets it to its own time: the attempt says its handler ended (its calls with it), and
--     an earlier attempt cut short sent nothing unrecorded (an effect is begun, fenced,
--     before it is dispatched; one it began would have kept the job from being claimed).
--   * jobs.reconciliation.quiet_since: since when nothing of the job's attempts can still
--     be sending: the latest of the effect's begin and recorded finish and, once the job no
--     longer runs, its last change and lease_granted_until, and when the tenant's latest
--     restore was last seen (an attempt of the lost history may have run until then). Reconcile's settle
--     window (ACCORD_RECONCILE_SETTLE_S: what a request in flight may still take) runs from
--     there, and it reads the effects in that order.
ALTER TABLE jobs.jobs ADD COLUMN lease_granted_until timestamptz;
COMMENT ON COLUMN jobs.jobs.lease_granted_until IS 'The latest lease end ever granted to an attempt of the job (claim, renew); never lowered by a cut, drain or rescue: no attempt sends after it (0058)';
UPDATE jobs.jobs SET lease_granted_until = lease_expires_at WHERE state = 'running';

CREATE OR REPLACE FUNCTION jobs.claim(p_workflow text, p_owner text, p_lease_s double precision, p_limit integer) RETURNS TABLE(job_id bigint, tenant text, workflow text, operation_id text, owner text, attempt_id uuid, generation bigint, epoch bigint, lease_expires_at timestamp with time zone, payload jsonb, trace jsonb, attempt_trace jsonb, attempts integer, last_error text, created_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
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
        -- The tenant row shared: a rotation's update of it waits for this claim to commit,
        -- and its drain then sees the job running (it drains only what it sees); a claim
        -- during a rotation skips the tenant. Without it a lease claimed in flight kept its
        -- old epoch past the rotation, and its holder could write until the rotation committed.
        FOR NO KEY UPDATE OF j SKIP LOCKED
        FOR SHARE OF t SKIP LOCKED
    )
    UPDATE jobs.jobs j
    SET state = 'running', owner = p_owner, attempt_id = gen_random_uuid(),
        generation = j.generation + 1, epoch = picked.epoch, attempts = j.attempts + 1,
        lease_expires_at = now() + make_interval(secs => p_lease_s),
        lease_granted_until = greatest(j.lease_granted_until,
                                       now() + make_interval(secs => p_lease_s)),
        updated_at = now()
    FROM picked
    -- The redundant ANY lets the primary key find the picked rows (a hash join would scan
    -- the whole table per claim); picked, a locking CTE, runs exactly once.
    WHERE j.job_id = ANY (ARRAY(SELECT picked.job_id FROM picked)) AND j.job_id = picked.job_id
    RETURNING j.job_id, j.tenant, j.workflow, j.operation_id, j.owner, j.attempt_id,
              j.generation, j.epoch, j.lease_expires_at, j.payload,
              -- the attempt's context (0036): what Store.attempt_context read after
              j.trace, j.attempt_trace, j.attempts, j.last_error, j.created_at;
END $$;

CREATE OR REPLACE FUNCTION jobs.renew(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_lease_s double precision) RETURNS TABLE(status text, lease_expires_at timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
        lease_granted_until = greatest(j.lease_granted_until,
                                       clock_timestamp() + make_interval(secs => p_lease_s)),
        updated_at = now()
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
    RETURNING j.lease_expires_at INTO v_until;
    RETURN QUERY SELECT CASE WHEN v_until IS NULL THEN 'row_count' END, v_until;
END $$;

CREATE OR REPLACE FUNCTION jobs.fail(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_error text, p_retry boolean, p_backoff_base_s double precision, p_backoff_max_s double precision) RETURNS TABLE(status text, state text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_reason text;
    v_state text;
    v_park boolean := false;
BEGIN
    v_reason := jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                                 p_attempt_id, p_generation, p_epoch);
    IF v_reason IS NOT NULL THEN
        RETURN QUERY SELECT v_reason, NULL::text;
        RETURN;
    END IF;
    IF p_retry AND p_error = 'effects_disabled' THEN
        -- The lock an enabling waits for (0038): parked here, the trigger then sees it.
        SELECT NOT w.effects_enabled INTO v_park
        FROM jobs.workflows w WHERE w.workflow = p_workflow FOR SHARE;
    END IF;
    -- jobs.fence_check holds this row and found it running under this lease.
    UPDATE jobs.jobs j
    SET state = jobs.next_state(j.job_id, j.attempts, j.max_attempts, p_retry),
        final_failure = NOT p_retry,
        lease_expires_at = NULL, last_error = p_error, updated_at = now(),
        -- the attempt itself says its handler ended: nothing of it is sending any more
        lease_granted_until = clock_timestamp(),
        run_after = CASE WHEN v_park THEN 'infinity'::timestamptz
                         ELSE now() + jobs.backoff(j.attempts, p_backoff_base_s, p_backoff_max_s)
                    END
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
    RETURNING j.state INTO v_state;
    RETURN QUERY SELECT CASE WHEN v_state IS NULL THEN 'row_count' END, v_state;
END $$;

CREATE OR REPLACE VIEW jobs.reconciliation AS
    SELECT e.tenant, e.job_id, j.workflow, j.operation_id, j.state AS job_state, e.effect_key,
           e.seq, e.intent_digest, e.state, e.receipt, e.attempt_id, e.generation, e.begun_at,
           x.escalated_at,
           greatest(e.begun_at, e.finished_at,
                    CASE WHEN j.state <> 'running'
                         THEN greatest(j.updated_at, j.lease_granted_until) END,
                    rs.seen_at) AS quiet_since
    FROM jobs.effects e
    JOIN jobs.jobs j ON j.job_id = e.job_id
    LEFT JOIN jobs.effect_escalations x
        ON x.job_id = e.job_id AND x.effect_key = e.effect_key AND x.seq = e.seq
    -- a restore's last sighting: the lost history's attempts may have run until then
    LEFT JOIN (SELECT r.tenant, max(greatest(r.detected_at, r.last_seen_at)) AS seen_at
               FROM jobs.authority_restores r GROUP BY r.tenant) rs ON rs.tenant = e.tenant
    WHERE e.state = 'unknown' OR (e.state = 'pending' AND j.state <> 'running');

COMMENT ON COLUMN jobs.reconciliation.quiet_since IS 'Since when nothing of the job''s attempts can still be sending: the effect''s begin or recorded finish, the job''s last change and granted lease end once it no longer runs, its tenant''s latest detected restore, whichever is latest; reconcile trusts a "never seen" only settle_s after it (0058)';
