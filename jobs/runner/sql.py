"""SQL owned by the worker (jobs.runner). Values only as $n parameters.

Every write-back of a lease goes through :class:`jobs.Store` (the result manifest row too:
``Store.record_result``, fenced); the worker itself only reads effect records for its
restart report, and notes there the begins a restore left without a record (0054).
"""

# Of the begins $1..$4 (job ids, effect keys, seqs, the attempts that began them), those the
# journal may let go, by what this database says of each begin's own attempt (a row of another
# attempt is another effect: job ids rewound by a restore can meet again). Recorded: an outcome
# (anything but pending) on the row that attempt began. Pruned: retention removed that
# attempt's effects, resolved (a tombstone, 0054). Acknowledged: a start noted it as a
# restore's evidence and a person acknowledged the note (0054). Or, never noted, its job gone
# at or below jobs.pruned's mark, which 0054 froze below the oldest job then present: every job
# at or below it was gone for good, and a restore rewinds job ids above it, never below.
SETTLED_EFFECTS = """
SELECT b.job_id, b.effect_key, b.seq, b.attempt_id
FROM unnest($1::bigint[], $2::text[], $3::int[], $4::uuid[])
     AS b(job_id, effect_key, seq, attempt_id)
LEFT JOIN jobs.journal_evidence v USING (job_id, effect_key, seq, attempt_id)
WHERE EXISTS (SELECT 1 FROM jobs.effects e
              WHERE e.job_id = b.job_id AND e.effect_key = b.effect_key AND e.seq = b.seq
                AND e.attempt_id = b.attempt_id AND e.state <> 'pending')
   OR EXISTS (SELECT 1 FROM jobs.pruned_attempts t WHERE t.attempt_id = b.attempt_id)
   OR v.acknowledged_at IS NOT NULL
   OR (v.evidence_id IS NULL
       AND b.job_id <= (SELECT p.through_job_id FROM jobs.pruned p)
       AND NOT EXISTS (SELECT 1 FROM jobs.jobs j WHERE j.job_id = b.job_id))
"""

# Note the unrecorded begins $2..$7 (tenants, job ids, keys, seqs, attempts, idempotency keys)
# of runner $1 whose attempt began no effect row here (0054); each given begin that has a note.
NOTE_EVIDENCE = (
    "SELECT evidence_id, job_id, effect_key, seq, attempt_id, acknowledged"
    " FROM jobs.note_journal_evidence($1, $2, $3, $4, $5, $6, $7)"
)
