-- Helpers for the isolationtester specs in this directory, loaded (psql-able) into a freshly
-- migrated database before the specs run. They only remember leases and call the jobs
-- module's own SQL functions (migration 0004), raising where the store raises, so every spec
-- exercises the production statements. Workflow 'w', owner 'o', tenant 'acme'.
CREATE SCHEMA spec;

-- The leases the sessions hold, by holder name ('A', 'B', ...).
CREATE TABLE spec.leases (
    holder text PRIMARY KEY, job_id bigint, tenant text, workflow text, operation_id text,
    owner text, attempt_id uuid, generation bigint, epoch bigint
);

-- Empty every jobs table (TRUNCATE: effect records refuse DELETE), restart ids, register 'w'.
CREATE FUNCTION spec.reset() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE jobs.results, jobs.effects, jobs.jobs, jobs.operations, jobs.tenants,
             jobs.workflows, spec.leases
        RESTART IDENTITY CASCADE;
    INSERT INTO jobs.workflows (workflow, owner, effects_enabled) VALUES ('w', 'o', true);
END $$;

-- Submit operation op for tenant 'acme' (jobs.submit, as the store runs it).
CREATE FUNCTION spec.submit(op text) RETURNS bigint LANGUAGE sql AS $$
    SELECT job_id FROM jobs.submit('acme', 'w', op, 'digest-' || op, '{}'::jsonb, 5)
$$;

-- Claim one job for holder h with a lease of lease_s seconds (jobs.claim); remember the lease.
CREATE FUNCTION spec.claim(h text, lease_s double precision)
RETURNS TABLE (job_id bigint, generation bigint) LANGUAGE sql AS $$
    WITH c AS (SELECT * FROM jobs.claim('w', 'o', lease_s, 1)),
    kept AS (
        INSERT INTO spec.leases
        SELECT h, c.job_id, c.tenant, c.workflow, c.operation_id, c.owner, c.attempt_id,
               c.generation, c.epoch FROM c
        ON CONFLICT (holder) DO UPDATE SET job_id = excluded.job_id,
            attempt_id = excluded.attempt_id, generation = excluded.generation,
            epoch = excluded.epoch
        RETURNING job_id, generation
    )
    SELECT job_id, generation FROM kept
$$;

-- Store.locked: the fence, raising FenceLost with the failing field.
CREATE FUNCTION spec.locked(h text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    SELECT jobs.fence(l.job_id, l.tenant, l.workflow, l.operation_id, l.owner, l.attempt_id,
                      l.generation, l.epoch) INTO v FROM spec.leases l WHERE l.holder = h;
    IF v IS NOT NULL THEN
        RAISE EXCEPTION 'FenceLost: %', v;
    END IF;
    RETURN 'fence held';
END $$;

-- A publish callback: the fenced manifest row for h's job (jobs.record_result, as
-- Store.record_result runs it), raising FenceLost with the failing field.
CREATE FUNCTION spec.write_result(h text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    SELECT jobs.record_result(l.job_id, l.tenant, l.workflow, l.operation_id, l.owner,
                              l.attempt_id, l.generation, l.epoch, 'results/' || l.holder,
                              'sha256:x') INTO v FROM spec.leases l WHERE l.holder = h;
    IF v IS NOT NULL THEN
        RAISE EXCEPTION 'FenceLost: %', v;
    END IF;
    RETURN 'result written by ' || h;
END $$;

-- The publish's second fence and the transition to succeeded (jobs.succeed), raising.
CREATE FUNCTION spec.succeed(h text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    SELECT jobs.succeed(l.job_id, l.tenant, l.workflow, l.operation_id, l.owner, l.attempt_id,
                        l.generation, l.epoch) INTO v FROM spec.leases l WHERE l.holder = h;
    IF v IS NOT NULL THEN
        RAISE EXCEPTION 'FenceLost: %', v;
    END IF;
    RETURN 'succeeded';
END $$;

-- Renew h's lease (jobs.renew): 'renewed' or the refusal.
CREATE FUNCTION spec.renew(h text, lease_s double precision) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(r.status, 'renewed') FROM spec.leases l,
        jobs.renew(l.job_id, l.tenant, l.workflow, l.operation_id, l.owner, l.attempt_id,
                   l.generation, l.epoch, lease_s) r
    WHERE l.holder = h
$$;

-- Begin effect k for h (jobs.begin_effect): 'pending' or the refusal.
CREATE FUNCTION spec.begin_effect(h text, k text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(r.status, 'pending') FROM spec.leases l,
        jobs.begin_effect(l.job_id, l.tenant, l.workflow, l.operation_id, l.owner,
                          l.attempt_id, l.generation, l.epoch, k, 'intent-' || k) r
    WHERE l.holder = h
$$;

-- Finish effect k for h with outcome o (jobs.finish_effect): the outcome or the refusal.
CREATE FUNCTION spec.finish_effect(h text, k text, o text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(jobs.finish_effect(l.job_id, l.tenant, l.workflow, l.operation_id, l.owner,
                                       l.attempt_id, l.generation, l.epoch, k, o, NULL), o)
    FROM spec.leases l WHERE l.holder = h
$$;

-- Give h's job up for reason e (jobs.fail, retry, no backoff): its new state or the refusal.
-- 'effects_disabled' is the worker's when jobs.begin_effect refused for disabled effects.
CREATE FUNCTION spec.fail(h text, e text DEFAULT 'gave up') RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(r.status, r.state) FROM spec.leases l,
        jobs.fail(l.job_id, l.tenant, l.workflow, l.operation_id, l.owner, l.attempt_id,
                  l.generation, l.epoch, e, true, 0, 0) r
    WHERE l.holder = h
$$;

-- Make job j's lease expired without sleeping (as the Python tests do).
CREATE FUNCTION spec.expire(j bigint) RETURNS integer LANGUAGE sql AS $$
    WITH u AS (
        UPDATE jobs.jobs SET lease_expires_at = now() - interval '1 second'
        WHERE job_id = j AND state = 'running' RETURNING 1
    )
    SELECT count(*)::integer FROM u
$$;

-- The jobs as the specs show them (no clocks, no random ids).
CREATE VIEW spec.jobs AS
    SELECT j.job_id, j.state, j.generation, j.attempts,
           (SELECT l.holder FROM spec.leases l
            WHERE l.job_id = j.job_id AND l.attempt_id = j.attempt_id
              AND l.generation = j.generation AND j.state = 'running') AS held_by,
           (SELECT count(*) FROM jobs.results r WHERE r.job_id = j.job_id) AS results
    FROM jobs.jobs j ORDER BY j.job_id;
