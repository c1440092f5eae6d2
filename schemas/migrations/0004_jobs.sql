-- 0004 jobs: the SQL jobs module, the single claimant, its fence and its effect records.
--
-- Every write-back a worker makes (renew, fail, begin/finish effect, publish) goes through
-- the fence (jobs.fence, whose body jobs.fence_check the fenced functions call directly),
-- which locks the job row and names the first field that no longer matches the
-- caller's lease. The functions below are the statements the store runs (jobs/sql.py calls
-- them), so the isolationtester specs in tests/isolation exercise exactly the production SQL.
--
-- Concurrency notes (READ COMMITTED, the default):
-- * A fence reads the tenant row in a separate statement *after* locking the job row. A
--   single statement joining both would, after waiting for the job lock, re-check only the
--   locked row and keep the tenant row from its old snapshot (EvalPlanQual), so a rotation
--   that committed while we waited would go unseen.
--   https://www.postgresql.org/docs/15/transaction-iso.html#XACT-READ-COMMITTED
-- * Rotation, freeze and owner transfer also revoke the running leases they invalidate, on
--   the job rows themselves (lease_expires_at = now). That waits for every fenced write-back
--   in flight (each holds its job row until it commits), and a write-back that was waiting
--   for the row re-checks the *revoked row* (EvalPlanQual re-reads the locked row, not the
--   joined tenant row), so once rotation returns no write-back under the old epoch commits.
-- * Rescue locks candidates first, then decides in a new statement (new snapshot) so that an
--   effect begun or a publish committed just before it took the lock is seen.

CREATE TABLE jobs.tenants (
    tenant      text PRIMARY KEY CHECK (tenant <> ''),
    epoch       bigint      NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    frozen      boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Exactly one queue owner serves each workflow class; external effects are off by default.
CREATE TABLE jobs.workflows (
    workflow        text PRIMARY KEY CHECK (workflow <> ''),
    owner           text        NOT NULL CHECK (owner <> ''),
    effects_enabled boolean     NOT NULL DEFAULT false,
    registered_at   timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs.jobs (
    job_id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant           text        NOT NULL REFERENCES jobs.tenants (tenant),
    workflow         text        NOT NULL CHECK (workflow <> ''),
    operation_id     text        NOT NULL CHECK (operation_id <> ''),
    digest           text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state            text        NOT NULL DEFAULT 'queued',
    generation       bigint      NOT NULL DEFAULT 0,
    owner            text,
    attempt_id       uuid,
    epoch            bigint,
    lease_expires_at timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 5,
    run_after        timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    -- Set only by the repair role (jobs.repair_resume, migration 0006): the generation at which
    -- a person or the reconciler, with evidence, let this job run again although an effect of
    -- it succeeded. Claim takes such a job only while generation still equals it (the claim
    -- itself advances the generation, so the permission is used up by one claim).
    resumed_generation bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT jobs_state_check CHECK (
        state IN ('queued', 'running', 'succeeded', 'failed', 'poison', 'canceled', 'unknown', 'held')
    ),
    CONSTRAINT jobs_operation_key UNIQUE (tenant, workflow, operation_id),
    CONSTRAINT jobs_max_attempts_check CHECK (max_attempts >= 1),
    -- A lease exists exactly while the job runs, and a running job names its whole lease.
    CONSTRAINT jobs_lease_check CHECK (
        (state = 'running') = (lease_expires_at IS NOT NULL)
        AND (state <> 'running' OR (owner IS NOT NULL AND attempt_id IS NOT NULL AND epoch IS NOT NULL))
    )
);

-- The claim's index: due queued work of one workflow class, oldest first.
CREATE INDEX jobs_claimable_idx ON jobs.jobs (workflow, run_after, job_id) WHERE state = 'queued';
-- Rescue's index: running work by lease expiry.
CREATE INDEX jobs_running_idx ON jobs.jobs (lease_expires_at) WHERE state = 'running';
-- (No index for the drained check before an owner change: it is rare, and every index on
-- jobs.jobs costs each claim and publish, whose updates are never HOT.)

-- Effect records: one row per begin. Only a failed_before_dispatch record lets the same key
-- begin again, and then as a new row (seq + 1): a finished outcome is never overwritten.
CREATE TABLE jobs.effects (
    tenant        text        NOT NULL,
    job_id        bigint      NOT NULL REFERENCES jobs.jobs (job_id),
    effect_key    text        NOT NULL CHECK (effect_key <> ''),
    seq           integer     NOT NULL CHECK (seq >= 1),
    intent_digest text        NOT NULL,
    state         text        NOT NULL DEFAULT 'pending',
    receipt       text,
    attempt_id    uuid        NOT NULL,
    generation    bigint      NOT NULL,
    begun_at      timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    PRIMARY KEY (job_id, effect_key, seq),
    CONSTRAINT effects_state_check CHECK (
        state IN ('pending', 'succeeded', 'failed_before_dispatch', 'unknown')
    )
);

-- At most one record per key that is not failed_before_dispatch: no key is begun twice.
CREATE UNIQUE INDEX effects_one_live_idx ON jobs.effects (job_id, effect_key)
    WHERE state <> 'failed_before_dispatch';

-- A finished outcome never changes and no record is ever deleted (repair, issue 7, replaces
-- this function to let its own role resolve an unknown outcome with evidence).
CREATE FUNCTION jobs.effects_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'jobs.effects records are never deleted'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.state <> 'pending' OR NEW.state = 'pending'
       OR (NEW.tenant, NEW.job_id, NEW.effect_key, NEW.seq, NEW.intent_digest, NEW.attempt_id,
           NEW.generation)
          IS DISTINCT FROM
          (OLD.tenant, OLD.job_id, OLD.effect_key, OLD.seq, OLD.intent_digest, OLD.attempt_id,
           OLD.generation) THEN
        RAISE EXCEPTION 'a finished effect outcome never changes (% %/% is %)',
            OLD.job_id, OLD.effect_key, OLD.seq, OLD.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER effects_guard BEFORE UPDATE OR DELETE ON jobs.effects
    FOR EACH ROW EXECUTE FUNCTION jobs.effects_guard();

-- The fenced manifest row that makes a result object authoritative (written by
-- jobs.record_result from a publish callback; `accord gc-objects` reads object_key from it).
CREATE TABLE jobs.results (
    job_id         bigint PRIMARY KEY REFERENCES jobs.jobs (job_id),
    tenant         text        NOT NULL,
    object_key     text        NOT NULL,
    content_digest text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------------------------------
-- submit: idempotent on (tenant, workflow, operation id); never resets an existing job.
CREATE FUNCTION jobs.submit(
    p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb,
    p_max_attempts integer
) RETURNS TABLE (job_id bigint, created boolean, state text, digest text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    -- ON CONFLICT DO NOTHING waits for a concurrent insert of the same operation, so the
    -- SELECT below (a new snapshot) sees the winner's row.
    RETURN QUERY
        INSERT INTO jobs.jobs AS j (tenant, workflow, operation_id, digest, payload, max_attempts)
        VALUES (p_tenant, p_workflow, p_operation_id, p_digest, p_payload, p_max_attempts)
        ON CONFLICT (tenant, workflow, operation_id) DO NOTHING
        RETURNING j.job_id, true, j.state, j.digest;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
        SELECT j.job_id, false, j.state, j.digest FROM jobs.jobs j
        WHERE j.tenant = p_tenant AND j.workflow = p_workflow AND j.operation_id = p_operation_id;
END $$;

-- ---------------------------------------------------------------------------------------
-- claim: one statement, SKIP LOCKED, a batch of up to p_limit due jobs of one workflow class
-- for its registered owner. The workflow row is read FOR KEY SHARE so that an owner transfer
-- (FOR UPDATE) waits for claims in flight and later claims see the new owner.
-- Eligible: queued, due, tenant not frozen, no pending or unknown effect, and no succeeded
-- effect unless the repair role resumed the job (resumed_generation = generation). No
-- automatic loop sets resumed_generation, so rescue and fail(retry) never rerun a job whose
-- effect succeeded; a resumed run reuses the recorded outcome (begin_effect 'recorded').
CREATE FUNCTION jobs.claim(p_workflow text, p_owner text, p_lease_s double precision,
                           p_limit integer)
RETURNS TABLE (job_id bigint, tenant text, workflow text, operation_id text, owner text,
               attempt_id uuid, generation bigint, epoch bigint,
               lease_expires_at timestamptz, payload jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- PL/pgSQL, not SQL: a SQL function's statement is planned again on every call.
    RETURN QUERY
    WITH registered AS (
        SELECT 1 FROM jobs.workflows w
        WHERE w.workflow = p_workflow AND w.owner = p_owner
        FOR KEY SHARE
    ), picked AS (
        SELECT j.job_id, t.epoch
        FROM jobs.jobs j JOIN jobs.tenants t ON t.tenant = j.tenant
        WHERE j.workflow = p_workflow AND j.state = 'queued' AND j.run_after <= now()
          AND NOT t.frozen
          AND EXISTS (SELECT 1 FROM registered)
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
              j.generation, j.epoch, j.lease_expires_at, j.payload;
END $$;

-- ---------------------------------------------------------------------------------------
-- The fence: lock the job row, then name the first field that no longer matches the lease
-- (NULL when the caller still holds it). Every write-back calls this first. The body is
-- jobs.fence_check, which the fenced functions below call directly: jobs.fence (the entry
-- point a publish callback path calls) becomes SECURITY DEFINER with a pinned search_path in
-- 0006, and calling it from another such function would redo that GUC work on every write-back.
-- jobs.fence_check is not executable by the worker (0006 revokes PUBLIC's EXECUTE).
CREATE FUNCTION jobs.fence_check(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    j jobs.jobs%ROWTYPE;
    t jobs.tenants%ROWTYPE;
BEGIN
    SELECT * INTO j FROM jobs.jobs WHERE job_id = p_job_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    -- A new statement, hence a snapshot taken after the lock (see the header).
    SELECT * INTO t FROM jobs.tenants WHERE tenant = j.tenant;
    RETURN CASE
        WHEN j.tenant <> p_tenant THEN 'tenant'
        WHEN j.workflow <> p_workflow OR j.operation_id <> p_operation_id THEN 'operation'
        WHEN j.generation <> p_generation THEN 'generation'
        WHEN j.owner IS DISTINCT FROM p_owner THEN 'owner'
        WHEN j.attempt_id IS DISTINCT FROM p_attempt_id THEN 'attempt'
        WHEN j.state <> 'running' THEN 'state'
        WHEN j.epoch IS DISTINCT FROM p_epoch OR t.epoch <> p_epoch THEN 'epoch'
        WHEN t.frozen THEN 'frozen'
        -- clock_timestamp(), not now(): a publish transaction may outlive its lease.
        WHEN j.lease_expires_at <= clock_timestamp() THEN 'lease_expired'
    END;
END $$;

CREATE FUNCTION jobs.fence(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint
) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    RETURN jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                            p_attempt_id, p_generation, p_epoch);
END $$;

-- renew: extend the caller's own unexpired lease; never revives an expired one.
CREATE FUNCTION jobs.renew(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_lease_s double precision
) RETURNS TABLE (status text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
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
    UPDATE jobs.jobs j
    SET lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_s),
        updated_at = now()
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
      AND j.state = 'running'
    RETURNING j.lease_expires_at INTO v_until;
    RETURN QUERY SELECT CASE WHEN v_until IS NULL THEN 'row_count' END, v_until;
END $$;

-- Does this job have an effect that forbids running it again automatically? (pending,
-- succeeded, unknown; only the repair role's jobs.repair_resume lets a job whose effects all
-- finished, one of them succeeded, run again, and that run reuses the recorded outcome.)
CREATE FUNCTION jobs.blocking_effects(p_job_id bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM jobs.effects e
                   WHERE e.job_id = p_job_id AND e.state IN ('pending', 'succeeded', 'unknown'))
$$;

-- Does this job have an effect whose outcome is not known? (pending, unknown)
CREATE FUNCTION jobs.unresolved_effects(p_job_id bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM jobs.effects e
                   WHERE e.job_id = p_job_id AND e.state IN ('pending', 'unknown'))
$$;

-- Retry delay after `attempts` attempts: base * 2^(attempts-1), capped at p_max_s. The
-- exponent is capped too (at 30): 2^(attempts-1) itself overflows `make_interval` (and then
-- double precision) for a few thousand attempts, long before `least` could cap the product.
CREATE FUNCTION jobs.backoff(p_attempts integer, p_base_s double precision,
                             p_max_s double precision) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT make_interval(secs => least(
        p_max_s, p_base_s * power(2::double precision, least(greatest(p_attempts - 1, 0), 30))))
$$;

-- The state a job leaves `running` for when its worker is gone or gave up: an effect that
-- forbids running again makes it unknown (never retried silently); otherwise retry (queued)
-- until max_attempts (poison), or failed when no retry was asked for.
CREATE FUNCTION jobs.next_state(p_job_id bigint, p_attempts integer, p_max_attempts integer,
                                p_retry boolean) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_retry AND jobs.blocking_effects(p_job_id) THEN 'unknown'
        WHEN NOT p_retry AND jobs.unresolved_effects(p_job_id) THEN 'unknown'
        WHEN NOT p_retry THEN 'failed'
        WHEN p_attempts >= p_max_attempts THEN 'poison'
        ELSE 'queued'
    END
$$;

-- fail: the worker gives the job up (fenced).
CREATE FUNCTION jobs.fail(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_error text, p_retry boolean,
    p_backoff_base_s double precision, p_backoff_max_s double precision
) RETURNS TABLE (status text, state text)
LANGUAGE plpgsql AS $$
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
    UPDATE jobs.jobs j
    SET state = jobs.next_state(j.job_id, j.attempts, j.max_attempts, p_retry),
        lease_expires_at = NULL, last_error = p_error, updated_at = now(),
        run_after = now() + jobs.backoff(j.attempts, p_backoff_base_s, p_backoff_max_s)
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
      AND j.state = 'running'
    RETURNING j.state INTO v_state;
    RETURN QUERY SELECT CASE WHEN v_state IS NULL THEN 'row_count' END, v_state;
END $$;

-- succeed: the publish's second fence and the transition to succeeded, in one call.
-- Refuses ('unresolved_effect') while an effect is pending or unknown.
CREATE FUNCTION jobs.succeed(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_reason text;
    v_rows integer;
BEGIN
    v_reason := jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                                 p_attempt_id, p_generation, p_epoch);
    IF v_reason IS NOT NULL THEN
        RETURN v_reason;
    END IF;
    -- The effects check (jobs.unresolved_effects, spelled out: a SQL function with a sublink
    -- is never inlined and would be planned again on every call) rides in the UPDATE, one
    -- statement instead of two on the common path. We hold the job row, and every effect
    -- write (begin, finish) fences on it first, so no effect changes between this UPDATE and
    -- the check that names a refusal below.
    UPDATE jobs.jobs j
    SET state = 'succeeded', lease_expires_at = NULL, last_error = NULL, updated_at = now()
    WHERE j.job_id = p_job_id AND j.generation = p_generation AND j.attempt_id = p_attempt_id
      AND j.state = 'running'
      AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                      WHERE e.job_id = p_job_id AND e.state IN ('pending', 'unknown'));
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows = 1 THEN
        RETURN NULL;
    END IF;
    RETURN CASE WHEN jobs.unresolved_effects(p_job_id) THEN 'unresolved_effect' ELSE 'row_count' END;
END $$;

-- succeed_many: publish a batch of leases without callbacks in one statement; the whole
-- fence is in the WHERE clause on each job row. Returns the job ids that succeeded; the
-- caller names the refusal of the others with jobs.fence. This WHERE clause is a second
-- spelling of jobs.fence + jobs.succeed (one statement instead of three per lease): a test
-- (tests/integration/jobs/test_store.py) checks, lease by lease, that both refuse exactly
-- the same leases, so change them together.
CREATE FUNCTION jobs.succeed_many(
    p_job_ids bigint[], p_tenants text[], p_workflows text[], p_operation_ids text[],
    p_owners text[], p_attempt_ids uuid[], p_generations bigint[], p_epochs bigint[]
) RETURNS SETOF bigint
LANGUAGE sql AS $$
    UPDATE jobs.jobs j
    SET state = 'succeeded', lease_expires_at = NULL, last_error = NULL, updated_at = now()
    FROM unnest(p_job_ids, p_tenants, p_workflows, p_operation_ids, p_owners, p_attempt_ids,
                p_generations, p_epochs)
             AS l(job_id, tenant, workflow, operation_id, owner, attempt_id, generation, epoch),
         jobs.tenants t
    -- Operation fields compare with IS NOT DISTINCT FROM (never NULL here) so that only the
    -- primary key can drive this update: an equality on tenant lets a planner without fresh
    -- statistics scan a whole tenant through jobs_operation_key once per lease.
    WHERE j.job_id = ANY (p_job_ids) AND j.job_id = l.job_id AND t.tenant = j.tenant
      AND j.tenant IS NOT DISTINCT FROM l.tenant
      AND j.workflow IS NOT DISTINCT FROM l.workflow
      AND j.operation_id IS NOT DISTINCT FROM l.operation_id AND j.owner = l.owner
      AND j.attempt_id = l.attempt_id AND j.generation = l.generation AND j.state = 'running'
      AND j.epoch = l.epoch AND t.epoch = l.epoch AND NOT t.frozen
      AND j.lease_expires_at > clock_timestamp()
      AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                      WHERE e.job_id = j.job_id AND e.state IN ('pending', 'unknown'))
    RETURNING j.job_id
$$;

-- record_result: the manifest row that makes result object p_object_key authoritative for the
-- caller's job, fenced (called from a publish callback, inside the publish transaction).
-- Status: NULL = written; or a fence reason (nothing written).
CREATE FUNCTION jobs.record_result(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text,
    p_content_digest text
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_reason text;
BEGIN
    v_reason := jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                                 p_attempt_id, p_generation, p_epoch);
    IF v_reason IS NOT NULL THEN
        RETURN v_reason;
    END IF;
    INSERT INTO jobs.results (job_id, tenant, object_key, content_digest)
    VALUES (p_job_id, p_tenant, p_object_key, p_content_digest);
    RETURN NULL;
END $$;

-- begin_effect: record `pending` before dispatch (fenced). Status: NULL = begun;
-- 'recorded' = the key's latest record *succeeded in an earlier attempt* (a job resumed by
-- repair runs again): nothing is begun, the caller must not dispatch and gets that record's
-- seq and receipt instead; 'effects_disabled'; 'already_<state>' (latest record not
-- failed_before_dispatch, e.g. pending, unknown, or succeeded in this very attempt);
-- 'intent_conflict' (with the recorded digest); or a fence reason.
CREATE FUNCTION jobs.begin_effect(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_intent_digest text
) RETURNS TABLE (status text, seq integer, recorded_digest text, receipt text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_reason text;
    v_last jobs.effects%ROWTYPE;
    v_enabled boolean;
BEGIN
    v_reason := jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                                 p_attempt_id, p_generation, p_epoch);
    IF v_reason IS NOT NULL THEN
        RETURN QUERY SELECT v_reason, NULL::integer, NULL::text, NULL::text;
        RETURN;
    END IF;
    SELECT w.effects_enabled INTO v_enabled FROM jobs.workflows w WHERE w.workflow = p_workflow;
    IF v_enabled IS NOT TRUE THEN
        RETURN QUERY SELECT 'effects_disabled'::text, NULL::integer, NULL::text, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO v_last FROM jobs.effects e
    WHERE e.job_id = p_job_id AND e.effect_key = p_key ORDER BY e.seq DESC LIMIT 1;
    IF FOUND AND v_last.state = 'succeeded' AND v_last.attempt_id <> p_attempt_id THEN
        -- Done in an earlier attempt (only a resumed job runs again after that): reuse the
        -- recorded outcome, never dispatch again; a changed intent is a conflict.
        RETURN QUERY SELECT CASE WHEN v_last.intent_digest = p_intent_digest THEN 'recorded'
                                 ELSE 'intent_conflict' END,
                            v_last.seq, v_last.intent_digest, v_last.receipt;
        RETURN;
    END IF;
    IF FOUND AND v_last.state <> 'failed_before_dispatch' THEN
        RETURN QUERY SELECT 'already_' || v_last.state, v_last.seq, v_last.intent_digest,
                            NULL::text;
        RETURN;
    END IF;
    IF FOUND AND v_last.intent_digest <> p_intent_digest THEN
        RETURN QUERY SELECT 'intent_conflict'::text, v_last.seq, v_last.intent_digest,
                            NULL::text;
        RETURN;
    END IF;
    RETURN QUERY
        INSERT INTO jobs.effects AS e (tenant, job_id, effect_key, seq, intent_digest, state,
                                       attempt_id, generation)
        VALUES (p_tenant, p_job_id, p_key, coalesce(v_last.seq, 0) + 1, p_intent_digest,
                'pending', p_attempt_id, p_generation)
        RETURNING NULL::text, e.seq, e.intent_digest, NULL::text;
END $$;

-- finish_effect: record the outcome of this attempt's pending record (fenced).
-- Status: NULL = recorded; 'not_pending'; or a fence reason.
CREATE FUNCTION jobs.finish_effect(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_outcome text,
    p_receipt text
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_reason text;
    v_rows integer;
BEGIN
    IF p_outcome NOT IN ('succeeded', 'failed_before_dispatch', 'unknown') THEN
        RAISE EXCEPTION 'finish_effect outcome must be finished, not %', p_outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_reason := jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                                 p_attempt_id, p_generation, p_epoch);
    IF v_reason IS NOT NULL THEN
        RETURN v_reason;
    END IF;
    UPDATE jobs.effects e
    SET state = p_outcome, receipt = p_receipt, finished_at = now()
    WHERE e.job_id = p_job_id AND e.effect_key = p_key AND e.state = 'pending'
      AND e.attempt_id = p_attempt_id AND e.generation = p_generation;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN CASE WHEN v_rows <> 1 THEN 'not_pending' END;
END $$;

-- ---------------------------------------------------------------------------------------
-- rescue: the one loop that returns abandoned running work. A running job whose lease expired,
-- or whose lease was taken under an epoch the tenant has since rotated past, gets
-- generation + 1 and goes to queued (with backoff), poison (attempts used up) or unknown
-- (an effect forbids running it again; never retried silently).
CREATE FUNCTION jobs.rescue(p_limit integer, p_backoff_base_s double precision,
                            p_backoff_max_s double precision)
RETURNS TABLE (job_id bigint, tenant text, state text, generation bigint)
LANGUAGE plpgsql AS $$
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
    RETURN QUERY
        UPDATE jobs.jobs j
        SET state = jobs.next_state(j.job_id, j.attempts, j.max_attempts, true),
            generation = j.generation + 1, lease_expires_at = NULL,
            last_error = CASE WHEN j.epoch <> t.epoch THEN 'epoch_rotated' ELSE 'lease_expired' END,
            run_after = now() + jobs.backoff(j.attempts, p_backoff_base_s, p_backoff_max_s),
            updated_at = now()
        FROM jobs.tenants t
        WHERE j.job_id = ANY (v_ids) AND t.tenant = j.tenant AND j.state = 'running'
          AND (j.lease_expires_at <= clock_timestamp() OR j.epoch <> t.epoch)
        RETURNING j.job_id, j.tenant, j.state, j.generation;
END $$;

-- cancel: generation + 1 and no lease, on queued or running work; effect records are kept.
-- Waits for a fenced write-back holding the row, then re-checks the state it committed.
CREATE FUNCTION jobs.cancel(p_job_id bigint, p_reason text)
RETURNS TABLE (changed boolean, state text, generation bigint, unresolved boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_state text;
    v_generation bigint;
    v_changed boolean := true;
BEGIN
    UPDATE jobs.jobs j
    SET state = 'canceled', generation = j.generation + 1, lease_expires_at = NULL,
        last_error = p_reason, updated_at = now()
    WHERE j.job_id = p_job_id AND j.state IN ('queued', 'running')
    RETURNING j.state, j.generation INTO v_state, v_generation;
    IF v_state IS NULL THEN
        v_changed := false;
        SELECT j.state, j.generation INTO v_state, v_generation
        FROM jobs.jobs j WHERE j.job_id = p_job_id;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT v_changed, v_state, v_generation, jobs.unresolved_effects(p_job_id);
END $$;

-- Drain the tenant's fences: revoke every running lease of the tenant on its row (see the
-- header). Waits for the fenced write-backs in flight; afterwards none of those leases passes.
CREATE FUNCTION jobs.drain_fences(p_tenant text) RETURNS void
LANGUAGE sql AS $$
    UPDATE jobs.jobs j
    SET lease_expires_at = least(j.lease_expires_at, clock_timestamp()), updated_at = now()
    WHERE j.tenant = p_tenant AND j.state = 'running'
$$;

-- rotate_epoch: advance the tenant's authority epoch and revoke its running leases; every
-- lease under the old epoch fails its fence ('epoch') from the moment this commits, and
-- rescue returns that work.
CREATE FUNCTION jobs.rotate_epoch(p_tenant text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    UPDATE jobs.tenants SET epoch = epoch + 1, updated_at = now()
    WHERE tenant = p_tenant RETURNING epoch INTO v_epoch;
    PERFORM jobs.drain_fences(p_tenant);
    RETURN v_epoch;
END $$;

-- set_frozen: freeze (or thaw) a tenant's authority; frozen tenants are neither claimed nor
-- pass a fence. Freezing revokes the running leases (thawing does not revive them: rescue
-- returns that work).
CREATE FUNCTION jobs.set_frozen(p_tenant text, p_frozen boolean) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    UPDATE jobs.tenants SET frozen = p_frozen, updated_at = now()
    WHERE tenant = p_tenant RETURNING epoch INTO v_epoch;
    IF p_frozen THEN
        PERFORM jobs.drain_fences(p_tenant);
    END IF;
    RETURN v_epoch;
END $$;
