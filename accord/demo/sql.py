"""SQL owned by the demo application (schemas ``demo`` and ``demo_projection``). Values only
as $n parameters; the tables are defined in accord/demo/migrations."""

# Record submission ($1 tenant, $2 report id) unless it exists; returns the row when inserted
# (accept_submission joins report.accepted.v1's outbox row to it: relay.enqueue_joined).
INSERT_SUBMISSION = (
    "INSERT INTO demo.submissions (tenant, report_id, subject, operation_id, event_id, accepted_at)"
    " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, report_id) DO NOTHING"
    " RETURNING report_id"
)

# The existing submission of report $2 for tenant $1 (an idempotent re-accept reads it).
SUBMISSION = (
    "SELECT tenant, report_id, subject, operation_id, event_id, state, accepted_at"
    " FROM demo.submissions WHERE tenant = $1 AND report_id = $2"
)

# The published report row ($1 tenant, $2 report id, $3 job id, $4 object key, $5 provider
# receipt, $6 generation) and its submission marked published, in one statement, written only
# by the report job's fenced publish callback. Returns the submission's report id when there
# is one to mark; the report job joins report.published.v1's outbox row to it
# (relay.enqueue_joined puts this WITH list first).
PUBLISH_REPORT = """
WITH report AS (
    INSERT INTO demo.reports (tenant, report_id, job_id, object_key, provider_receipt, generation)
    SELECT $1, $2, $3, $4, $5, $6
    WHERE EXISTS (SELECT 1 FROM demo.submissions WHERE tenant = $1 AND report_id = $2)
)
UPDATE demo.submissions SET state = 'published' WHERE tenant = $1 AND report_id = $2
RETURNING report_id
"""

# One published report (for the demo's summary and the tests' oracle).
REPORT = (
    "SELECT tenant, report_id, job_id, object_key, provider_receipt, published_at, generation"
    " FROM demo.reports WHERE tenant = $1 AND report_id = $2"
)

# Upsert one published report; the later event (occurred_at, then event id) wins, so the
# result does not depend on delivery order.
UPSERT_PUBLISHED_REPORT = """
INSERT INTO demo_projection.published_reports AS p
    (tenant, report_id, operation_id, event_id, object_key, provider_receipt, published_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (tenant, report_id) DO UPDATE
SET operation_id = EXCLUDED.operation_id, event_id = EXCLUDED.event_id,
    object_key = EXCLUDED.object_key, provider_receipt = EXCLUDED.provider_receipt,
    published_at = EXCLUDED.published_at
WHERE (EXCLUDED.published_at, EXCLUDED.event_id) > (p.published_at, p.event_id)
"""

# Empty the demo projection before a rebuild (replay --rebuild).
RESET_PUBLISHED_REPORTS = "DELETE FROM demo_projection.published_reports"
