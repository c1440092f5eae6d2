"""The demo workflow (report generation) on top of accord's modules.

``accept_submission`` (domain write + outbox, one transaction) → relay → the ``report``
consumer submits a job (accord.workflows) → ``accord worker --workflow report`` runs
:func:`report_handler`: the provider call as an effect, the report body as an immutable
object, and a fenced publish of demo.reports + jobs.results + ``report.published.v1``.
"""

from accord.demo.domain import Report, SubmissionState, accept_submission, operation_for, report
from accord.demo.errors import DemoError, SubmissionConflict
from accord.demo.job import (
    DEFAULT_OWNER,
    EFFECT_KEY,
    WORKFLOW,
    handlers,
    register_demo,
    report_handler,
)

__all__ = [
    "DEFAULT_OWNER",
    "EFFECT_KEY",
    "WORKFLOW",
    "DemoError",
    "Report",
    "SubmissionConflict",
    "SubmissionState",
    "accept_submission",
    "handlers",
    "operation_for",
    "register_demo",
    "report",
    "report_handler",
]
