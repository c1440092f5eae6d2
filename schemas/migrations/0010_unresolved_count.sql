-- 0010 the job row counts its unresolved effects, so that a publish sees an effect begun
-- while it waited.
--
-- Before (0009): the publish's WHERE clause looked for a pending or unknown effect with
-- NOT EXISTS, and once the UPDATE held its rows a second statement looked again, because
-- begin_effect only *locked* the job row: an UPDATE that had waited for that lock went on
-- with the effects of its older snapshot (tests/isolation/publish_vs_begin_effect.spec).
--
-- Now every effect write that changes the number of pending or unknown effects also writes
-- that number on the job row (trigger effects_count). An UPDATE that waited for such a writer
-- re-checks its whole WHERE clause on the job row's new version (EvalPlanQual), count
-- included, so the second statement and its SQLSTATE AJ409 are gone. Every effect write
-- already locks the job row first (begin_effect and finish_effect through jobs.fence_check,
-- repair_resolve_effect FOR UPDATE), so the trigger takes no new lock order.
--
-- jobs.effects stays the record, and the publish still reads it (NOT EXISTS): the count is
-- derived, and anything that bypasses the trigger (disabled triggers, a data-only restore)
-- can leave it wrong. Too high, it refuses a publish (safe, and loud); too low, it only
-- weakens the re-check of a race in which the lease's holder begins an effect while its own
-- publish waits. tests/integration/jobs/test_state_machine.py checks that the count and the
-- record agree after every step.

ALTER TABLE jobs.jobs ADD COLUMN unresolved_effects integer NOT NULL DEFAULT 0;

CREATE FUNCTION jobs.effects_count() RETURNS trigger LANGUAGE plpgsql AS $$
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
REVOKE EXECUTE ON FUNCTION jobs.effects_count() FROM PUBLIC;

-- No effect changes between the count below and the trigger taking over (the lock lasts to
-- the end of the migration's transaction: `accord migrate` runs each file in one; by hand, psql -1).
LOCK TABLE jobs.effects IN SHARE ROW EXCLUSIVE MODE;
CREATE TRIGGER effects_count AFTER INSERT OR UPDATE OF state ON jobs.effects
    FOR EACH ROW EXECUTE FUNCTION jobs.effects_count();
UPDATE jobs.jobs j SET unresolved_effects = c.n
FROM (SELECT e.job_id, count(*)::integer AS n FROM jobs.effects e
      WHERE e.state IN ('pending', 'unknown') GROUP BY e.job_id) c
WHERE j.job_id = c.job_id;

CREATE OR REPLACE FUNCTION jobs.succeed(
    p_job_id bigint, p_tenant text, p_workflow text, p_operation_id text, p_owner text,
    p_attempt_id uuid, p_generation bigint, p_epoch bigint
) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE jobs.jobs j
    SET state = 'succeeded', lease_expires_at = NULL, last_error = NULL, updated_at = now()
    FROM jobs.tenants t
    WHERE j.job_id = p_job_id AND t.tenant = j.tenant
      AND j.tenant = p_tenant AND j.workflow = p_workflow AND j.operation_id = p_operation_id
      AND j.owner = p_owner AND j.attempt_id = p_attempt_id AND j.generation = p_generation
      AND j.state = 'running'
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

-- The batch spelling of the same WHERE clause (see 0009 for why there are two).
CREATE OR REPLACE FUNCTION jobs.succeed_many(
    p_job_ids bigint[], p_tenants text[], p_workflows text[], p_operation_ids text[],
    p_owners text[], p_attempt_ids uuid[], p_generations bigint[], p_epochs bigint[]
) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Operation fields compare with IS NOT DISTINCT FROM (never NULL here) so that only the
    -- primary key can drive this update: an equality on tenant lets a planner without fresh
    -- statistics scan a whole tenant through jobs_operation_key once per lease.
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
          AND j.state = 'running'
          AND j.epoch = l.epoch AND t.epoch = l.epoch AND NOT t.frozen
          AND j.lease_expires_at > clock_timestamp()
          AND j.unresolved_effects = 0
          AND NOT EXISTS (SELECT 1 FROM jobs.effects e
                          WHERE e.job_id = j.job_id AND e.state IN ('pending', 'unknown'))
        RETURNING j.job_id;
END $$;
