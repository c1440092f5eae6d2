-- The cluster roles accord's schemas grant to, as the migrations create them (0006: the
-- execution and repair principals; 0008: the projection principal; 0014: the relay and
-- consumer principals). Roles are cluster-wide while schemas are per database, so each is
-- created at most once and a concurrent creation is tolerated; a non-superuser migrating
-- user is made a member so that processes can SET ROLE. Hand-kept beside the generated
-- schema files; tests/integration/test_schema_files.py applies it first.
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['accord_worker', 'accord_repair', 'accord_projection',
                                  'accord_relay', 'accord_consumer'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it first
            END;
        END IF;
        IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
           AND NOT pg_has_role(current_user, v_role, 'MEMBER') THEN
            EXECUTE format('GRANT %I TO %I', v_role, current_user);
        END IF;
    END LOOP;
END $$;
