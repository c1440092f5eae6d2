"""SQL owned by the worker (jobs.runner). Values only as $n parameters.

Every write-back of a lease goes through :class:`jobs.Store` (the result manifest row too:
``Store.record_result``, fenced); the worker itself only reads effect records for its
restart report.
"""

# Of the begins $1..$4 (job ids, effect keys, seqs, the attempts that began them), those whose
# outcome the database recorded (anything but pending) on the row that same attempt began: a
# row of another attempt is another effect (job ids rewound by a restore can meet again).
RECORDED_EFFECTS = """
SELECT e.job_id, e.effect_key, e.seq, e.attempt_id
FROM unnest($1::bigint[], $2::text[], $3::int[], $4::uuid[])
     AS b(job_id, effect_key, seq, attempt_id)
JOIN jobs.effects e USING (job_id, effect_key, seq)
WHERE e.attempt_id = b.attempt_id AND e.state <> 'pending'
"""

# Of the job ids in $1, those retention removed (0047): gone, at or below the highest id
# jobs.prune ever removed. A job gone above it was never pruned here: a restore's doing.
PRUNED_JOBS = """
SELECT g.job_id FROM unnest($1::bigint[]) AS g(job_id)
WHERE g.job_id <= (SELECT p.through_job_id FROM jobs.pruned p)
  AND NOT EXISTS (SELECT 1 FROM jobs.jobs j WHERE j.job_id = g.job_id)
"""
