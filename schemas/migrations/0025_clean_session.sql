-- 0025 the session reset folded into a publish: jobs.clean_session resets what a publish
-- callback (application code) may have left on its connection, as asyncpg's pool reset does
-- when a connection goes back (advisory locks, cursors, LISTEN, session settings), but as an
-- expression of the publish's last statement, inside its transaction: a worker that keeps its
-- connections between jobs then needs no reset round trip after each publish. Inside a
-- transaction these are transactional: the settings reset and the UNLISTEN take effect at
-- commit (a rollback undoes the callback's settings and LISTEN anyway, and the connection
-- then goes back to the pool, whose reset runs). SECURITY INVOKER: it touches only the
-- caller's own session.
CREATE FUNCTION jobs.clean_session() RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_unlock_all();
    EXECUTE 'CLOSE ALL';
    EXECUTE 'UNLISTEN *';
    EXECUTE 'RESET ALL';
END $$;

REVOKE EXECUTE ON FUNCTION jobs.clean_session() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.clean_session() TO accord_worker;
