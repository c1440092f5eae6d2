-- 0054 A runner journal's evidence of a restore stays until a person acknowledges it (a review
-- of retention). A begin the database holds no record of (its job gone above what retention
-- removed, or present with no effect row its attempt began) is what a restore leaves: the only
-- record that the call went out. It was kept only while the prune mark said its job could not
-- have been pruned; once the restore rewound the job ids, a new job took the id, and retention
-- removed that job, the mark covered the id and the next rotation dropped the begin. A start
-- now notes each such begin here; a noted begin is let go only once acknowledged (the repair
-- role, with evidence, audited), whatever the mark says.
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
    v_audit := jobs.repair_audit_row(
        'acknowledge_evidence', p_who, v.tenant, v.job_id, v.effect_key, v.seq, 'acknowledged',
        p_evidence, jsonb_build_object('evidence_id', v.evidence_id,
                                       'attempt_id', v.attempt_id, 'runner_id', v.runner_id,
                                       'idempotency_key', v.idempotency_key));
    UPDATE jobs.journal_evidence x SET acknowledged_at = now(), audit_id = v_audit
    WHERE x.evidence_id = p_evidence_id;
    RETURN QUERY SELECT NULL::text, v.job_id, v_audit;
END $$;

COMMENT ON FUNCTION jobs.repair_acknowledge_evidence(p_evidence_id bigint, p_who text, p_evidence text) IS 'Acknowledge a noted journal begin (jobs.journal_evidence) with a principal and evidence, audited; the journal may then drop it (0054)';

REVOKE ALL ON FUNCTION jobs.repair_acknowledge_evidence(bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.repair_acknowledge_evidence(bigint, text, text) TO accord_repair;
