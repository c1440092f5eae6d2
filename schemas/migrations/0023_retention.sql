-- 0023 retention tied to the replay horizon: finished jobs leave, with everything that was
-- theirs (operation key, effect records, effect traces and escalations, result manifest),
-- only after a retention the caller chooses; audit rows after a retention of their own;
-- consumers' poison records after theirs. Nothing that is still needed ever leaves:
--
-- * Only succeeded, failed and canceled jobs are removed, and only with no effect record
--   pending or unknown (the counter and the records themselves both say so, checked again on
--   a snapshot taken under the lock) and no effect resolved within the retention (a repair
--   that just resolved an old canceled job's effect keeps its records for a full retention).
--   queued, running and held jobs are live; poison and unknown jobs wait for a repair.
-- * The retention is never shorter than the replay horizon (inbox_replay_window_s plus the
--   inbox's prune margin): the composition root refuses such settings (accord/commands/
--   common.py, check_retention). A redelivery that can still arrive therefore still finds
--   its inbox row, or its job: the job outlives the inbox row written with its submit.
-- * Bounded and short: one batch of at most p_limit jobs per call, one short transaction,
--   locked FOR UPDATE SKIP LOCKED so the pruner never waits on a row another transaction
--   holds (https://www.postgresql.org/docs/15/sql-select.html#SQL-FOR-UPDATE-SHARE).
--
-- The race with a redelivery (jobs.submit of the same operation): submit now holds the job it
-- returns FOR KEY SHARE until its caller commits. FOR KEY SHARE conflicts only with FOR UPDATE
-- (https://www.postgresql.org/docs/15/explicit-locking.html#ROW-LOCK-COMPATIBILITY), so it
-- never blocks a claim, a fence or a publish (FOR NO KEY UPDATE), but the pruner's FOR UPDATE
-- SKIP LOCKED passes that job by. The other order: a submit that finds the job while the
-- pruner holds it waits for the pruner; once the pruner commits, the row is gone and submit
-- finds nothing (READ COMMITTED: a row deleted while we waited is skipped), so it tries its
-- insert again, which now creates a new job (the key was removed with the job). Submit thus
-- returns either a job that stays for its caller's transaction or a new job, never one that
-- disappears under it (tests/isolation/prune_vs_submit.spec).
--
-- DELETE stays forbidden on jobs.effects, jobs.repair_audit and relay.release_audit except
-- from inside the prune functions, with the repair functions' pattern: a transaction-local
-- setting (accord.prune) that only the function sets, and current_user = the owner of that
-- SECURITY DEFINER function; jobs.effects only of resolved records.
--
-- jobs.prune makes every constraint immediate before it returns, so that another schema's
-- deferred foreign key to jobs.jobs fails inside the call, named (jobs.errors.PruneBlocked),
-- and not at the caller's commit: call it in a transaction of its own (the worker does).

-- The pruner's scan: finished, resolved jobs by when they finished. jobs_finished_idx (0020)
-- also holds poison jobs and canceled ones with an unknown effect, which stay until repaired;
-- each batch would walk past all of them again, so a backlog awaiting repair would make every
-- batch slower. This index holds only what a batch may take.
CREATE INDEX jobs_prunable_idx ON jobs.jobs (updated_at)
    WHERE state IN ('succeeded', 'failed', 'canceled') AND unresolved_effects = 0;

CREATE FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision,
                           p_limit integer)
RETURNS TABLE (jobs_pruned integer, effects_pruned integer, results_pruned integer,
               audit_pruned integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz;
    v_ids bigint[];
    v_jobs integer := 0;
    v_effects integer := 0;
    v_results integer := 0;
    v_audit integer := 0;
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
    v_cutoff := now() - make_interval(secs => p_retention_s);
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
        SELECT array_agg(j.job_id) INTO v_ids FROM jobs.jobs j
        WHERE j.job_id = ANY (v_ids)
          AND j.state IN ('succeeded', 'failed', 'canceled') AND j.unresolved_effects = 0
          AND j.updated_at < v_cutoff
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id
                            AND (e.state IN ('pending', 'unknown') OR e.finished_at >= v_cutoff));
    END IF;
    PERFORM set_config('accord.prune', 'jobs', true);
    IF v_ids IS NOT NULL THEN
        -- Children first; the job before its key (jobs_operation_fkey is immediate, the key's
        -- own reference to the job is deferred).
        DELETE FROM jobs.effect_escalations x WHERE x.job_id = ANY (v_ids);
        DELETE FROM jobs.effect_traces x WHERE x.job_id = ANY (v_ids);
        DELETE FROM jobs.effects e WHERE e.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_effects = ROW_COUNT;
        DELETE FROM jobs.results r WHERE r.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_results = ROW_COUNT;
        DELETE FROM jobs.jobs j WHERE j.job_id = ANY (v_ids);
        GET DIAGNOSTICS v_jobs = ROW_COUNT;
        DELETE FROM jobs.operations o WHERE o.job_id = ANY (v_ids);
    END IF;
    -- Repair audit rows past their own retention, once their job is gone (a job still kept
    -- keeps its repair history) and unless a restore record names them.
    WITH doomed AS (
        SELECT a.audit_id FROM jobs.repair_audit a
        WHERE a.at < now() - make_interval(secs => p_audit_retention_s)
          AND (a.job_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM jobs.jobs j WHERE j.job_id = a.job_id))
          AND NOT EXISTS (SELECT 1 FROM jobs.authority_restores r
                          WHERE r.resolved_audit = a.audit_id)
        ORDER BY a.audit_id
        LIMIT p_limit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.repair_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_audit FROM gone;
    PERFORM set_config('accord.prune', '', true);
    -- Another schema's deferred foreign key to a removed job fails here, by name.
    SET CONSTRAINTS ALL IMMEDIATE;
    RETURN QUERY SELECT v_jobs, v_effects, v_results, v_audit;
END $$;

COMMENT ON FUNCTION jobs.prune(double precision, double precision, integer) IS
    'Remove one bounded batch of finished, resolved jobs older than the retention (with their key, effects, traces, escalations and result manifest) and of repair audit rows older than the audit retention; counts per table (0023)';

-- True only inside jobs.prune: its transaction-local flag, and the function's owner as the
-- current user (a SECURITY DEFINER function runs as its owner).
CREATE FUNCTION jobs.pruning() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN current_setting('accord.prune', true) = 'jobs'
       AND current_user = (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p
                           WHERE p.oid = 'jobs.prune(double precision,double precision,integer)'
                                         ::regprocedure);
END $$;

CREATE OR REPLACE FUNCTION jobs.effects_guard() RETURNS trigger
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

-- jobs.repair_audit: append-only, except jobs.prune's DELETE (registration_audit keeps
-- jobs.append_only: a row per registration act, tiny, kept for ever).
CREATE FUNCTION jobs.repair_audit_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND jobs.pruning() THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$;

DROP TRIGGER repair_audit_append_only ON jobs.repair_audit;
CREATE TRIGGER repair_audit_append_only BEFORE DELETE OR UPDATE ON jobs.repair_audit
    FOR EACH ROW EXECUTE FUNCTION jobs.repair_audit_guard();

-- submit: the job it returns is held FOR KEY SHARE until the caller commits (see the header);
-- a job removed while we waited for the pruner is looked for once more, as a new operation.
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

-- -----------------------------------------------------------------------------------------
-- consumers.poison: typed evidence of a dead-lettered message, removed by age after its own
-- retention (poison_retention_s, never shorter than the replay horizon). A poison record has
-- no open state in accord (the message waits in the dead-letter queue, the broker's to keep);
-- the consumer role may remove old records only through this function, never at will.
CREATE FUNCTION consumers.prune_poison(p_retention_s double precision, p_limit integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000
       OR p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'consumers.prune_poison: retention % s, batch %', p_retention_s, p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH doomed AS (
        SELECT p.id FROM consumers.poison p
        WHERE p.created_at < now() - make_interval(secs => p_retention_s)
        ORDER BY p.created_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM consumers.poison p USING doomed d WHERE p.id = d.id RETURNING 1
    ) SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END $$;

COMMENT ON FUNCTION consumers.prune_poison(double precision, integer) IS
    'Remove one bounded batch of poison records older than the retention; the count (0023)';

-- -----------------------------------------------------------------------------------------
-- relay.release_audit: append-only, except relay.prune_release_audit's DELETE of rows past
-- the audit retention whose outbox row is resolved (published, or pruned). A row released and
-- then held again, or not yet published, keeps its history. Held outbox rows themselves are
-- never pruned (the relay's prune takes published rows only): a held row is the only copy of
-- an event that never reached the broker.
CREATE FUNCTION relay.prune_release_audit(p_retention_s double precision, p_limit integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_n integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000
       OR p_retention_s IS NULL OR NOT (p_retention_s >= 0 AND p_retention_s < 'infinity') THEN
        RAISE EXCEPTION 'relay.prune_release_audit: retention % s, batch %', p_retention_s,
            p_limit USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM set_config('accord.prune', 'relay', true);
    WITH doomed AS (
        SELECT a.audit_id FROM relay.release_audit a
        WHERE a.at < now() - make_interval(secs => p_retention_s)
          AND NOT EXISTS (SELECT 1 FROM relay.outbox o
                          WHERE o.id = a.outbox_id AND o.state <> 'published')
        ORDER BY a.audit_id
        LIMIT p_limit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM relay.release_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_n FROM gone;
    PERFORM set_config('accord.prune', '', true);
    RETURN v_n;
END $$;

COMMENT ON FUNCTION relay.prune_release_audit(double precision, integer) IS
    'Remove one bounded batch of release audit rows older than the retention whose outbox row is resolved; the count (0023)';

CREATE OR REPLACE FUNCTION relay.append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'release_audit'
       AND current_setting('accord.prune', true) = 'relay'
       AND current_user = (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p
                           WHERE p.oid = 'relay.prune_release_audit(double precision,integer)'
                                         ::regprocedure) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$;

-- -----------------------------------------------------------------------------------------
-- Grants: each process prunes what it owns, through its function only (0014's rule: every new
-- function in schema jobs loses EXECUTE for PUBLIC; the same here for relay and consumers).
REVOKE EXECUTE ON FUNCTION jobs.prune(double precision, double precision, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION jobs.pruning() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION jobs.repair_audit_guard() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.prune(double precision, double precision, integer)
    TO accord_worker;
REVOKE EXECUTE ON FUNCTION consumers.prune_poison(double precision, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION consumers.prune_poison(double precision, integer) TO accord_consumer;
REVOKE EXECUTE ON FUNCTION relay.prune_release_audit(double precision, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION relay.prune_release_audit(double precision, integer) TO accord_relay;
