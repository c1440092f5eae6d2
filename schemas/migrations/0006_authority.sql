-- 0006 authority: principals, repair authority narrower than execution authority, and the
-- database side of restore detection (the ledger itself lives outside this database; see
-- jobs/authority.py and docs/authority.md).
--
-- Principals (NOLOGIN group roles; deployments grant them to LOGIN users, tests SET ROLE):
-- * accord_worker  executes: submit, claim, the fenced write-backs (publish, publish_many,
--                  result manifests), rescue, cancel. It has no INSERT/UPDATE/DELETE on any
--                  jobs table: every write goes through a checked SECURITY DEFINER function,
--                  so it cannot release a hold, requeue poison, resolve an effect, move an
--                  epoch, register a workflow class or write an unfenced manifest by plain DML.
-- * accord_repair  repairs: it may only call the jobs.repair_* functions (each refuses leased,
--                  i.e. running, jobs and writes jobs.repair_audit in the same transaction),
--                  jobs.authority_lock (to advance an epoch past the ledger) and the
--                  restrict-only jobs.authority_hold. It cannot claim, renew or publish.
-- Both may call jobs.authority_hold: it can only ever restrict (freeze a tenant whose epoch
-- is behind the given ledger epoch and hold its work), never grant authority.
--
-- SECURITY DEFINER functions run as the migrating role with search_path pinned to
-- pg_catalog, pg_temp (every name in their bodies is schema-qualified).
-- https://www.postgresql.org/docs/15/sql-createfunction.html#SQL-CREATEFUNCTION-SECURITY
--
-- Roles are cluster-wide while migrations run per database, and test databases share one
-- cluster: each role is created at most once, and a concurrent creation from another
-- database's migration is tolerated (unique_violation on pg_authid, or duplicate_object).
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['accord_worker', 'accord_repair'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it first
            END;
        END IF;
        -- SET ROLE needs membership: a non-superuser migrating user gets it.
        IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
           AND NOT pg_has_role(current_user, v_role, 'MEMBER') THEN
            EXECUTE format('GRANT %I TO %I', v_role, current_user);
        END IF;
    END LOOP;
END $$;

-- ---------------------------------------------------------------------------------------
-- The repair audit: one row per repair, written in the repair's own transaction. Append-only.
CREATE TABLE jobs.repair_audit (
    audit_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    action     text        NOT NULL,
    who        text        NOT NULL CHECK (who <> ''),       -- the person or tool, explicit
    db_user    text        NOT NULL,                         -- session_user (the login)
    db_role    text        NOT NULL,                         -- SET ROLE in force ('none': login)
    tenant     text        NOT NULL,
    job_id     bigint,
    effect_key text,
    seq        integer,
    outcome    text        NOT NULL,  -- effect outcome, new job state, or new epoch
    evidence   text        NOT NULL CHECK (evidence <> ''),
    detail     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    CONSTRAINT repair_audit_action_check CHECK (
        action IN ('resolve_effect', 'release_hold', 'requeue_poison', 'resume',
                   'advance_epoch')
    )
);
CREATE INDEX repair_audit_job_idx ON jobs.repair_audit (job_id) WHERE job_id IS NOT NULL;

CREATE FUNCTION jobs.append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$;

CREATE TRIGGER repair_audit_append_only BEFORE UPDATE OR DELETE ON jobs.repair_audit
    FOR EACH ROW EXECUTE FUNCTION jobs.append_only();
CREATE TRIGGER repair_audit_no_truncate BEFORE TRUNCATE ON jobs.repair_audit
    FOR EACH STATEMENT EXECUTE FUNCTION jobs.append_only();

-- A detected restore: the database's epoch for the tenant was behind the ledger's. At most
-- one open (unresolved) detection per tenant; repair_advance_epoch resolves it.
CREATE TABLE jobs.authority_restores (
    restore_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant         text        NOT NULL REFERENCES jobs.tenants (tenant),
    db_epoch       bigint      NOT NULL,
    ledger_epoch   bigint      NOT NULL,
    held_jobs      integer     NOT NULL DEFAULT 0 CHECK (held_jobs >= 0),
    detected_at    timestamptz NOT NULL DEFAULT now(),
    detected_by    text        NOT NULL,
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    resolved_at    timestamptz,
    resolved_epoch bigint,
    resolved_audit bigint REFERENCES jobs.repair_audit (audit_id),
    CONSTRAINT authority_restores_resolved_check CHECK (
        (resolved_at IS NULL) = (resolved_epoch IS NULL)
    )
);
CREATE UNIQUE INDEX authority_restores_open_idx ON jobs.authority_restores (tenant)
    WHERE resolved_at IS NULL;

-- Unresolved effects older than the configured age, escalated (never resolved) by time.
CREATE TABLE jobs.effect_escalations (
    job_id       bigint      NOT NULL,
    effect_key   text        NOT NULL,
    seq          integer     NOT NULL,
    tenant       text        NOT NULL,
    escalated_at timestamptz NOT NULL DEFAULT now(),
    age_s        double precision NOT NULL,
    PRIMARY KEY (job_id, effect_key, seq),
    FOREIGN KEY (job_id, effect_key, seq) REFERENCES jobs.effects (job_id, effect_key, seq)
);

-- Unresolved effects by age (reconcile's scan and the escalation pass).
CREATE INDEX effects_unresolved_idx ON jobs.effects (begun_at)
    WHERE state IN ('pending', 'unknown');

-- What needs reconciliation: every unknown effect, and every pending one whose job is no
-- longer running (its attempt ended without recording an outcome). For status and metrics.
CREATE VIEW jobs.reconciliation AS
    SELECT e.tenant, e.job_id, j.workflow, j.operation_id, j.state AS job_state, e.effect_key,
           e.seq, e.intent_digest, e.state, e.receipt, e.attempt_id, e.generation, e.begun_at,
           x.escalated_at
    FROM jobs.effects e
    JOIN jobs.jobs j ON j.job_id = e.job_id
    LEFT JOIN jobs.effect_escalations x
        ON x.job_id = e.job_id AND x.effect_key = e.effect_key AND x.seq = e.seq
    WHERE e.state = 'unknown' OR (e.state = 'pending' AND j.state <> 'running');

-- ---------------------------------------------------------------------------------------
-- The effect guard, replaced: as before a finished outcome never changes and no record is
-- deleted, except that jobs.repair_resolve_effect may resolve an `unknown` record. It proves
-- itself with a transaction-local token naming exactly that record, set only for the one
-- UPDATE, *and* by running as the owner of the repair function (SECURITY DEFINER); a role
-- that merely sets the token is still refused.
CREATE OR REPLACE FUNCTION jobs.effects_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'jobs.effects records are never deleted'
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

-- ---------------------------------------------------------------------------------------
-- Authority. Every change of a tenant's epoch or restriction is written to the ledger
-- *before* the database (jobs/authority.py): the writer first takes the tenant row lock
-- (authority_lock), appends the ledger record (fsynced), then changes the row. A concurrent
-- restore check waits on that lock and re-reads the epoch, so an intent in flight is never
-- mistaken for a restore.

-- Lock the tenant's authority row until the caller's transaction ends; its epoch and flag.
CREATE FUNCTION jobs.authority_lock(p_tenant text)
RETURNS TABLE (epoch bigint, frozen boolean, open_restore boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO jobs.tenants (tenant) VALUES (p_tenant) ON CONFLICT DO NOTHING;
    RETURN QUERY
        SELECT t.epoch, t.frozen,
               EXISTS (SELECT 1 FROM jobs.authority_restores r
                       WHERE r.tenant = p_tenant AND r.resolved_at IS NULL)
        FROM jobs.tenants t WHERE t.tenant = p_tenant FOR UPDATE;
END $$;

-- Set the tenant's epoch (which must advance) and restriction, then wait for the fenced
-- write-backs in flight. Administrative (rotation, restriction, lifting it); lifting is
-- refused ('restore_unresolved') while a detected restore is open. Returns NULL when done.
CREATE FUNCTION jobs.authority_set(p_tenant text, p_epoch bigint, p_frozen boolean)
RETURNS text
LANGUAGE plpgsql AS $$
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

-- Restrict-only: if the tenant's epoch is behind p_ledger_epoch, freeze it, hold its queued and
-- running work (generation + 1, lease cleared: no old lease passes the fence again) and
-- open (or refresh) its restore detection. Idempotent; returns no row when not behind.
CREATE FUNCTION jobs.authority_hold(p_tenant text, p_ledger_epoch bigint)
RETURNS TABLE (restore_id bigint, tenant text, db_epoch bigint, ledger_epoch bigint,
               held_jobs integer, newly_detected boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
        WHERE j.tenant = p_tenant AND j.state IN ('queued', 'running')
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

-- ---------------------------------------------------------------------------------------
-- Repairs. Each validates its principal and evidence, locks the job (or tenant) row, refuses
-- running (leased) jobs, and writes jobs.repair_audit in the same transaction. Each returns a
-- status: NULL when done, else why it refused.

CREATE FUNCTION jobs.repair_audit_row(
    p_action text, p_who text, p_tenant text, p_job_id bigint, p_effect_key text,
    p_seq integer, p_outcome text, p_evidence text, p_detail jsonb
) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO jobs.repair_audit (action, who, db_user, db_role, tenant, job_id, effect_key,
                                   seq, outcome, evidence, detail)
    VALUES (p_action, p_who, session_user, current_setting('role'), p_tenant, p_job_id,
            p_effect_key, p_seq, p_outcome, p_evidence, p_detail)
    RETURNING audit_id
$$;

-- Refusal for a missing principal or evidence (NULL when both are given).
CREATE FUNCTION jobs.repair_refusal(p_who text, p_evidence text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN coalesce(btrim(p_who), '') = '' THEN 'no_principal'
        WHEN coalesce(btrim(p_evidence), '') = '' THEN 'no_evidence'
    END
$$;

-- Resolve the latest record of effect p_key of job p_job_id, which must be unknown or
-- pending on a job that is not running, to p_outcome (succeeded | failed_before_dispatch).
-- An unknown job with nothing left forbidding a rerun goes back to queued.
CREATE FUNCTION jobs.repair_resolve_effect(
    p_job_id bigint, p_key text, p_outcome text, p_receipt text, p_who text, p_evidence text
) RETURNS TABLE (status text, seq integer, job_state text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    IF NOT FOUND OR e.state NOT IN ('pending', 'unknown') THEN
        RETURN QUERY SELECT CASE WHEN e.job_id IS NULL THEN 'missing_effect'
                                 ELSE 'not_unresolved' END, e.seq, j.state, NULL::bigint;
        RETURN;
    END IF;
    PERFORM set_config('accord.repair_effect',
                       jsonb_build_array(e.job_id, e.effect_key, e.seq)::text, true);
    UPDATE jobs.effects x SET state = p_outcome, receipt = coalesce(p_receipt, x.receipt),
                              finished_at = now()
    WHERE x.job_id = e.job_id AND x.effect_key = e.effect_key AND x.seq = e.seq;
    PERFORM set_config('accord.repair_effect', '', true);
    IF j.state = 'unknown' AND NOT jobs.blocking_effects(p_job_id) THEN
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

-- Release a held job: queued, or unknown when an effect forbids running it again. Refused
-- while the tenant's detected restore is open (advance the epoch first).
CREATE FUNCTION jobs.repair_release_hold(p_job_id bigint, p_who text, p_evidence text)
RETURNS TABLE (status text, job_state text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    SET state = CASE WHEN jobs.blocking_effects(x.job_id) THEN 'unknown' ELSE 'queued' END,
        generation = x.generation + 1, run_after = now(), updated_at = now()
    WHERE x.job_id = p_job_id RETURNING x.state INTO j.state;
    RETURN QUERY SELECT NULL::text, j.state,
        jobs.repair_audit_row('release_hold', p_who, j.tenant, p_job_id, NULL, NULL, j.state,
                              p_evidence, '{}'::jsonb);
END $$;

-- Requeue a poison job with a fresh attempt budget. Refused while an effect forbids a rerun.
CREATE FUNCTION jobs.repair_requeue_poison(p_job_id bigint, p_who text, p_evidence text)
RETURNS TABLE (status text, job_state text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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

-- Resume an `unknown` job whose effects all have a known outcome (typically one succeeded:
-- the provider accepted, then the reply or the worker was lost, or the handler failed after
-- the effect). No automatic loop reruns such a job; this repair, with evidence, puts it back
-- to queued and marks this generation resumable (resumed_generation), which lets one claim
-- take it. That run's begin_effect returns each succeeded record ('recorded') instead of
-- dispatching again, so the handler reaches its publish without a second request.
-- Refused: running (leased); not_resumable (any state but unknown: a canceled job stays
-- canceled, since cancel withdrew its authority to run, and failed/poison/held/succeeded have
-- their own meaning or repair); effects_unresolved (a pending or unknown effect: resolve it
-- first); restore_unresolved (the tenant's detected restore is open).
CREATE FUNCTION jobs.repair_resume(p_job_id bigint, p_who text, p_evidence text)
RETURNS TABLE (status text, job_state text, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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

-- Advance the tenant's epoch to p_new_epoch, past both its epoch and the ledger's
-- (p_ledger_epoch, read by the caller, who wrote p_new_epoch to the ledger first), lift the
-- freeze and resolve the open restore detection. Held work stays held (release it per job).
CREATE FUNCTION jobs.repair_advance_epoch(
    p_tenant text, p_new_epoch bigint, p_ledger_epoch bigint, p_who text, p_evidence text
) RETURNS TABLE (status text, epoch bigint, audit_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t jobs.tenants%ROWTYPE;
    v_refusal text := jobs.repair_refusal(p_who, p_evidence);
    v_audit bigint;
BEGIN
    IF v_refusal IS NULL THEN
        SELECT * INTO t FROM jobs.tenants x WHERE x.tenant = p_tenant FOR UPDATE;
        v_refusal := CASE
            WHEN t.tenant IS NULL THEN 'missing'
            WHEN p_new_epoch <= greatest(t.epoch, p_ledger_epoch) THEN 'not_past_ledger'
        END;
    END IF;
    IF v_refusal IS NOT NULL THEN
        RETURN QUERY SELECT v_refusal, t.epoch, NULL::bigint;
        RETURN;
    END IF;
    UPDATE jobs.tenants x SET epoch = p_new_epoch, frozen = false, updated_at = now()
    WHERE x.tenant = p_tenant;
    PERFORM jobs.drain_fences(p_tenant);
    v_audit := jobs.repair_audit_row(
        'advance_epoch', p_who, p_tenant, NULL, NULL, NULL, p_new_epoch::text, p_evidence,
        jsonb_build_object('from_epoch', t.epoch, 'ledger_epoch', p_ledger_epoch,
                           'was_frozen', t.frozen));
    UPDATE jobs.authority_restores r
    SET resolved_at = now(), resolved_epoch = p_new_epoch, resolved_audit = v_audit
    WHERE r.tenant = p_tenant AND r.resolved_at IS NULL;
    RETURN QUERY SELECT NULL::text, p_new_epoch, v_audit;
END $$;

-- Escalate unresolved effects (see jobs.reconciliation) begun more than p_older_than_s ago:
-- a state for status and metrics, never a resolution. Returns the newly escalated.
CREATE FUNCTION jobs.repair_escalate(p_older_than_s double precision, p_limit integer)
RETURNS TABLE (job_id bigint, effect_key text, seq integer, tenant text, age_s double precision)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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

-- ---------------------------------------------------------------------------------------
-- Privileges. Functions are executable by PUBLIC by default: take that away in this schema
-- (a later migration that adds a SECURITY DEFINER function here must do the same), then
-- grant each principal exactly its entry points.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA jobs FROM PUBLIC;

-- The worker's entry points run as their owner, so the worker role needs no DML on the
-- jobs tables. Looked up by name so that any signature of them is covered.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'jobs'::regnamespace
          AND p.proname IN ('submit', 'claim', 'fence', 'renew', 'fail', 'succeed',
                            'succeed_many', 'record_result', 'begin_effect', 'finish_effect',
                            'rescue', 'cancel')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pg_temp',
                       f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO accord_worker', f);
    END LOOP;
END $$;

GRANT USAGE ON SCHEMA jobs TO accord_worker, accord_repair;
GRANT SELECT ON ALL TABLES IN SCHEMA jobs TO accord_worker, accord_repair;
-- No DML on jobs.workflows or jobs.results: registration (owner, effects_enabled) is an
-- administrative act of the migrating role (`accord register`, deployment tooling), never
-- of the execution principal, so a worker cannot switch effects on or take over a class without
-- the drained check; and a result manifest is written only through the fenced
-- jobs.record_result above, never by a plain INSERT that no fence checks.
-- Publish callbacks enqueue events in the publish transaction; processes check the schema.
GRANT USAGE ON SCHEMA relay TO accord_worker;
GRANT USAGE ON SCHEMA schemas TO accord_worker, accord_repair;
GRANT INSERT ON relay.outbox TO accord_worker;
-- enqueue's INSERT ... RETURNING id reads the new row's id (a column privilege).
GRANT SELECT (id, event_id) ON relay.outbox TO accord_worker;
GRANT USAGE ON SEQUENCE relay.outbox_id_seq TO accord_worker;
GRANT SELECT ON schemas.migrations TO accord_worker, accord_repair;

GRANT EXECUTE ON FUNCTION jobs.authority_hold(text, bigint) TO accord_worker, accord_repair;
GRANT EXECUTE ON FUNCTION
    jobs.authority_lock(text),
    jobs.repair_resolve_effect(bigint, text, text, text, text, text),
    jobs.repair_release_hold(bigint, text, text),
    jobs.repair_requeue_poison(bigint, text, text),
    jobs.repair_resume(bigint, text, text),
    jobs.repair_advance_epoch(text, bigint, bigint, text, text),
    jobs.repair_escalate(double precision, integer)
TO accord_repair;
