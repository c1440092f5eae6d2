-- 0052 The database knows what its authority ledger held (a review of the operator commands).
-- A ledger file missing at the configured path read as an empty ledger: a wrong
-- ACCORD_LEDGER_PATH (or its relative default, run from another directory) made
-- `accord repair restore-check` report no restore while the real ledger was ahead of the
-- database, and a worker started that way created a new ledger and ran a restored tenant's
-- jobs, effects included. jobs.tenants.ledger_epoch keeps the highest epoch a check found
-- (or wrote) in the ledger for each tenant: a ledger holding less of a tenant is not this
-- deployment's ledger, or lost records, and the check refuses it (LedgerUnavailable). A
-- database restored from before is behind its ledger as before: a restore, not a refusal.
ALTER TABLE jobs.tenants ADD COLUMN ledger_epoch bigint CHECK (ledger_epoch >= 1);

COMMENT ON COLUMN jobs.tenants.ledger_epoch IS 'The highest epoch a restore check found or wrote in the authority ledger for this tenant; a ledger holding less is refused (0052)';

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

COMMENT ON FUNCTION jobs.ledger_seen(p_tenants text[], p_epochs bigint[]) IS 'Record the ledger epochs a restore check found or wrote, per tenant, only ever raising jobs.tenants.ledger_epoch; the rows raised (0052)';

REVOKE ALL ON FUNCTION jobs.ledger_seen(text[], bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION jobs.ledger_seen(text[], bigint[]) TO accord_worker, accord_repair;
