-- The current definition of the `jobs` schema: generated from a migrated database by
-- pg_dump (`make schema`); never edited by hand. The history (and the reasons, in comments)
-- is in schemas/migrations/; tests/integration/test_schema_files.py keeps the two equal.

--
--

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: jobs; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA jobs;

--
-- Name: append_only(); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$;

--
-- Name: audit_guard(); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.audit_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' AND jobs.pruning() THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$;

--
-- Name: authority_hold(text, bigint, boolean); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.authority_hold(p_tenant text, p_ledger_epoch bigint, p_ledger_frozen boolean DEFAULT false) RETURNS TABLE(restore_id bigint, tenant text, db_epoch bigint, ledger_epoch bigint, held_jobs integer, newly_detected boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    t jobs.tenants%ROWTYPE;
    v_held integer;
BEGIN
    INSERT INTO jobs.tenants AS x (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    -- Waits for a rotation holding the row (its ledger intent may be ahead until it commits).
    SELECT * INTO t FROM jobs.tenants x WHERE x.tenant = p_tenant FOR UPDATE;
    IF p_ledger_epoch IS NULL OR p_ledger_frozen IS NULL THEN
        RAISE EXCEPTION 'authority_hold needs the ledger epoch and restriction'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF t.epoch >= p_ledger_epoch THEN
        RETURN;
    END IF;
    UPDATE jobs.tenants x SET frozen = true, updated_at = now() WHERE x.tenant = p_tenant;
    -- Unknown jobs too (0060): resolved after the advance, an unattended reconcile would
    -- have queued or resumed them; they keep their last error (why they were unknown).
    WITH h AS (
        UPDATE jobs.jobs j
        SET state = 'held', generation = j.generation + 1, lease_expires_at = NULL,
            -- why an unknown job was given up, and a parked job's effects_disabled (its
            -- claim's eligibility reads it), are kept
            last_error = CASE WHEN j.state = 'unknown' OR j.last_error = 'effects_disabled'
                              THEN j.last_error ELSE 'restore_detected' END,
            updated_at = now()
        -- spelled as ORs: each state's partial index (queued, running, attention) serves it
        WHERE j.tenant = p_tenant
          AND (j.state = 'queued' OR j.state = 'running' OR j.state = 'unknown')
        RETURNING 1
    ) SELECT count(*) INTO v_held FROM h;
    -- The ledger's restriction at its highest epoch: what the repair's advance must keep.
    RETURN QUERY
        INSERT INTO jobs.authority_restores AS r (tenant, db_epoch, ledger_epoch, ledger_frozen,
                                                  held_jobs, detected_by)
        VALUES (p_tenant, t.epoch, p_ledger_epoch, p_ledger_frozen, v_held, session_user)
        ON CONFLICT (tenant) WHERE resolved_at IS NULL DO UPDATE
        SET held_jobs = r.held_jobs + excluded.held_jobs,
            -- A later ledger epoch says what the restriction is now; at the same epoch a
            -- restriction, once recorded, stays (the ledger changes it only with an epoch).
            ledger_frozen = CASE WHEN excluded.ledger_epoch > r.ledger_epoch
                                 THEN excluded.ledger_frozen
                                 WHEN excluded.ledger_epoch = r.ledger_epoch
                                 THEN r.ledger_frozen OR excluded.ledger_frozen
                                 ELSE r.ledger_frozen END,
            ledger_epoch = greatest(r.ledger_epoch, excluded.ledger_epoch),
            last_seen_at = now()
        RETURNING r.restore_id, r.tenant, r.db_epoch, r.ledger_epoch, r.held_jobs,
                  (r.detected_at = r.last_seen_at);
END $$;

--
-- Name: authority_lock(text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.authority_lock(p_tenant text) RETURNS TABLE(epoch bigint, frozen boolean, open_restore boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    t jobs.tenants%ROWTYPE;
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    SELECT * INTO t FROM jobs.tenants x WHERE x.tenant = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'jobs.authority_lock: tenant % has no row', p_tenant
            USING ERRCODE = 'no_data_found';
    END IF;
    -- A new statement, hence a snapshot taken after the lock (READ COMMITTED: each statement
    -- its own): a restore another advance resolved while this one waited reads resolved.
    RETURN QUERY SELECT t.epoch, t.frozen,
                        EXISTS (SELECT 1 FROM jobs.authority_restores r
                                WHERE r.tenant = p_tenant AND r.resolved_at IS NULL);
END $$;

--
-- Name: authority_set(text, bigint, boolean); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.authority_set(p_tenant text, p_epoch bigint, p_frozen boolean) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    t jobs.tenants%ROWTYPE;
BEGIN
    SELECT * INTO t FROM jobs.tenants WHERE tenant = p_tenant FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    IF p_epoch <= t.epoch THEN
        RETURN 'not_advancing';
    END IF;
    IF NOT p_frozen AND EXISTS (SELECT 1 FROM jobs.authority_restores r
                                WHERE r.tenant = p_tenant AND r.resolved_at IS NULL) THEN
        RETURN 'restore_unresolved';
    END IF;
    UPDATE jobs.tenants SET epoch = p_epoch, frozen = p_frozen, updated_at = now()
    WHERE tenant = p_tenant;
    PERFORM jobs.drain_fences(p_tenant);
    RETURN NULL;
END $$;

--
-- Name: backoff(integer, double precision, double precision); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.backoff(p_attempts integer, p_base_s double precision, p_max_s double precision) RETURNS interval
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT make_interval(secs => least(
        p_max_s, p_base_s * power(2::double precision, least(greatest(p_attempts - 1, 0), 30))))
$$;

--
-- Name: begin_effect(bigint, text, text, text, text, uuid, bigint, bigint, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.begin_effect(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_intent_digest text) RETURNS TABLE(status text, seq integer, recorded_digest text, receipt text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

--
-- Name: blocking_effects(bigint); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.blocking_effects(p_job_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (SELECT 1 FROM jobs.effects e
                   WHERE e.job_id = p_job_id AND e.state IN ('pending', 'succeeded', 'unknown'))
$$;

--
-- Name: cancel(bigint, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.cancel(p_job_id bigint, p_reason text) RETURNS TABLE(changed boolean, state text, generation bigint, unresolved boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

--
-- Name: claim(text, text, double precision, integer); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.claim(p_workflow text, p_owner text, p_lease_s double precision, p_limit integer) RETURNS TABLE(job_id bigint, tenant text, workflow text, operation_id text, owner text, attempt_id uuid, generation bigint, epoch bigint, lease_expires_at timestamp with time zone, payload jsonb, trace jsonb, attempt_trace jsonb, attempts integer, last_error text, created_at timestamp with time zone)
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

--
-- Name: clean_session(); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.clean_session() RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_unlock_all();
    EXECUTE 'CLOSE ALL';
    EXECUTE 'UNLISTEN *';
    EXECUTE 'RESET ALL';
END $$;

--
-- Name: drain_fences(text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.drain_fences(p_tenant text) RETURNS void
    LANGUAGE sql
    AS $$
    UPDATE jobs.jobs j
    SET lease_expires_at = least(j.lease_expires_at, clock_timestamp()), updated_at = now()
    WHERE j.tenant = p_tenant AND j.state = 'running'
$$;

--
-- Name: effects_count(); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.effects_count() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_delta integer := CASE WHEN NEW.state IN ('pending', 'unknown') THEN 1 ELSE 0 END;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.state IN ('pending', 'unknown') THEN
        v_delta := v_delta - 1;
    END IF;
    IF v_delta <> 0 THEN
        UPDATE jobs.jobs j SET unresolved_effects = j.unresolved_effects + v_delta
        WHERE j.job_id = NEW.job_id;
    END IF;
    RETURN NULL;
END $$;

--
-- Name: effects_guard(); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.effects_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        -- Only jobs.prune, only a resolved record (of a job it removes in the same call).
        IF OLD.state IN ('succeeded', 'failed_before_dispatch') AND jobs.pruning() THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'jobs.effects records are never deleted (% %/% is %)',
            OLD.job_id, OLD.effect_key, OLD.seq, OLD.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF (NEW.tenant, NEW.job_id, NEW.effect_key, NEW.seq, NEW.intent_digest, NEW.attempt_id,
        NEW.generation)
       IS NOT DISTINCT FROM
       (OLD.tenant, OLD.job_id, OLD.effect_key, OLD.seq, OLD.intent_digest, OLD.attempt_id,
        OLD.generation) THEN
        IF OLD.state = 'pending' AND NEW.state <> 'pending' THEN
            RETURN NEW;  -- finishing: the fenced finish_effect, or a repair
        END IF;
        IF OLD.state = 'unknown' AND NEW.state IN ('succeeded', 'failed_before_dispatch')
           AND current_setting('accord.repair_effect', true)
               = jsonb_build_array(OLD.job_id, OLD.effect_key, OLD.seq)::text
           AND current_user = (
               SELECT pg_get_userbyid(p.proowner) FROM pg_proc p
               WHERE p.oid = 'jobs.repair_resolve_effect(bigint,text,text,text,text,text)'
                             ::regprocedure) THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'a finished effect outcome never changes (% %/% is %)',
        OLD.job_id, OLD.effect_key, OLD.seq, OLD.state
        USING ERRCODE = 'integrity_constraint_violation';
END $$;

--
-- Name: fail(bigint, text, text, text, text, uuid, bigint, bigint, text, boolean, double precision, double precision); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.fail(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_error text, p_retry boolean, p_backoff_base_s double precision, p_backoff_max_s double precision) RETURNS TABLE(status text, state text)
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

--
-- Name: fence(bigint, text, text, text, text, uuid, bigint, bigint); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.fence(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN jobs.fence_check(p_job_id, p_tenant, p_workflow, p_operation_id, p_owner,
                            p_attempt_id, p_generation, p_epoch);
END $$;

--
-- Name: fence_check(bigint, text, text, text, text, uuid, bigint, bigint); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.fence_check(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) RETURNS text
    LANGUAGE plpgsql
    AS $$
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
        WHEN j.tenant IS DISTINCT FROM p_tenant THEN 'tenant'
        WHEN j.workflow IS DISTINCT FROM p_workflow
          OR j.operation_id IS DISTINCT FROM p_operation_id THEN 'operation'
        WHEN j.generation IS DISTINCT FROM p_generation THEN 'generation'
        WHEN j.owner IS DISTINCT FROM p_owner THEN 'owner'
        WHEN j.attempt_id IS DISTINCT FROM p_attempt_id THEN 'attempt'
        WHEN j.state <> 'running' THEN 'state'
        WHEN j.epoch IS DISTINCT FROM p_epoch OR t.epoch IS DISTINCT FROM p_epoch THEN 'epoch'
        WHEN t.frozen IS NOT FALSE THEN 'frozen'
        -- clock_timestamp(), not now(): a publish transaction may outlive its lease.
        WHEN j.lease_expires_at <= clock_timestamp() THEN 'lease_expired'
    END;
END $$;

--
-- Name: finish_effect(bigint, text, text, text, text, uuid, bigint, bigint, text, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.finish_effect(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_outcome text, p_receipt text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

--
-- Name: ledger_seen(text[], bigint[]); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.ledger_seen(p_tenants text[], p_epochs bigint[]) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_rows integer;
BEGIN
    -- Only ever up: a check that read the ledger before another process's append records
    -- nothing lower than that one did.
    UPDATE jobs.tenants t SET ledger_epoch = g.epoch
    FROM unnest(p_tenants, p_epochs) AS g(tenant, epoch)
    WHERE g.tenant = t.tenant AND g.epoch >= 1
      AND (t.ledger_epoch IS NULL OR g.epoch > t.ledger_epoch);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END $$;

--
-- Name: FUNCTION ledger_seen(p_tenants text[], p_epochs bigint[]); Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON FUNCTION jobs.ledger_seen(p_tenants text[], p_epochs bigint[]) IS 'Record the ledger epochs a restore check found or wrote, per tenant, only ever raising jobs.tenants.ledger_epoch; the rows raised (0052)';

--
-- Name: next_state(bigint, integer, integer, boolean); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.next_state(p_job_id bigint, p_attempts integer, p_max_attempts integer, p_retry boolean) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE
        WHEN p_retry AND jobs.blocking_effects(p_job_id) THEN 'unknown'
        WHEN NOT p_retry AND jobs.unresolved_effects(p_job_id) THEN 'unknown'
        WHEN NOT p_retry THEN 'failed'
        WHEN p_attempts >= p_max_attempts THEN 'poison'
        ELSE 'queued'
    END
$$;

--
-- Name: note_journal_evidence(text, text[], bigint[], text[], integer[], uuid[], text[]); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.note_journal_evidence(p_runner text, p_tenants text[], p_job_ids bigint[], p_keys text[], p_seqs integer[], p_attempts uuid[], p_idempotency_keys text[]) RETURNS TABLE(evidence_id bigint, job_id bigint, effect_key text, seq integer, attempt_id uuid, acknowledged boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO jobs.journal_evidence (job_id, effect_key, seq, attempt_id, tenant, runner_id,
                                       idempotency_key)
    SELECT b.job_id, b.effect_key, b.seq, b.attempt_id, b.tenant, p_runner, b.idem
    FROM unnest(p_tenants, p_job_ids, p_keys, p_seqs, p_attempts, p_idempotency_keys)
         AS b(tenant, job_id, effect_key, seq, attempt_id, idem)
    WHERE NOT EXISTS (SELECT 1 FROM jobs.effects e
                      WHERE e.job_id = b.job_id AND e.effect_key = b.effect_key
                        AND e.seq = b.seq AND e.attempt_id = b.attempt_id)
    ORDER BY b.job_id, b.effect_key, b.seq, b.attempt_id
    ON CONFLICT ON CONSTRAINT journal_evidence_begin_unique DO NOTHING;
    RETURN QUERY
    SELECT v.evidence_id, v.job_id, v.effect_key, v.seq, v.attempt_id,
           v.acknowledged_at IS NOT NULL
    FROM unnest(p_job_ids, p_keys, p_seqs, p_attempts) AS b(job_id, effect_key, seq, attempt_id)
    JOIN jobs.journal_evidence v USING (job_id, effect_key, seq, attempt_id);
END $$;

--
-- Name: FUNCTION note_journal_evidence(p_runner text, p_tenants text[], p_job_ids bigint[], p_keys text[], p_seqs integer[], p_attempts uuid[], p_idempotency_keys text[]); Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON FUNCTION jobs.note_journal_evidence(p_runner text, p_tenants text[], p_job_ids bigint[], p_keys text[], p_seqs integer[], p_attempts uuid[], p_idempotency_keys text[]) IS 'Note the journaled begins whose attempt began no effect row in this database (a restore''s evidence), idempotently; every given begin with a note, and whether it was acknowledged (0054)';

--
-- Name: note_trace(bigint, uuid, text, integer, jsonb); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.note_trace(p_job_id bigint, p_attempt_id uuid, p_effect_key text, p_seq integer, p_trace jsonb) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_effect_key IS NULL THEN
        UPDATE jobs.jobs SET attempt_trace = p_trace
        WHERE job_id = p_job_id AND attempt_id = p_attempt_id;
        RETURN FOUND;
    END IF;
    -- Hold the job, as every writer of a job's rows does (0063): jobs.prune, which takes
    -- its batch FOR UPDATE SKIP LOCKED, passes it by, or has removed it (nothing to note).
    PERFORM 1 FROM jobs.jobs j WHERE j.job_id = p_job_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO jobs.effect_traces (job_id, effect_key, seq, trace)
    SELECT e.job_id, e.effect_key, e.seq, p_trace FROM jobs.effects e
    WHERE e.job_id = p_job_id AND e.effect_key = p_effect_key AND e.seq = p_seq
      AND e.attempt_id = p_attempt_id
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END $$;

--
-- Name: prune(double precision, double precision, integer); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) RETURNS TABLE(jobs_pruned integer, effects_pruned integer, results_pruned integer, audit_pruned integer, tombstones_pruned integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz;
    v_ids bigint[];
    v_jobs integer := 0;
    v_effects integer := 0;
    v_results integer := 0;
    v_audit integer := 0;
    v_tombstones integer := 0;
    v_rows integer;
    v_consumer text;
    v_horizon double precision;
    v_key_horizon double precision;
    v_refs text;
    v_deferred text;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'jobs.prune: a batch holds 1 to 10000 jobs, not %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity')
       OR p_audit_retention_s IS NULL OR NOT (p_audit_retention_s >= p_retention_s
                                              AND p_audit_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'jobs.prune: retention % s and audit retention % s (at least as long)',
            p_retention_s, p_audit_retention_s USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The replay horizon (0027): a job's operation key outlives every redelivery that a
    -- consumer may still admit, whichever process asks for the batch.
    SELECT h.consumer, h.horizon_s INTO v_consumer, v_horizon FROM consumers.replay_horizon(NULL) h;
    IF p_retention_s < v_horizon THEN
        RAISE EXCEPTION 'jobs.prune: retention % s is shorter than the replay horizon of consumer % (% s)',
            p_retention_s, v_consumer, v_horizon
            USING ERRCODE = 'AR001',
                  DETAIL = json_build_object('consumer', v_consumer, 'horizon_s', v_horizon)::text,
                  HINT = 'a redelivery could outlive its job: set the retention to at least the horizon';
    END IF;
    -- An event's enqueue time may run ahead of this clock by the inbox's future tolerance
    -- (its prune margin, which each consumer declares, 0063): one class may finish the job
    -- that long before another class admits the same event for the last time, a horizon
    -- after its date. The key is kept that much longer, so the margin a late submit relies
    -- on is never spent on a clock ahead; the two classes may be any two consumers.
    SELECT max(h.horizon_s) + max(w.margin_s) INTO v_key_horizon
    FROM consumers.replay_horizons h JOIN consumers.replay_windows w USING (consumer);
    v_cutoff := now() - make_interval(secs => greatest(p_retention_s, v_key_horizon));
    -- Step 1: lock one batch of candidates, oldest first; a row another transaction holds
    -- (a submit returning it, a stale fence, a repair) is skipped, never waited on.
    SELECT array_agg(c.job_id) INTO v_ids FROM (
        SELECT j.job_id FROM jobs.jobs j
        WHERE j.state IN ('succeeded', 'failed', 'canceled') AND j.unresolved_effects = 0
          AND j.updated_at < v_cutoff
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id
                            AND (e.state IN ('pending', 'unknown') OR e.finished_at >= v_cutoff))
        ORDER BY j.updated_at
        LIMIT p_limit
        FOR UPDATE OF j SKIP LOCKED
    ) c;
    IF v_ids IS NOT NULL THEN
        -- Step 2: a new snapshot, taken while we hold the locks (as jobs.rescue does): keep
        -- only the candidates that are still finished, old and resolved. Nothing can change
        -- them from here on: every writer of a job or its effects locks the job row first.
        -- The candidates by primary key, the rest tested on each (0033): spelled as one IS
        -- TRUE, the conditions no longer match jobs_prunable_idx's predicate, which a plan
        -- made under quiet statistics would otherwise read whole for each batch; OFFSET 0
        -- keeps the effects test a lookup per candidate, not a join over every effect.
        SELECT array_agg(j.job_id) INTO v_ids FROM jobs.jobs j
        WHERE j.job_id = ANY (v_ids)
          AND (j.state IN ('succeeded', 'failed', 'canceled') AND j.unresolved_effects = 0
               AND j.updated_at < v_cutoff) IS TRUE
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id
                            AND (e.state IN ('pending', 'unknown') OR e.finished_at >= v_cutoff)
                          OFFSET 0);
    END IF;
    PERFORM set_config('accord.prune', 'jobs', true);
    IF v_ids IS NOT NULL THEN
        -- Children first; the job before its key (jobs_operation_fkey is immediate, the key's
        -- own reference to the job is deferred: deferred again here, whatever an earlier
        -- batch or the caller set in this transaction, 0039).
        SET CONSTRAINTS jobs.operations_job_fkey DEFERRED;
        DELETE FROM jobs.effect_escalations x WHERE x.job_id = ANY (v_ids);
        DELETE FROM jobs.effect_traces x WHERE x.job_id = ANY (v_ids);
        -- Each attempt whose effects go leaves a tombstone (0054): a journaled begin of that
        -- attempt was resolved here, and its worker's journal may let it go.
        WITH gone AS (
            DELETE FROM jobs.effects e WHERE e.job_id = ANY (v_ids) RETURNING e.attempt_id
        ), kept AS (
            INSERT INTO jobs.pruned_attempts (attempt_id)
            SELECT DISTINCT g.attempt_id FROM gone g
            ON CONFLICT (attempt_id) DO NOTHING
        ) SELECT count(*) INTO v_effects FROM gone;
        DELETE FROM jobs.results r WHERE r.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_results = ROW_COUNT;
        DELETE FROM jobs.jobs j WHERE j.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_jobs = ROW_COUNT;
        DELETE FROM jobs.operations o WHERE o.job_id = ANY (v_ids);
    END IF;
    -- The audit tables share the batch's budget of p_limit rows (0042). Resolved restore
    -- records past the audit retention first (an open one holds its tenant and stays, whatever
    -- its age): the repair audit rows they name may then follow in the same batch.
    WITH doomed AS (
        SELECT a.restore_id FROM jobs.authority_restores a
        WHERE a.resolved_at < now() - make_interval(secs => p_audit_retention_s)
        ORDER BY a.resolved_at, a.restore_id
        LIMIT p_limit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.authority_restores a USING doomed d WHERE a.restore_id = d.restore_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_rows;
    -- Registration audit rows past the audit retention, but never a class's newest: it names
    -- who registered the owner and effects flag in force, however long ago (0042).
    WITH doomed AS (
        SELECT a.audit_id FROM jobs.registration_audit a
        WHERE a.at < now() - make_interval(secs => p_audit_retention_s)
          AND EXISTS (SELECT 1 FROM jobs.registration_audit later
                      WHERE later.workflow = a.workflow AND later.audit_id > a.audit_id)
        ORDER BY a.at, a.audit_id
        LIMIT p_limit - v_audit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.registration_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_audit + v_rows;
    -- Repair audit rows past their own retention, once their job is gone (a job still kept
    -- keeps its repair history) and unless a restore record or a journal evidence note (kept
    -- for good, 0063: who acknowledged it) names them.
    WITH doomed AS (
        SELECT a.audit_id FROM jobs.repair_audit a
        WHERE a.at < now() - make_interval(secs => p_audit_retention_s)
          AND (a.job_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM jobs.jobs j WHERE j.job_id = a.job_id))
          AND NOT EXISTS (SELECT 1 FROM jobs.authority_restores r
                          WHERE r.resolved_audit = a.audit_id)
          AND NOT EXISTS (SELECT 1 FROM jobs.journal_evidence v WHERE v.audit_id = a.audit_id)
        ORDER BY a.at, a.audit_id
        LIMIT p_limit - v_audit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.repair_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_audit + v_rows;
    -- Tombstones one more retention after their job went (a worker down longer than that
    -- reports its begins of such attempts as evidence, for a person to acknowledge). Journal
    -- evidence is never removed (0063): an acknowledged note is the only thing that lets a
    -- journal drop its begin, at that journal's next start or rotation, which may come after
    -- any retention (a worker stopped, or idle); notes come only from what a restore lost.
    WITH doomed AS (
        SELECT t.attempt_id FROM jobs.pruned_attempts t
        WHERE t.pruned_at < v_cutoff
        ORDER BY t.pruned_at
        LIMIT p_limit
        FOR UPDATE OF t SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.pruned_attempts t USING doomed d WHERE t.attempt_id = d.attempt_id
        RETURNING 1
    ) SELECT count(*) INTO v_tombstones FROM gone;
    PERFORM set_config('accord.prune', '', true);
    -- Another schema's deferred foreign key to a removed job fails here, by name: the
    -- deferrable references to jobs.jobs are checked now, then set back to their declared
    -- mode (0039; ALL IMMEDIATE left every deferred constraint of the caller's transaction
    -- immediate, and a second batch in it failed on the key's own reference).
    SELECT string_agg(format('%I.%I', n.nspname, c.conname), ', '),
           string_agg(format('%I.%I', n.nspname, c.conname), ', ') FILTER (WHERE c.condeferred)
    INTO v_refs, v_deferred
    FROM pg_catalog.pg_constraint c JOIN pg_catalog.pg_namespace n ON n.oid = c.connamespace
    WHERE c.contype = 'f' AND c.confrelid = 'jobs.jobs'::regclass AND c.condeferrable;
    IF v_refs IS NOT NULL THEN
        EXECUTE 'SET CONSTRAINTS ' || v_refs || ' IMMEDIATE';
    END IF;
    IF v_deferred IS NOT NULL THEN
        EXECUTE 'SET CONSTRAINTS ' || v_deferred || ' DEFERRED';
    END IF;
    RETURN QUERY SELECT v_jobs, v_effects, v_results, v_audit, v_tombstones;
END $$;

--
-- Name: FUNCTION prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer); Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) IS 'Remove one bounded batch of finished, resolved jobs older than the retention, never shorter than the longest declared replay horizon and kept past it by the inbox''s future tolerance (with their key, effects, traces, escalations and result manifest, leaving a tombstone per attempt whose effects go), of tombstones one retention old, and of audit rows older than the audit retention (resolved restore records, registration audit rows but each class''s newest, repair audit rows whose job is gone; never journal evidence), oldest first; counts per table, tombstones included (0031, 0042, 0054, 0063)';

--
-- Name: pruning(); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.pruning() RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN current_setting('accord.prune', true) = 'jobs'
       AND current_user = (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p
                           WHERE p.oid = 'jobs.prune(double precision,double precision,integer)'
                                         ::regprocedure);
END $$;

--
-- Name: record_result(bigint, text, text, text, text, uuid, bigint, bigint, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.record_result(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text, p_content_digest text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

--
-- Name: renew(bigint, text, text, text, text, uuid, bigint, bigint, double precision); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.renew(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_lease_s double precision) RETURNS TABLE(status text, lease_expires_at timestamp with time zone)
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

--
-- Name: repair_acknowledge_evidence(bigint, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_acknowledge_evidence(p_evidence_id bigint, p_who text, p_evidence text) RETURNS TABLE(status text, job_id bigint, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v jobs.journal_evidence%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
    v_audit bigint;
BEGIN
    IF v_refusal IS NULL THEN
        SELECT * INTO v FROM jobs.journal_evidence x WHERE x.evidence_id = p_evidence_id
        FOR UPDATE;
        v_refusal := CASE
            WHEN v.evidence_id IS NULL THEN 'missing'
            WHEN v.acknowledged_at IS NOT NULL THEN 'already_acknowledged'
        END;
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, v.job_id, NULL::bigint;
        RETURN;
    END IF;
    -- The note's job id is the journal's: after rewound ids another job of this database may
    -- hold it, so the audit row names it in its detail only.
    v_audit := jobs.repair_audit_row(
        'acknowledge_evidence', p_who, v.tenant, NULL, v.effect_key, v.seq, 'acknowledged',
        p_evidence, jsonb_build_object('evidence_id', v.evidence_id, 'job_id', v.job_id,
                                       'attempt_id', v.attempt_id, 'runner_id', v.runner_id,
                                       'idempotency_key', v.idempotency_key));
    UPDATE jobs.journal_evidence x SET acknowledged_at = now(), audit_id = v_audit
    WHERE x.evidence_id = p_evidence_id;
    RETURN QUERY SELECT NULL::text, v.job_id, v_audit;
END $$;

--
-- Name: FUNCTION repair_acknowledge_evidence(p_evidence_id bigint, p_who text, p_evidence text); Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON FUNCTION jobs.repair_acknowledge_evidence(p_evidence_id bigint, p_who text, p_evidence text) IS 'Acknowledge a noted journal begin (jobs.journal_evidence) with a principal and evidence, audited; the journal may then drop it (0054)';

--
-- Name: repair_advance_epoch(text, bigint, bigint, boolean, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_advance_epoch(p_tenant text, p_new_epoch bigint, p_ledger_epoch bigint, p_frozen boolean, p_who text, p_evidence text) RETURNS TABLE(status text, epoch bigint, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    t jobs.tenants%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
    v_detected bigint;
    v_restricted boolean;
    v_audit bigint;
BEGIN
    IF v_refusal IS NULL THEN
        SELECT * INTO t FROM jobs.tenants x WHERE x.tenant = p_tenant FOR UPDATE;
        -- The ledger epoch the open restore recorded: the caller's may not be below it.
        SELECT max(r.ledger_epoch), bool_or(r.ledger_frozen) INTO v_detected, v_restricted
        FROM jobs.authority_restores r WHERE r.tenant = p_tenant AND r.resolved_at IS NULL;
        v_refusal := CASE
            WHEN t.tenant IS NULL THEN 'missing'
            WHEN v_detected IS NULL THEN 'no_restore'
            WHEN p_ledger_epoch IS NULL OR p_ledger_epoch < v_detected THEN 'behind_detection'
            WHEN p_frozen IS NULL OR (v_restricted AND NOT p_frozen) THEN 'keeps_restriction'
            WHEN p_new_epoch IS NULL
              OR p_new_epoch <= greatest(t.epoch, p_ledger_epoch, v_detected) THEN 'not_past_ledger'
        END;
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, t.epoch, NULL::bigint;
        RETURN;
    END IF;
    UPDATE jobs.tenants x SET epoch = p_new_epoch, frozen = p_frozen, updated_at = now()
    WHERE x.tenant = p_tenant;
    PERFORM jobs.drain_fences(p_tenant);
    v_audit := jobs.repair_audit_row(
        'advance_epoch', p_who, p_tenant, NULL, NULL, NULL, p_new_epoch::text, p_evidence,
        jsonb_build_object('from_epoch', t.epoch, 'ledger_epoch', p_ledger_epoch,
                           'was_frozen', t.frozen, 'frozen', p_frozen));
    UPDATE jobs.authority_restores r
    SET resolved_at = now(), resolved_epoch = p_new_epoch, resolved_audit = v_audit
    WHERE r.tenant = p_tenant AND r.resolved_at IS NULL;
    RETURN QUERY SELECT NULL::text, p_new_epoch, v_audit;
END $$;

--
-- Name: repair_audit_row(text, text, text, bigint, text, integer, text, text, jsonb); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_audit_row(p_action text, p_who text, p_tenant text, p_job_id bigint, p_effect_key text, p_seq integer, p_outcome text, p_evidence text, p_detail jsonb) RETURNS bigint
    LANGUAGE sql
    AS $$
    INSERT INTO jobs.repair_audit (action, who, db_user, db_role, tenant, job_id, effect_key,
                                   seq, outcome, evidence, detail)
    VALUES (p_action, p_who, session_user, current_setting('role'), p_tenant, p_job_id,
            p_effect_key, p_seq, p_outcome, p_evidence, p_detail)
    RETURNING audit_id
$$;

--
-- Name: repair_escalate(double precision, integer); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_escalate(p_older_than_s double precision, p_limit integer) RETURNS TABLE(job_id bigint, effect_key text, seq integer, tenant text, age_s double precision)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    INSERT INTO jobs.effect_escalations AS x (job_id, effect_key, seq, tenant, age_s)
    SELECT r.job_id, r.effect_key, r.seq, r.tenant,
           extract(epoch FROM now() - r.begun_at)::double precision
    FROM jobs.reconciliation r
    WHERE r.escalated_at IS NULL
      AND r.begun_at < now() - make_interval(secs => p_older_than_s)
    ORDER BY r.begun_at
    LIMIT p_limit
    ON CONFLICT DO NOTHING
    RETURNING x.job_id, x.effect_key, x.seq, x.tenant, x.age_s
$$;

--
-- Name: repair_refusal(text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_refusal(p_who text, p_evidence text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE
        WHEN coalesce(btrim(p_who), '') = '' THEN 'no_principal'
        WHEN coalesce(btrim(p_evidence), '') = '' THEN 'no_evidence'
    END
$$;

--
-- Name: repair_release_hold(bigint, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_release_hold(p_job_id bigint, p_who text, p_evidence text) RETURNS TABLE(status text, job_state text, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    j jobs.jobs%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
BEGIN
    IF v_refusal IS NULL THEN
        SELECT * INTO j FROM jobs.jobs x WHERE x.job_id = p_job_id FOR UPDATE;
        v_refusal := CASE
            WHEN j.job_id IS NULL THEN 'missing'
            WHEN j.state = 'running' THEN 'running'
            WHEN j.state <> 'held' THEN 'not_held'
            WHEN EXISTS (SELECT 1 FROM jobs.authority_restores r
                         WHERE r.tenant = j.tenant AND r.resolved_at IS NULL)
                THEN 'restore_unresolved'
        END;
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, j.state, NULL::bigint;
        RETURN;
    END IF;
    UPDATE jobs.jobs x
    SET state = CASE WHEN x.final_failure AND NOT jobs.unresolved_effects(x.job_id)
                          THEN 'failed'  -- given up for good (0055): never run again
                     WHEN jobs.blocking_effects(x.job_id) THEN 'unknown'
                     ELSE 'queued' END,
        generation = x.generation + 1, run_after = now(), updated_at = now()
    WHERE x.job_id = p_job_id RETURNING x.state INTO j.state;
    RETURN QUERY SELECT NULL::text, j.state,
        jobs.repair_audit_row('release_hold', p_who, j.tenant, p_job_id, NULL, NULL, j.state,
                              p_evidence, '{}'::jsonb);
END $$;

--
-- Name: repair_requeue_poison(bigint, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_requeue_poison(p_job_id bigint, p_who text, p_evidence text) RETURNS TABLE(status text, job_state text, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    j jobs.jobs%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
BEGIN
    IF v_refusal IS NULL THEN
        SELECT * INTO j FROM jobs.jobs x WHERE x.job_id = p_job_id FOR UPDATE;
        v_refusal := CASE
            WHEN j.job_id IS NULL THEN 'missing'
            WHEN j.state = 'running' THEN 'running'
            WHEN j.state <> 'poison' THEN 'not_poison'
            WHEN jobs.blocking_effects(p_job_id) THEN 'effects_unresolved'
            WHEN EXISTS (SELECT 1 FROM jobs.authority_restores r
                         WHERE r.tenant = j.tenant AND r.resolved_at IS NULL)
                THEN 'restore_unresolved'
        END;
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, j.state, NULL::bigint;
        RETURN;
    END IF;
    UPDATE jobs.jobs x
    SET state = 'queued', attempts = 0, generation = x.generation + 1, run_after = now(),
        updated_at = now()
    WHERE x.job_id = p_job_id;
    RETURN QUERY SELECT NULL::text, 'queued'::text,
        jobs.repair_audit_row('requeue_poison', p_who, j.tenant, p_job_id, NULL, NULL, 'queued',
                              p_evidence, jsonb_build_object('attempts', j.attempts,
                                                             'last_error', j.last_error));
END $$;

--
-- Name: repair_resolve_effect(bigint, text, text, text, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text) RETURNS TABLE(status text, seq integer, job_state text, audit_id bigint)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT * FROM jobs.repair_resolve_effect(p_job_id, p_key, p_outcome, p_receipt, p_who,
                                             p_evidence, NULL::integer)
$$;

--
-- Name: repair_resolve_effect(bigint, text, text, text, text, text, integer); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text, p_seq integer) RETURNS TABLE(status text, seq integer, job_state text, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    j jobs.jobs%ROWTYPE;
    e jobs.effects%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
    v_audit bigint;
BEGIN
    IF v_refusal IS NULL AND p_outcome NOT IN ('succeeded', 'failed_before_dispatch') THEN
        v_refusal := 'invalid_outcome';
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, NULL::integer, NULL::text, NULL::bigint;
        RETURN;
    END IF;
    SELECT * INTO j FROM jobs.jobs x WHERE x.job_id = p_job_id FOR UPDATE;
    IF NOT FOUND OR j.state = 'running' THEN
        RETURN QUERY SELECT CASE WHEN j.job_id IS NULL THEN 'missing' ELSE 'running' END,
                            NULL::integer, j.state, NULL::bigint;
        RETURN;
    END IF;
    SELECT * INTO e FROM jobs.effects x WHERE x.job_id = p_job_id AND x.effect_key = p_key
    ORDER BY x.seq DESC LIMIT 1 FOR UPDATE;
    IF NOT FOUND OR e.state NOT IN ('pending', 'unknown')
       OR (p_seq IS NOT NULL AND e.seq <> p_seq) THEN
        RETURN QUERY SELECT CASE WHEN e.job_id IS NULL THEN 'missing_effect'
                                 WHEN p_seq IS NOT NULL AND e.seq <> p_seq THEN 'seq_moved'
                                 ELSE 'not_unresolved' END, e.seq, j.state, NULL::bigint;
        RETURN;
    END IF;
    PERFORM set_config('accord.repair_effect',
                       jsonb_build_array(e.job_id, e.effect_key, e.seq)::text, true);
    UPDATE jobs.effects x SET state = p_outcome, receipt = coalesce(p_receipt, x.receipt),
                              finished_at = now()
    WHERE x.job_id = e.job_id AND x.effect_key = e.effect_key AND x.seq = e.seq;
    PERFORM set_config('accord.repair_effect', '', true);
    IF j.state = 'unknown' AND j.final_failure THEN
        -- Given up without a retry (0055): with nothing unresolved left it is failed, as
        -- jobs.fail would have made it had the outcomes been known then; never run again.
        IF NOT jobs.unresolved_effects(p_job_id) THEN
            UPDATE jobs.jobs x SET state = 'failed', updated_at = now()
            WHERE x.job_id = p_job_id RETURNING x.state INTO j.state;
        END IF;
    -- An unknown job with nothing left forbidding a rerun is queued again, unless its
    -- tenant's restore is open: then it stays unknown, for a person to resume after.
    ELSIF j.state = 'unknown' AND NOT jobs.blocking_effects(p_job_id)
       AND NOT EXISTS (SELECT 1 FROM jobs.authority_restores r
                       WHERE r.tenant = j.tenant AND r.resolved_at IS NULL) THEN
        UPDATE jobs.jobs x SET state = 'queued', generation = x.generation + 1,
                               run_after = now(), updated_at = now()
        WHERE x.job_id = p_job_id RETURNING x.state INTO j.state;
    END IF;
    v_audit := jobs.repair_audit_row('resolve_effect', p_who, j.tenant, p_job_id, p_key, e.seq,
                                     p_outcome, p_evidence,
                                     jsonb_build_object('from', e.state, 'receipt', p_receipt,
                                                        'job_state', j.state));
    RETURN QUERY SELECT NULL::text, e.seq, j.state, v_audit;
END $$;

--
-- Name: repair_resume(bigint, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.repair_resume(p_job_id bigint, p_who text, p_evidence text) RETURNS TABLE(status text, job_state text, audit_id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    j jobs.jobs%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
BEGIN
    IF v_refusal IS NULL THEN
        SELECT * INTO j FROM jobs.jobs x WHERE x.job_id = p_job_id FOR UPDATE;
        v_refusal := CASE
            WHEN j.job_id IS NULL THEN 'missing'
            WHEN j.state = 'running' THEN 'running'
            WHEN j.state <> 'unknown' THEN 'not_resumable'
            -- its handler gave it up without a retry (0055): never run again
            WHEN j.final_failure THEN 'final_failure'
            WHEN jobs.unresolved_effects(p_job_id) THEN 'effects_unresolved'
            WHEN EXISTS (SELECT 1 FROM jobs.authority_restores r
                         WHERE r.tenant = j.tenant AND r.resolved_at IS NULL)
                THEN 'restore_unresolved'
        END;
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, j.state, NULL::bigint;
        RETURN;
    END IF;
    UPDATE jobs.jobs x
    SET state = 'queued', generation = x.generation + 1, resumed_generation = x.generation + 1,
        run_after = now(), updated_at = now()
    WHERE x.job_id = p_job_id;
    RETURN QUERY SELECT NULL::text, 'queued'::text,
        jobs.repair_audit_row(
            'resume', p_who, j.tenant, p_job_id, NULL, NULL, 'queued', p_evidence,
            jsonb_build_object(
                'from', j.state, 'generation', j.generation + 1, 'attempts', j.attempts,
                'last_error', j.last_error,
                'succeeded_effects', (SELECT coalesce(jsonb_agg(jsonb_build_array(
                                                 e.effect_key, e.seq, e.receipt)
                                             ORDER BY e.effect_key, e.seq), '[]'::jsonb)
                                      FROM jobs.effects e
                                      WHERE e.job_id = p_job_id AND e.state = 'succeeded')));
END $$;

--
-- Name: rescue(integer, double precision, double precision); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.rescue(p_limit integer, p_backoff_base_s double precision, p_backoff_max_s double precision) RETURNS TABLE(job_id bigint, tenant text, state text, generation bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

--
-- Name: rotate_epoch(text); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.rotate_epoch(p_tenant text) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_epoch bigint;
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    UPDATE jobs.tenants SET epoch = epoch + 1, updated_at = now()
    WHERE tenant = p_tenant RETURNING epoch INTO v_epoch;
    PERFORM jobs.drain_fences(p_tenant);
    RETURN v_epoch;
END $$;

--
-- Name: set_frozen(text, boolean); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.set_frozen(p_tenant text, p_frozen boolean) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: submit(text, text, text, text, jsonb, integer); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.submit(p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb, p_max_attempts integer) RETURNS TABLE(job_id bigint, created boolean, state text, digest text)
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

--
-- Name: succeed(bigint, text, text, text, text, uuid, bigint, bigint); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.succeed(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

--
-- Name: succeed_many(bigint[], text[], text[], text[], text[], uuid[], bigint[], bigint[]); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.succeed_many(p_job_ids bigint[], p_tenants text[], p_workflows text[], p_operation_ids text[], p_owners text[], p_attempt_ids uuid[], p_generations bigint[], p_epochs bigint[]) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
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

--
-- Name: succeed_with_result(bigint, text, text, text, text, uuid, bigint, bigint, text, text); Type: FUNCTION; Schema: jobs; Owner: -
--

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

--
-- Name: tenant_frozen_sync(); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.tenant_frozen_sync() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
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

--
-- Name: unresolved_effects(bigint); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.unresolved_effects(p_job_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (SELECT 1 FROM jobs.effects e
                   WHERE e.job_id = p_job_id AND e.state IN ('pending', 'unknown'))
$$;

--
-- Name: workflow_effects_sync(); Type: FUNCTION; Schema: jobs; Owner: -
--

CREATE FUNCTION jobs.workflow_effects_sync() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    IF NEW.effects_enabled THEN
        UPDATE jobs.jobs j SET run_after = now(), updated_at = now()
        WHERE j.workflow = NEW.workflow AND j.state = 'queued'
          AND j.tenant_frozen = ANY (ARRAY[false, true])
          AND j.run_after = 'infinity'::timestamptz
          AND j.last_error = 'effects_disabled';
    ELSE
        UPDATE jobs.jobs j SET run_after = 'infinity'::timestamptz, updated_at = now()
        WHERE j.workflow = NEW.workflow AND j.state = 'queued'
          AND j.tenant_frozen = ANY (ARRAY[false, true])
          AND j.run_after < 'infinity'::timestamptz
          AND j.last_error = 'effects_disabled';
    END IF;
    RETURN NULL;
END $$;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: authority_restores; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.authority_restores (
    restore_id bigint NOT NULL,
    tenant text NOT NULL,
    db_epoch bigint NOT NULL,
    ledger_epoch bigint NOT NULL,
    held_jobs integer DEFAULT 0 NOT NULL,
    detected_at timestamp with time zone DEFAULT now() NOT NULL,
    detected_by text NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    resolved_at timestamp with time zone,
    resolved_epoch bigint,
    resolved_audit bigint,
    ledger_frozen boolean DEFAULT false NOT NULL,
    CONSTRAINT authority_restores_held_jobs_check CHECK ((held_jobs >= 0)),
    CONSTRAINT authority_restores_resolved_check CHECK (((resolved_at IS NULL) = (resolved_epoch IS NULL)))
);

--
-- Name: authority_restores_restore_id_seq; Type: SEQUENCE; Schema: jobs; Owner: -
--

ALTER TABLE jobs.authority_restores ALTER COLUMN restore_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobs.authority_restores_restore_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: effect_escalations; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.effect_escalations (
    job_id bigint NOT NULL,
    effect_key text NOT NULL,
    seq integer NOT NULL,
    tenant text NOT NULL,
    escalated_at timestamp with time zone DEFAULT now() NOT NULL,
    age_s double precision NOT NULL
);

--
-- Name: effect_traces; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.effect_traces (
    job_id bigint NOT NULL,
    effect_key text NOT NULL,
    seq integer NOT NULL,
    trace jsonb NOT NULL
);

--
-- Name: effects; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.effects (
    tenant text NOT NULL,
    job_id bigint NOT NULL,
    effect_key text NOT NULL,
    seq integer NOT NULL,
    intent_digest text NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    receipt text,
    attempt_id uuid NOT NULL,
    generation bigint NOT NULL,
    begun_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT effects_effect_key_check CHECK ((effect_key <> ''::text)),
    CONSTRAINT effects_seq_check CHECK ((seq >= 1)),
    CONSTRAINT effects_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'succeeded'::text, 'failed_before_dispatch'::text, 'unknown'::text])))
);

--
-- Name: jobs; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.jobs (
    job_id bigint NOT NULL,
    tenant text NOT NULL,
    workflow text NOT NULL,
    operation_id text NOT NULL,
    digest text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    state text DEFAULT 'queued'::text NOT NULL,
    generation bigint DEFAULT 0 NOT NULL,
    owner text,
    attempt_id uuid,
    epoch bigint,
    lease_expires_at timestamp with time zone,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 5 NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    last_error text,
    resumed_generation bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    unresolved_effects integer DEFAULT 0 NOT NULL,
    trace jsonb,
    attempt_trace jsonb,
    tenant_frozen boolean DEFAULT false NOT NULL,
    final_failure boolean DEFAULT false NOT NULL,
    lease_granted_until timestamp with time zone,
    CONSTRAINT jobs_lease_check CHECK ((((state = 'running'::text) = (lease_expires_at IS NOT NULL)) AND ((state <> 'running'::text) OR ((owner IS NOT NULL) AND (attempt_id IS NOT NULL) AND (epoch IS NOT NULL))))),
    CONSTRAINT jobs_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_state_check CHECK ((state = ANY (ARRAY['queued'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'poison'::text, 'canceled'::text, 'unknown'::text, 'held'::text])))
);

--
-- Name: COLUMN jobs.tenant_frozen; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON COLUMN jobs.jobs.tenant_frozen IS 'jobs.tenants.frozen of the job''s tenant, for every job that is not finished (0037): the claim''s index leaves out frozen tenants'' jobs by it. Kept by jobs.tenant_frozen_sync and jobs.submit; the claim still checks jobs.tenants itself.';

--
-- Name: COLUMN jobs.final_failure; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON COLUMN jobs.jobs.final_failure IS 'The last attempt gave the job up without a retry (jobs.fail with p_retry false): once no effect of it is unresolved it is failed, never queued or resumed (0055)';

--
-- Name: COLUMN jobs.lease_granted_until; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON COLUMN jobs.jobs.lease_granted_until IS 'The latest lease end ever granted to an attempt of the job (claim, renew); never lowered by a cut, drain or rescue: no attempt sends after it (0058)';

--
-- Name: CONSTRAINT jobs_lease_check ON jobs; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON CONSTRAINT jobs_lease_check ON jobs.jobs IS 'A lease exists exactly while the job runs. jobs.succeed, jobs.succeed_many and jobs.rescue read an unexpired (or any) lease as running (0011): relaxing this check weakens their fences.';

--
-- Name: jobs_job_id_seq; Type: SEQUENCE; Schema: jobs; Owner: -
--

ALTER TABLE jobs.jobs ALTER COLUMN job_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobs.jobs_job_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: journal_evidence; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.journal_evidence (
    evidence_id bigint NOT NULL,
    job_id bigint NOT NULL,
    effect_key text NOT NULL,
    seq integer NOT NULL,
    attempt_id uuid NOT NULL,
    tenant text NOT NULL,
    runner_id text NOT NULL,
    idempotency_key text,
    found_at timestamp with time zone DEFAULT now() NOT NULL,
    acknowledged_at timestamp with time zone,
    audit_id bigint,
    CONSTRAINT journal_evidence_acknowledged_check CHECK (((acknowledged_at IS NULL) = (audit_id IS NULL))),
    CONSTRAINT journal_evidence_seq_check CHECK ((seq >= 1))
);

--
-- Name: TABLE journal_evidence; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON TABLE jobs.journal_evidence IS 'Journaled effect begins a worker start found that the database holds no record of (a restore''s doing); the journal keeps each until a person acknowledges it (0054)';

--
-- Name: journal_evidence_evidence_id_seq; Type: SEQUENCE; Schema: jobs; Owner: -
--

ALTER TABLE jobs.journal_evidence ALTER COLUMN evidence_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobs.journal_evidence_evidence_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: operations; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.operations (
    tenant text NOT NULL,
    workflow text NOT NULL,
    operation_id text NOT NULL,
    job_id bigint NOT NULL,
    CONSTRAINT operations_operation_id_check CHECK ((operation_id <> ''::text)),
    CONSTRAINT operations_workflow_check CHECK ((workflow <> ''::text))
);

--
-- Name: pruned; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.pruned (
    one boolean DEFAULT true NOT NULL,
    through_job_id bigint NOT NULL,
    CONSTRAINT pruned_one_check CHECK (one)
);

--
-- Name: TABLE pruned; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON TABLE jobs.pruned IS 'Below the lowest job id still present when migration 0054 froze it, the highest job id jobs.prune had removed (later removals leave jobs.pruned_attempts): a journaled begin, never noted as evidence, of a job gone at or below it was resolved (0047, 0054)';

--
-- Name: pruned_attempts; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.pruned_attempts (
    attempt_id uuid NOT NULL,
    pruned_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: TABLE pruned_attempts; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON TABLE jobs.pruned_attempts IS 'Attempts whose effect rows jobs.prune removed (resolved), kept one more jobs retention: a journaled begin of one may be let go (0054)';

--
-- Name: reconciliation; Type: VIEW; Schema: jobs; Owner: -
--

CREATE VIEW jobs.reconciliation AS
 SELECT e.tenant,
    e.job_id,
    j.workflow,
    j.operation_id,
    j.state AS job_state,
    e.effect_key,
    e.seq,
    e.intent_digest,
    e.state,
    e.receipt,
    e.attempt_id,
    e.generation,
    e.begun_at,
    x.escalated_at,
    GREATEST(e.begun_at, e.finished_at,
        CASE
            WHEN (j.state <> 'running'::text) THEN GREATEST(j.updated_at, j.lease_granted_until)
            ELSE NULL::timestamp with time zone
        END, rs.seen_at) AS quiet_since
   FROM (((jobs.effects e
     JOIN jobs.jobs j ON ((j.job_id = e.job_id)))
     LEFT JOIN jobs.effect_escalations x ON (((x.job_id = e.job_id) AND (x.effect_key = e.effect_key) AND (x.seq = e.seq))))
     LEFT JOIN ( SELECT r.tenant,
            max(GREATEST(r.detected_at, r.last_seen_at)) AS seen_at
           FROM jobs.authority_restores r
          GROUP BY r.tenant) rs ON ((rs.tenant = e.tenant)))
  WHERE ((e.state = 'unknown'::text) OR ((e.state = 'pending'::text) AND (j.state <> 'running'::text)));

--
-- Name: COLUMN reconciliation.quiet_since; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON COLUMN jobs.reconciliation.quiet_since IS 'Since when nothing of the job''s attempts can still be sending: the effect''s begin or recorded finish, the job''s last change and granted lease end once it no longer runs, its tenant''s latest detected restore, whichever is latest; reconcile trusts a "never seen" only settle_s after it (0058)';

--
-- Name: registration_audit; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.registration_audit (
    audit_id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    action text NOT NULL,
    workflow text NOT NULL,
    owner text NOT NULL,
    effects_enabled boolean NOT NULL,
    previous_owner text,
    previous_effects_enabled boolean,
    who text NOT NULL,
    db_user text DEFAULT SESSION_USER NOT NULL,
    CONSTRAINT registration_audit_action_check CHECK ((action = ANY (ARRAY['register'::text, 'transfer'::text]))),
    CONSTRAINT registration_audit_who_check CHECK ((who <> ''::text))
);

--
-- Name: registration_audit_audit_id_seq; Type: SEQUENCE; Schema: jobs; Owner: -
--

ALTER TABLE jobs.registration_audit ALTER COLUMN audit_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobs.registration_audit_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: repair_audit; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.repair_audit (
    audit_id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    action text NOT NULL,
    who text NOT NULL,
    db_user text NOT NULL,
    db_role text NOT NULL,
    tenant text NOT NULL,
    job_id bigint,
    effect_key text,
    seq integer,
    outcome text NOT NULL,
    evidence text NOT NULL,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT repair_audit_action_check CHECK ((action = ANY (ARRAY['resolve_effect'::text, 'release_hold'::text, 'requeue_poison'::text, 'resume'::text, 'advance_epoch'::text, 'acknowledge_evidence'::text]))),
    CONSTRAINT repair_audit_evidence_check CHECK ((evidence <> ''::text)),
    CONSTRAINT repair_audit_who_check CHECK ((who <> ''::text))
);

--
-- Name: repair_audit_audit_id_seq; Type: SEQUENCE; Schema: jobs; Owner: -
--

ALTER TABLE jobs.repair_audit ALTER COLUMN audit_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobs.repair_audit_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: results; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.results (
    job_id bigint NOT NULL,
    tenant text NOT NULL,
    object_key text NOT NULL,
    content_digest text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: tenants; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.tenants (
    tenant text NOT NULL,
    epoch bigint DEFAULT 1 NOT NULL,
    frozen boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    ledger_epoch bigint,
    CONSTRAINT tenants_epoch_check CHECK ((epoch >= 1)),
    CONSTRAINT tenants_ledger_epoch_check CHECK ((ledger_epoch >= 1)),
    CONSTRAINT tenants_tenant_check CHECK ((tenant <> ''::text))
);

--
-- Name: COLUMN tenants.ledger_epoch; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON COLUMN jobs.tenants.ledger_epoch IS 'The highest epoch a restore check found or wrote in the authority ledger for this tenant; a ledger holding less is refused (0052)';

--
-- Name: workflows; Type: TABLE; Schema: jobs; Owner: -
--

CREATE TABLE jobs.workflows (
    workflow text NOT NULL,
    owner text NOT NULL,
    effects_enabled boolean DEFAULT false NOT NULL,
    registered_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workflows_owner_check CHECK ((owner <> ''::text)),
    CONSTRAINT workflows_workflow_check CHECK ((workflow <> ''::text))
);

--
-- Name: waiting; Type: VIEW; Schema: jobs; Owner: -
--

CREATE VIEW jobs.waiting AS
 WITH live AS (
         SELECT jobs.workflow,
            count(*) AS leases
           FROM jobs.jobs
          WHERE ((jobs.state = 'running'::text) AND (jobs.lease_expires_at > now()))
          GROUP BY jobs.workflow
        ), unresolved AS (
         SELECT DISTINCT e.job_id
           FROM jobs.effects e
          WHERE (e.state = ANY (ARRAY['pending'::text, 'unknown'::text]))
        ), classified AS (
         SELECT j.job_id,
            j.state,
            j.tenant,
            j.workflow,
            j.created_at,
            ((j.resumed_generation IS DISTINCT FROM j.generation) AND (EXISTS ( SELECT 1
                   FROM jobs.effects e
                  WHERE ((e.job_id = j.job_id) AND (e.state = 'succeeded'::text))))) AS succeeded_effect,
            (u.job_id IS NOT NULL) AS unresolved_effect,
            (w.workflow IS NOT NULL) AS registered,
            w.effects_enabled,
            t.frozen,
            t.epoch AS tenant_epoch,
            j.epoch,
            j.lease_expires_at,
            j.run_after,
            j.last_error,
            l.leases
           FROM ((((( SELECT jobs.job_id,
                    jobs.tenant,
                    jobs.workflow,
                    jobs.operation_id,
                    jobs.digest,
                    jobs.payload,
                    jobs.state,
                    jobs.generation,
                    jobs.owner,
                    jobs.attempt_id,
                    jobs.epoch,
                    jobs.lease_expires_at,
                    jobs.attempts,
                    jobs.max_attempts,
                    jobs.run_after,
                    jobs.last_error,
                    jobs.resumed_generation,
                    jobs.created_at,
                    jobs.updated_at,
                    jobs.unresolved_effects,
                    jobs.trace,
                    jobs.attempt_trace
                   FROM jobs.jobs
                  WHERE (jobs.state = 'queued'::text)
                UNION ALL
                 SELECT jobs.job_id,
                    jobs.tenant,
                    jobs.workflow,
                    jobs.operation_id,
                    jobs.digest,
                    jobs.payload,
                    jobs.state,
                    jobs.generation,
                    jobs.owner,
                    jobs.attempt_id,
                    jobs.epoch,
                    jobs.lease_expires_at,
                    jobs.attempts,
                    jobs.max_attempts,
                    jobs.run_after,
                    jobs.last_error,
                    jobs.resumed_generation,
                    jobs.created_at,
                    jobs.updated_at,
                    jobs.unresolved_effects,
                    jobs.trace,
                    jobs.attempt_trace
                   FROM jobs.jobs
                  WHERE (jobs.state = 'running'::text)
                UNION ALL
                 SELECT jobs.job_id,
                    jobs.tenant,
                    jobs.workflow,
                    jobs.operation_id,
                    jobs.digest,
                    jobs.payload,
                    jobs.state,
                    jobs.generation,
                    jobs.owner,
                    jobs.attempt_id,
                    jobs.epoch,
                    jobs.lease_expires_at,
                    jobs.attempts,
                    jobs.max_attempts,
                    jobs.run_after,
                    jobs.last_error,
                    jobs.resumed_generation,
                    jobs.created_at,
                    jobs.updated_at,
                    jobs.unresolved_effects,
                    jobs.trace,
                    jobs.attempt_trace
                   FROM jobs.jobs
                  WHERE (jobs.state = ANY (ARRAY['held'::text, 'unknown'::text]))
                UNION ALL
                 SELECT f.job_id,
                    f.tenant,
                    f.workflow,
                    f.operation_id,
                    f.digest,
                    f.payload,
                    f.state,
                    f.generation,
                    f.owner,
                    f.attempt_id,
                    f.epoch,
                    f.lease_expires_at,
                    f.attempts,
                    f.max_attempts,
                    f.run_after,
                    f.last_error,
                    f.resumed_generation,
                    f.created_at,
                    f.updated_at,
                    f.unresolved_effects,
                    f.trace,
                    f.attempt_trace
                   FROM (unresolved uf
                     JOIN jobs.jobs f ON ((f.job_id = uf.job_id)))
                  WHERE (f.state = ANY (ARRAY['canceled'::text, 'failed'::text, 'poison'::text]))) j
             JOIN jobs.tenants t ON ((t.tenant = j.tenant)))
             LEFT JOIN jobs.workflows w ON ((w.workflow = j.workflow)))
             LEFT JOIN live l ON ((l.workflow = j.workflow)))
             LEFT JOIN unresolved u ON ((u.job_id = j.job_id)))
          WHERE ((j.state = ANY (ARRAY['queued'::text, 'held'::text, 'unknown'::text, 'running'::text])) OR ((j.state = ANY (ARRAY['canceled'::text, 'failed'::text, 'poison'::text])) AND (u.job_id IS NOT NULL)))
        )
 SELECT classified.job_id,
    classified.state,
    classified.tenant,
    classified.workflow,
    classified.created_at,
    ((classified.state = 'queued'::text) AND (classified.run_after <= now()) AND (NOT classified.frozen) AND classified.registered AND (NOT classified.unresolved_effect) AND (NOT classified.succeeded_effect) AND ((classified.last_error IS DISTINCT FROM 'effects_disabled'::text) OR classified.effects_enabled)) AS claimable,
        CASE
            WHEN (classified.state = 'held'::text) THEN 'held'::text
            WHEN ((classified.state = 'unknown'::text) AND (NOT classified.unresolved_effect)) THEN 'awaiting_resume'::text
            WHEN (classified.state = 'unknown'::text) THEN 'unresolved_effect'::text
            WHEN (classified.state = ANY (ARRAY['canceled'::text, 'failed'::text, 'poison'::text])) THEN 'unresolved_effect'::text
            WHEN ((classified.state = 'running'::text) AND (classified.epoch IS DISTINCT FROM classified.tenant_epoch)) THEN 'epoch_rotated'::text
            WHEN ((classified.state = 'running'::text) AND (classified.lease_expires_at <= now())) THEN 'lease_expired'::text
            WHEN ((classified.state = 'running'::text) AND classified.frozen) THEN 'tenant_frozen'::text
            WHEN (classified.state = 'running'::text) THEN NULL::text
            WHEN (NOT classified.registered) THEN 'unregistered_workflow'::text
            WHEN classified.frozen THEN 'tenant_frozen'::text
            WHEN classified.unresolved_effect THEN 'unresolved_effect'::text
            WHEN classified.succeeded_effect THEN 'blocked_by_effect'::text
            WHEN ((NOT classified.effects_enabled) AND (classified.last_error = 'effects_disabled'::text)) THEN 'effects_disabled'::text
            WHEN (classified.run_after > now()) THEN 'backoff'::text
            WHEN (classified.leases IS NULL) THEN 'no_live_worker'::text
            ELSE 'workers_busy'::text
        END AS reason
   FROM classified;

--
-- Name: VIEW waiting; Type: COMMENT; Schema: jobs; Owner: -
--

COMMENT ON VIEW jobs.waiting IS 'Why each unfinished job waits; claimable = jobs.claim''s eligibility (kept in agreement by test)';

--
-- Name: authority_restores authority_restores_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.authority_restores
    ADD CONSTRAINT authority_restores_pkey PRIMARY KEY (restore_id);

--
-- Name: effect_escalations effect_escalations_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.effect_escalations
    ADD CONSTRAINT effect_escalations_pkey PRIMARY KEY (job_id, effect_key, seq);

--
-- Name: effect_traces effect_traces_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.effect_traces
    ADD CONSTRAINT effect_traces_pkey PRIMARY KEY (job_id, effect_key, seq);

--
-- Name: effects effects_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.effects
    ADD CONSTRAINT effects_pkey PRIMARY KEY (job_id, effect_key, seq);

--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (job_id);

--
-- Name: journal_evidence journal_evidence_begin_unique; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.journal_evidence
    ADD CONSTRAINT journal_evidence_begin_unique UNIQUE (job_id, effect_key, seq, attempt_id);

--
-- Name: journal_evidence journal_evidence_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.journal_evidence
    ADD CONSTRAINT journal_evidence_pkey PRIMARY KEY (evidence_id);

--
-- Name: operations operations_job_key; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.operations
    ADD CONSTRAINT operations_job_key UNIQUE (job_id, tenant, workflow, operation_id);

--
-- Name: operations operations_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.operations
    ADD CONSTRAINT operations_pkey PRIMARY KEY (tenant, workflow, operation_id);

--
-- Name: pruned_attempts pruned_attempts_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.pruned_attempts
    ADD CONSTRAINT pruned_attempts_pkey PRIMARY KEY (attempt_id);

--
-- Name: pruned pruned_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.pruned
    ADD CONSTRAINT pruned_pkey PRIMARY KEY (one);

--
-- Name: registration_audit registration_audit_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.registration_audit
    ADD CONSTRAINT registration_audit_pkey PRIMARY KEY (audit_id);

--
-- Name: repair_audit repair_audit_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.repair_audit
    ADD CONSTRAINT repair_audit_pkey PRIMARY KEY (audit_id);

--
-- Name: results results_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.results
    ADD CONSTRAINT results_pkey PRIMARY KEY (job_id);

--
-- Name: tenants tenants_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.tenants
    ADD CONSTRAINT tenants_pkey PRIMARY KEY (tenant);

--
-- Name: workflows workflows_pkey; Type: CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.workflows
    ADD CONSTRAINT workflows_pkey PRIMARY KEY (workflow);

--
-- Name: authority_restores_open_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE UNIQUE INDEX authority_restores_open_idx ON jobs.authority_restores USING btree (tenant) WHERE (resolved_at IS NULL);

--
-- Name: authority_restores_resolved_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX authority_restores_resolved_idx ON jobs.authority_restores USING btree (resolved_at, restore_id) WHERE (resolved_at IS NOT NULL);

--
-- Name: effects_job_unresolved_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX effects_job_unresolved_idx ON jobs.effects USING btree (job_id) WHERE (state = ANY (ARRAY['pending'::text, 'unknown'::text]));

--
-- Name: effects_one_live_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE UNIQUE INDEX effects_one_live_idx ON jobs.effects USING btree (job_id, effect_key) WHERE (state <> 'failed_before_dispatch'::text);

--
-- Name: effects_unresolved_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX effects_unresolved_idx ON jobs.effects USING btree (begun_at) WHERE (state = ANY (ARRAY['pending'::text, 'unknown'::text]));

--
-- Name: jobs_attention_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX jobs_attention_idx ON jobs.jobs USING btree (state) WHERE (state = ANY (ARRAY['poison'::text, 'unknown'::text, 'canceled'::text, 'held'::text]));

--
-- Name: jobs_claimable_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX jobs_claimable_idx ON jobs.jobs USING btree (workflow, tenant_frozen, run_after, job_id) WHERE (state = 'queued'::text);

--
-- Name: jobs_finished_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX jobs_finished_idx ON jobs.jobs USING btree (updated_at) WHERE (state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'poison'::text, 'canceled'::text]));

--
-- Name: jobs_prunable_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX jobs_prunable_idx ON jobs.jobs USING btree (updated_at) WHERE ((state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])) AND (unresolved_effects = 0));

--
-- Name: jobs_running_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX jobs_running_idx ON jobs.jobs USING btree (lease_expires_at) WHERE (state = 'running'::text);

--
-- Name: jobs_tenant_frozen_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX jobs_tenant_frozen_idx ON jobs.jobs USING btree (tenant) WHERE tenant_frozen;

--
-- Name: journal_evidence_audit_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX journal_evidence_audit_idx ON jobs.journal_evidence USING btree (audit_id) WHERE (audit_id IS NOT NULL);

--
-- Name: journal_evidence_open_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX journal_evidence_open_idx ON jobs.journal_evidence USING btree (evidence_id) WHERE (acknowledged_at IS NULL);

--
-- Name: pruned_attempts_pruned_at_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX pruned_attempts_pruned_at_idx ON jobs.pruned_attempts USING btree (pruned_at);

--
-- Name: registration_audit_at_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX registration_audit_at_idx ON jobs.registration_audit USING btree (at, audit_id);

--
-- Name: registration_audit_workflow_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX registration_audit_workflow_idx ON jobs.registration_audit USING btree (workflow, audit_id);

--
-- Name: repair_audit_at_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX repair_audit_at_idx ON jobs.repair_audit USING btree (at, audit_id);

--
-- Name: repair_audit_job_idx; Type: INDEX; Schema: jobs; Owner: -
--

CREATE INDEX repair_audit_job_idx ON jobs.repair_audit USING btree (job_id) WHERE (job_id IS NOT NULL);

--
-- Name: authority_restores authority_restores_pruned_only; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER authority_restores_pruned_only BEFORE DELETE ON jobs.authority_restores FOR EACH ROW EXECUTE FUNCTION jobs.audit_guard();

--
-- Name: effects effects_count; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER effects_count AFTER INSERT OR UPDATE OF state ON jobs.effects FOR EACH ROW EXECUTE FUNCTION jobs.effects_count();

--
-- Name: effects effects_guard; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER effects_guard BEFORE DELETE OR UPDATE ON jobs.effects FOR EACH ROW EXECUTE FUNCTION jobs.effects_guard();

--
-- Name: registration_audit registration_audit_append_only; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER registration_audit_append_only BEFORE DELETE OR UPDATE ON jobs.registration_audit FOR EACH ROW EXECUTE FUNCTION jobs.audit_guard();

--
-- Name: registration_audit registration_audit_no_truncate; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER registration_audit_no_truncate BEFORE TRUNCATE ON jobs.registration_audit FOR EACH STATEMENT EXECUTE FUNCTION jobs.append_only();

--
-- Name: repair_audit repair_audit_append_only; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER repair_audit_append_only BEFORE DELETE OR UPDATE ON jobs.repair_audit FOR EACH ROW EXECUTE FUNCTION jobs.audit_guard();

--
-- Name: repair_audit repair_audit_no_truncate; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER repair_audit_no_truncate BEFORE TRUNCATE ON jobs.repair_audit FOR EACH STATEMENT EXECUTE FUNCTION jobs.append_only();

--
-- Name: tenants tenants_frozen_sync; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER tenants_frozen_sync AFTER UPDATE OF frozen ON jobs.tenants FOR EACH ROW WHEN ((old.frozen IS DISTINCT FROM new.frozen)) EXECUTE FUNCTION jobs.tenant_frozen_sync();

--
-- Name: workflows workflows_effects_sync; Type: TRIGGER; Schema: jobs; Owner: -
--

CREATE TRIGGER workflows_effects_sync AFTER UPDATE OF effects_enabled ON jobs.workflows FOR EACH ROW WHEN ((old.effects_enabled IS DISTINCT FROM new.effects_enabled)) EXECUTE FUNCTION jobs.workflow_effects_sync();

--
-- Name: authority_restores authority_restores_resolved_audit_fkey; Type: FK CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.authority_restores
    ADD CONSTRAINT authority_restores_resolved_audit_fkey FOREIGN KEY (resolved_audit) REFERENCES jobs.repair_audit(audit_id);

--
-- Name: authority_restores authority_restores_tenant_fkey; Type: FK CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.authority_restores
    ADD CONSTRAINT authority_restores_tenant_fkey FOREIGN KEY (tenant) REFERENCES jobs.tenants(tenant);

--
-- Name: effect_escalations effect_escalations_job_id_effect_key_seq_fkey; Type: FK CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.effect_escalations
    ADD CONSTRAINT effect_escalations_job_id_effect_key_seq_fkey FOREIGN KEY (job_id, effect_key, seq) REFERENCES jobs.effects(job_id, effect_key, seq);

--
-- Name: effects effects_job_id_fkey; Type: FK CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.effects
    ADD CONSTRAINT effects_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs.jobs(job_id);

--
-- Name: jobs jobs_operation_fkey; Type: FK CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.jobs
    ADD CONSTRAINT jobs_operation_fkey FOREIGN KEY (job_id, tenant, workflow, operation_id) REFERENCES jobs.operations(job_id, tenant, workflow, operation_id);

--
-- Name: jobs jobs_tenant_fkey; Type: FK CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.jobs
    ADD CONSTRAINT jobs_tenant_fkey FOREIGN KEY (tenant) REFERENCES jobs.tenants(tenant);

--
-- Name: operations operations_job_fkey; Type: FK CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.operations
    ADD CONSTRAINT operations_job_fkey FOREIGN KEY (job_id) REFERENCES jobs.jobs(job_id) DEFERRABLE INITIALLY DEFERRED;

--
-- Name: results results_job_id_fkey; Type: FK CONSTRAINT; Schema: jobs; Owner: -
--

ALTER TABLE ONLY jobs.results
    ADD CONSTRAINT results_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs.jobs(job_id);

--
-- Name: SCHEMA jobs; Type: ACL; Schema: -; Owner: -
--

GRANT USAGE ON SCHEMA jobs TO accord_worker;
GRANT USAGE ON SCHEMA jobs TO accord_repair;
GRANT USAGE ON SCHEMA jobs TO accord_consumer;

--
-- Name: FUNCTION append_only(); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.append_only() FROM PUBLIC;

--
-- Name: FUNCTION audit_guard(); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.audit_guard() FROM PUBLIC;

--
-- Name: FUNCTION authority_hold(p_tenant text, p_ledger_epoch bigint, p_ledger_frozen boolean); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.authority_hold(p_tenant text, p_ledger_epoch bigint, p_ledger_frozen boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.authority_hold(p_tenant text, p_ledger_epoch bigint, p_ledger_frozen boolean) TO accord_worker;
GRANT ALL ON FUNCTION jobs.authority_hold(p_tenant text, p_ledger_epoch bigint, p_ledger_frozen boolean) TO accord_repair;

--
-- Name: FUNCTION authority_lock(p_tenant text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.authority_lock(p_tenant text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.authority_lock(p_tenant text) TO accord_repair;

--
-- Name: FUNCTION authority_set(p_tenant text, p_epoch bigint, p_frozen boolean); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.authority_set(p_tenant text, p_epoch bigint, p_frozen boolean) FROM PUBLIC;

--
-- Name: FUNCTION backoff(p_attempts integer, p_base_s double precision, p_max_s double precision); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.backoff(p_attempts integer, p_base_s double precision, p_max_s double precision) FROM PUBLIC;

--
-- Name: FUNCTION begin_effect(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_intent_digest text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.begin_effect(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_intent_digest text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.begin_effect(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_intent_digest text) TO accord_worker;

--
-- Name: FUNCTION blocking_effects(p_job_id bigint); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.blocking_effects(p_job_id bigint) FROM PUBLIC;

--
-- Name: FUNCTION cancel(p_job_id bigint, p_reason text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.cancel(p_job_id bigint, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.cancel(p_job_id bigint, p_reason text) TO accord_worker;

--
-- Name: FUNCTION claim(p_workflow text, p_owner text, p_lease_s double precision, p_limit integer); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.claim(p_workflow text, p_owner text, p_lease_s double precision, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.claim(p_workflow text, p_owner text, p_lease_s double precision, p_limit integer) TO accord_worker;

--
-- Name: FUNCTION clean_session(); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.clean_session() FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.clean_session() TO accord_worker;

--
-- Name: FUNCTION drain_fences(p_tenant text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.drain_fences(p_tenant text) FROM PUBLIC;

--
-- Name: FUNCTION effects_count(); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.effects_count() FROM PUBLIC;

--
-- Name: FUNCTION effects_guard(); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.effects_guard() FROM PUBLIC;

--
-- Name: FUNCTION fail(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_error text, p_retry boolean, p_backoff_base_s double precision, p_backoff_max_s double precision); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.fail(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_error text, p_retry boolean, p_backoff_base_s double precision, p_backoff_max_s double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.fail(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_error text, p_retry boolean, p_backoff_base_s double precision, p_backoff_max_s double precision) TO accord_worker;

--
-- Name: FUNCTION fence(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.fence(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.fence(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) TO accord_worker;

--
-- Name: FUNCTION fence_check(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.fence_check(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) FROM PUBLIC;

--
-- Name: FUNCTION finish_effect(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_outcome text, p_receipt text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.finish_effect(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_outcome text, p_receipt text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.finish_effect(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_key text, p_outcome text, p_receipt text) TO accord_worker;

--
-- Name: FUNCTION ledger_seen(p_tenants text[], p_epochs bigint[]); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.ledger_seen(p_tenants text[], p_epochs bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.ledger_seen(p_tenants text[], p_epochs bigint[]) TO accord_worker;
GRANT ALL ON FUNCTION jobs.ledger_seen(p_tenants text[], p_epochs bigint[]) TO accord_repair;

--
-- Name: FUNCTION next_state(p_job_id bigint, p_attempts integer, p_max_attempts integer, p_retry boolean); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.next_state(p_job_id bigint, p_attempts integer, p_max_attempts integer, p_retry boolean) FROM PUBLIC;

--
-- Name: FUNCTION note_journal_evidence(p_runner text, p_tenants text[], p_job_ids bigint[], p_keys text[], p_seqs integer[], p_attempts uuid[], p_idempotency_keys text[]); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.note_journal_evidence(p_runner text, p_tenants text[], p_job_ids bigint[], p_keys text[], p_seqs integer[], p_attempts uuid[], p_idempotency_keys text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.note_journal_evidence(p_runner text, p_tenants text[], p_job_ids bigint[], p_keys text[], p_seqs integer[], p_attempts uuid[], p_idempotency_keys text[]) TO accord_worker;

--
-- Name: FUNCTION note_trace(p_job_id bigint, p_attempt_id uuid, p_effect_key text, p_seq integer, p_trace jsonb); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.note_trace(p_job_id bigint, p_attempt_id uuid, p_effect_key text, p_seq integer, p_trace jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.note_trace(p_job_id bigint, p_attempt_id uuid, p_effect_key text, p_seq integer, p_trace jsonb) TO accord_worker;

--
-- Name: FUNCTION prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) TO accord_worker;

--
-- Name: FUNCTION pruning(); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.pruning() FROM PUBLIC;

--
-- Name: FUNCTION record_result(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text, p_content_digest text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.record_result(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text, p_content_digest text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.record_result(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text, p_content_digest text) TO accord_worker;

--
-- Name: FUNCTION renew(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_lease_s double precision); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.renew(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_lease_s double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.renew(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_lease_s double precision) TO accord_worker;

--
-- Name: FUNCTION repair_acknowledge_evidence(p_evidence_id bigint, p_who text, p_evidence text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_acknowledge_evidence(p_evidence_id bigint, p_who text, p_evidence text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.repair_acknowledge_evidence(p_evidence_id bigint, p_who text, p_evidence text) TO accord_repair;

--
-- Name: FUNCTION repair_advance_epoch(p_tenant text, p_new_epoch bigint, p_ledger_epoch bigint, p_frozen boolean, p_who text, p_evidence text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_advance_epoch(p_tenant text, p_new_epoch bigint, p_ledger_epoch bigint, p_frozen boolean, p_who text, p_evidence text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.repair_advance_epoch(p_tenant text, p_new_epoch bigint, p_ledger_epoch bigint, p_frozen boolean, p_who text, p_evidence text) TO accord_repair;

--
-- Name: FUNCTION repair_audit_row(p_action text, p_who text, p_tenant text, p_job_id bigint, p_effect_key text, p_seq integer, p_outcome text, p_evidence text, p_detail jsonb); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_audit_row(p_action text, p_who text, p_tenant text, p_job_id bigint, p_effect_key text, p_seq integer, p_outcome text, p_evidence text, p_detail jsonb) FROM PUBLIC;

--
-- Name: FUNCTION repair_escalate(p_older_than_s double precision, p_limit integer); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_escalate(p_older_than_s double precision, p_limit integer) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.repair_escalate(p_older_than_s double precision, p_limit integer) TO accord_repair;

--
-- Name: FUNCTION repair_refusal(p_who text, p_evidence text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_refusal(p_who text, p_evidence text) FROM PUBLIC;

--
-- Name: FUNCTION repair_release_hold(p_job_id bigint, p_who text, p_evidence text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_release_hold(p_job_id bigint, p_who text, p_evidence text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.repair_release_hold(p_job_id bigint, p_who text, p_evidence text) TO accord_repair;

--
-- Name: FUNCTION repair_requeue_poison(p_job_id bigint, p_who text, p_evidence text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_requeue_poison(p_job_id bigint, p_who text, p_evidence text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.repair_requeue_poison(p_job_id bigint, p_who text, p_evidence text) TO accord_repair;

--
-- Name: FUNCTION repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text) TO accord_repair;

--
-- Name: FUNCTION repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text, p_seq integer); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text, p_seq integer) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.repair_resolve_effect(p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text, p_seq integer) TO accord_repair;

--
-- Name: FUNCTION repair_resume(p_job_id bigint, p_who text, p_evidence text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.repair_resume(p_job_id bigint, p_who text, p_evidence text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.repair_resume(p_job_id bigint, p_who text, p_evidence text) TO accord_repair;

--
-- Name: FUNCTION rescue(p_limit integer, p_backoff_base_s double precision, p_backoff_max_s double precision); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.rescue(p_limit integer, p_backoff_base_s double precision, p_backoff_max_s double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.rescue(p_limit integer, p_backoff_base_s double precision, p_backoff_max_s double precision) TO accord_worker;

--
-- Name: FUNCTION rotate_epoch(p_tenant text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.rotate_epoch(p_tenant text) FROM PUBLIC;

--
-- Name: FUNCTION set_frozen(p_tenant text, p_frozen boolean); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.set_frozen(p_tenant text, p_frozen boolean) FROM PUBLIC;

--
-- Name: FUNCTION submit(p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb, p_max_attempts integer); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.submit(p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb, p_max_attempts integer) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.submit(p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb, p_max_attempts integer) TO accord_worker;
GRANT ALL ON FUNCTION jobs.submit(p_tenant text, p_workflow text, p_operation_id text, p_digest text, p_payload jsonb, p_max_attempts integer) TO accord_consumer;

--
-- Name: FUNCTION succeed(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.succeed(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.succeed(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint) TO accord_worker;

--
-- Name: FUNCTION succeed_many(p_job_ids bigint[], p_tenants text[], p_workflows text[], p_operation_ids text[], p_owners text[], p_attempt_ids uuid[], p_generations bigint[], p_epochs bigint[]); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.succeed_many(p_job_ids bigint[], p_tenants text[], p_workflows text[], p_operation_ids text[], p_owners text[], p_attempt_ids uuid[], p_generations bigint[], p_epochs bigint[]) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.succeed_many(p_job_ids bigint[], p_tenants text[], p_workflows text[], p_operation_ids text[], p_owners text[], p_attempt_ids uuid[], p_generations bigint[], p_epochs bigint[]) TO accord_worker;

--
-- Name: FUNCTION succeed_with_result(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text, p_content_digest text); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.succeed_with_result(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text, p_content_digest text) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.succeed_with_result(p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text, p_attempt_id uuid, p_generation bigint, p_epoch bigint, p_object_key text, p_content_digest text) TO accord_worker;

--
-- Name: FUNCTION tenant_frozen_sync(); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.tenant_frozen_sync() FROM PUBLIC;

--
-- Name: FUNCTION unresolved_effects(p_job_id bigint); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.unresolved_effects(p_job_id bigint) FROM PUBLIC;

--
-- Name: FUNCTION workflow_effects_sync(); Type: ACL; Schema: jobs; Owner: -
--

REVOKE ALL ON FUNCTION jobs.workflow_effects_sync() FROM PUBLIC;

--
-- Name: TABLE authority_restores; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.authority_restores TO accord_worker;
GRANT SELECT ON TABLE jobs.authority_restores TO accord_repair;

--
-- Name: TABLE effect_escalations; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.effect_escalations TO accord_worker;
GRANT SELECT ON TABLE jobs.effect_escalations TO accord_repair;

--
-- Name: TABLE effect_traces; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.effect_traces TO accord_worker;
GRANT SELECT ON TABLE jobs.effect_traces TO accord_repair;

--
-- Name: TABLE effects; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.effects TO accord_worker;
GRANT SELECT ON TABLE jobs.effects TO accord_repair;

--
-- Name: TABLE jobs; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.jobs TO accord_worker;
GRANT SELECT ON TABLE jobs.jobs TO accord_repair;

--
-- Name: TABLE journal_evidence; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.journal_evidence TO accord_worker;
GRANT SELECT ON TABLE jobs.journal_evidence TO accord_repair;

--
-- Name: TABLE operations; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.operations TO accord_worker;
GRANT SELECT ON TABLE jobs.operations TO accord_repair;

--
-- Name: TABLE pruned; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.pruned TO accord_worker;
GRANT SELECT ON TABLE jobs.pruned TO accord_repair;

--
-- Name: TABLE pruned_attempts; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.pruned_attempts TO accord_worker;
GRANT SELECT ON TABLE jobs.pruned_attempts TO accord_repair;

--
-- Name: TABLE reconciliation; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.reconciliation TO accord_worker;
GRANT SELECT ON TABLE jobs.reconciliation TO accord_repair;

--
-- Name: TABLE registration_audit; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.registration_audit TO accord_worker;
GRANT SELECT ON TABLE jobs.registration_audit TO accord_repair;

--
-- Name: TABLE repair_audit; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.repair_audit TO accord_worker;
GRANT SELECT ON TABLE jobs.repair_audit TO accord_repair;

--
-- Name: TABLE results; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.results TO accord_worker;
GRANT SELECT ON TABLE jobs.results TO accord_repair;

--
-- Name: TABLE tenants; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.tenants TO accord_worker;
GRANT SELECT ON TABLE jobs.tenants TO accord_repair;

--
-- Name: TABLE workflows; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.workflows TO accord_worker;
GRANT SELECT ON TABLE jobs.workflows TO accord_repair;

--
-- Name: TABLE waiting; Type: ACL; Schema: jobs; Owner: -
--

GRANT SELECT ON TABLE jobs.waiting TO accord_worker;
GRANT SELECT ON TABLE jobs.waiting TO accord_repair;

--
--
