-- 0013 registration audit: registering a workflow class's queue owner (and switching its
-- effects on or off) is an explicit administrative act (`accord register`), and each one
-- leaves a row here in the registration's own transaction. Append-only, like
-- jobs.repair_audit (the same trigger function).
CREATE TABLE jobs.registration_audit (
    audit_id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                       timestamptz NOT NULL DEFAULT now(),
    action                   text        NOT NULL
        CONSTRAINT registration_audit_action_check CHECK (action IN ('register', 'transfer')),
    workflow                 text        NOT NULL,
    owner                    text        NOT NULL,
    effects_enabled          boolean     NOT NULL,
    -- What the registration was before (NULL: the class was not registered).
    previous_owner           text,
    previous_effects_enabled boolean,
    who                      text        NOT NULL CHECK (who <> ''),  -- the person or tool
    db_user                  text        NOT NULL DEFAULT session_user
);
CREATE INDEX registration_audit_workflow_idx ON jobs.registration_audit (workflow, audit_id);

CREATE TRIGGER registration_audit_append_only BEFORE UPDATE OR DELETE ON jobs.registration_audit
    FOR EACH ROW EXECUTE FUNCTION jobs.append_only();
CREATE TRIGGER registration_audit_no_truncate BEFORE TRUNCATE ON jobs.registration_audit
    FOR EACH STATEMENT EXECUTE FUNCTION jobs.append_only();

GRANT SELECT ON jobs.registration_audit TO accord_worker, accord_repair;
