-- 0012 the claim and the batch publish keep one plan per session instead of planning each call.
--
-- A PL/pgSQL statement with parameters gets a cached plan: custom plans for its first five
-- executions, then the generic plan, but only if the generic plan's estimated cost is not
-- much above the custom plans' average. jobs.claim (LIMIT p_limit) and jobs.succeed_many
-- (arrays of unknown length) never pass that test: the generic plan estimates the LIMIT at a
-- tenth of the table and each array at an unknown length, so every call was planned again
-- (about 0.4 ms of server CPU per claim, 0.5 ms per batch publish, on the bench machine).
-- Their generic plans are the same shapes the custom ones are (the claim on
-- jobs_claimable_idx, then the picked rows by jobs_pkey; the batch publish on jobs_pkey),
-- because both statements were spelled so that only those indexes can drive them
-- (0004 and 0011). tests/integration/jobs/test_schema.py checks the plans the two functions
-- actually run, under fresh and under stale statistics.
--
-- The parameters still bind the generic plan on every call: nothing about which jobs are
-- eligible or fenced changes. The other fenced functions take scalar parameters and find
-- their job by primary key, a shape whose generic plan passes the cost test: auto_explain
-- shows jobs.renew and jobs.succeed on theirs after their first five calls (jobs.succeed costs
-- ~31 us a call that way in a server-side loop, ~112 us when planned for every call).

ALTER FUNCTION jobs.claim(text, text, double precision, integer)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION jobs.succeed_many(bigint[], text[], text[], text[], text[], uuid[], bigint[],
                                 bigint[])
    SET plan_cache_mode = force_generic_plan;
