"""SQL owned by the worker (jobs.runner). Values only as $n parameters.

Every write-back of a lease goes through :class:`jobs.Store`; the worker itself only reads
effect records for its restart report and writes the result manifest row from inside a
publish callback, where the fence already holds the job row locked.
"""

# The effect records among jobs $1 whose outcome is recorded (anything but pending).
RECORDED_EFFECTS = (
    "SELECT job_id, effect_key, seq FROM jobs.effects"
    " WHERE job_id = ANY($1::bigint[]) AND state <> 'pending'"
)

# The fenced manifest row that makes result object $3 (digest $4) authoritative for job $1.
INSERT_RESULT = (
    "INSERT INTO jobs.results (job_id, tenant, object_key, content_digest) VALUES ($1, $2, $3, $4)"
)
