-- 0054 A runner journal lets a begin go only for what this database says of that begin's own
-- attempt (a review of retention, and of this change). A begin the database holds no record of
-- is the only record that its call went out. Before, a begin whose job was gone at or below
-- jobs.pruned's mark (0047: the highest job id retention removed) counted as pruned: after a
-- restore rewound the job ids, a new job took the id and retention removed it, the mark
-- covered it, and the next rotation (or the first start of a worker down meanwhile) dropped
-- the old begin. Now:
--   * jobs.prune leaves a tombstone per attempt whose effect rows it removes
--     (jobs.pruned_attempts, kept one more jobs retention): a begin of that attempt was
--     resolved here. The mark stops moving: it still covers what retention removed before
--     this migration (no tombstone exists for those), and a restore rewinds the job ids above
--     it, never below.
--   * A worker's start notes each begin whose attempt began no row here
--     (jobs.journal_evidence); a noted begin is let go only once a person acknowledges it
--     (jobs.repair_acknowledge_evidence, audited), or once the database records its attempt's
--     outcome after all.
CREATE TABLE jobs.journal_evidence (
    evidence_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    effect_key text NOT NULL,
    seq integer NOT NULL CHECK (seq >= 1),
    attempt_id uuid NOT NULL,
    tenant text NOT NULL,
    runner_id text NOT NULL,
    idempotency_key text,
    found_at timestamptz NOT NULL DEFAULT now(),
    acknowledged_at timestamptz,
    audit_id bigint,
    CONSTRAINT journal_evidence_begin_unique UNIQUE (job_id, effect_key, seq, attempt_id),
    CONSTRAINT journal_evidence_acknowledged_check
        CHECK ((acknowledged_at IS NULL) = (audit_id IS NULL))
);

COMMENT ON TABLE jobs.journal_evidence IS 'Journaled effect begins a worker start found that the database holds no record of (a restore''s doing); the journal keeps each until a person acknowledges it (0054)';

CREATE INDEX journal_evidence_open_idx ON jobs.journal_evidence (evidence_id)
    WHERE acknowledged_at IS NULL;

CREATE TABLE jobs.pruned_attempts (
    attempt_id uuid PRIMARY KEY,
    pruned_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE jobs.pruned_attempts IS 'Attempts whose effect rows jobs.prune removed (resolved), kept one more jobs retention: a journaled begin of one may be let go (0054)';

CREATE INDEX pruned_attempts_pruned_at_idx ON jobs.pruned_attempts (pruned_at);

GRANT SELECT ON TABLE jobs.pruned_attempts TO accord_worker, accord_repair;

-- The mark, frozen here, must cover only jobs that were gone when it froze: jobs.prune takes
-- the oldest finished first, not the lowest ids, so a job below the mark may still be alive
-- (waiting out a backoff, unknown, held) and a later attempt of it, lost by a restore, must
-- not read as pruned. Every job at or below the lowered mark was gone here, for good.
UPDATE jobs.pruned SET through_job_id = LEAST(through_job_id, (SELECT min(j.job_id) - 1 FROM jobs.jobs j));

COMMENT ON TABLE jobs.pruned IS 'Below the lowest job id still present when migration 0054 froze it, the highest job id jobs.prune had removed (later removals leave jobs.pruned_attempts): a journaled begin, never noted as evidence, of a job gone at or below it was resolved (0047, 0054)';

-- Of the begins given, note those whose attempt began no effect row here (not a pending row:
-- the database holds that one's own record). Idempotent; every given begin that has a note
-- (new or earlier) is returned with it.
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

COMMENT ON FUNCTION jobs.note_journal_evidence(p_runner text, p_tenants text[], p_job_ids bigint[], p_keys text[], p_seqs integer[], p_attempts uuid[], p_idempotency_keys text[]) IS 'Note the journaled begins whose attempt began no effect row in this database (a restore''s evidence), idempotently; every given begin with a note, and whether it was acknowledged (0054)';

REVOKE ALL ON FUNCTION jobs.note_journal_evidence(text, text[], bigint[], text[], integer[], uuid[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.note_journal_evidence(text, text[], bigint[], text[], integer[], uuid[], text[]) TO accord_worker;
GRANT SELECT ON TABLE jobs.journal_evidence TO accord_worker, accord_repair;

ALTER TABLE jobs.repair_audit DROP CONSTRAINT repair_audit_action_check;
ALTER TABLE jobs.repair_audit ADD CONSTRAINT repair_audit_action_check CHECK (
    action = ANY (ARRAY['resolve_effect', 'release_hold', 'requeue_poison', 'resume',
                        'advance_epoch', 'acknowledge_evidence']));

-- A person who resolved what a noted begin is evidence of (the provider asked by its
-- idempotency key) lets the journal drop it: refused without a principal and evidence, for a
-- note that does not exist, and for one already acknowledged.
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

COMMENT ON FUNCTION jobs.repair_acknowledge_evidence(p_evidence_id bigint, p_who text, p_evidence text) IS 'Acknowledge a noted journal begin (jobs.journal_evidence) with a principal and evidence, audited; the journal may then drop it (0054)';

REVOKE ALL ON FUNCTION jobs.repair_acknowledge_evidence(bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.repair_acknowledge_evidence(bigint, text, text) TO accord_repair;

-- jobs.prune answers how many tombstones went too, so that its callers run the next batch at
-- once while they are many (a new result column: the function is made anew, its grant with it).
DROP FUNCTION jobs.prune(double precision, double precision, integer);

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
    -- keeps its repair history) and unless a restore record names them.
    WITH doomed AS (
        SELECT a.audit_id FROM jobs.repair_audit a
        WHERE a.at < now() - make_interval(secs => p_audit_retention_s)
          AND (a.job_id IS NULL
               OR NOT EXISTS (SELECT 1 FROM jobs.jobs j WHERE j.job_id = a.job_id))
          AND NOT EXISTS (SELECT 1 FROM jobs.authority_restores r
                          WHERE r.resolved_audit = a.audit_id)
        ORDER BY a.at, a.audit_id
        LIMIT p_limit - v_audit
        FOR UPDATE OF a SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.repair_audit a USING doomed d WHERE a.audit_id = d.audit_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_audit + v_rows;
    -- Tombstones one more retention after their job went (a worker down longer than that
    -- reports its begins of such attempts as evidence, for a person to acknowledge), and
    -- acknowledged journal evidence past the audit retention (0054).
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
    WITH doomed AS (
        SELECT v.evidence_id FROM jobs.journal_evidence v
        WHERE v.acknowledged_at < now() - make_interval(secs => p_audit_retention_s)
        ORDER BY v.acknowledged_at
        LIMIT p_limit - v_audit
        FOR UPDATE OF v SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs.journal_evidence v USING doomed d WHERE v.evidence_id = d.evidence_id
        RETURNING 1
    ) SELECT count(*) INTO v_rows FROM gone;
    v_audit := v_audit + v_rows;
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

COMMENT ON FUNCTION jobs.prune(p_retention_s double precision, p_audit_retention_s double precision, p_limit integer) IS 'Remove one bounded batch of finished, resolved jobs older than the retention, never shorter than the longest declared replay horizon (with their key, effects, traces, escalations and result manifest, leaving a tombstone per attempt whose effects go), of tombstones one retention old, and of audit rows older than the audit retention (resolved restore records, registration audit rows but each class''s newest, repair audit rows whose job is gone, acknowledged journal evidence), oldest first; counts per table, tombstones included (0031, 0042, 0054)';

REVOKE ALL ON FUNCTION jobs.prune(double precision, double precision, integer) FROM PUBLIC;
GRANT ALL ON FUNCTION jobs.prune(double precision, double precision, integer) TO accord_worker;
