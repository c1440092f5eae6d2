"""SQL owned by the worker (jobs.runner). Values only as $n parameters.

Every write-back of a lease goes through :class:`jobs.Store` (the result manifest row too:
``Store.record_result``, fenced); the worker itself only reads effect records for its
restart report.
"""

# The effect records among jobs $1 whose outcome is recorded (anything but pending).
RECORDED_EFFECTS = (
    "SELECT job_id, effect_key, seq FROM jobs.effects"
    " WHERE job_id = ANY($1::bigint[]) AND state <> 'pending'"
)
