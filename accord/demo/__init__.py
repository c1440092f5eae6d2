"""The demo application (report generation), one application built on accord's public API.

``accept_submission`` (domain write + outbox, one transaction) → relay → the ``report``
consumer submits a job (accord.demo.app) → ``accord worker --app accord.demo:app --workflow
report`` runs :func:`report_handler`: the provider call as an effect, the report body as an
immutable object, and a fenced publish of demo.reports + jobs.results +
``report.published.v1``. Its declarations are ``accord.demo:app``.
"""

from accord.demo.app import app, demo_topology
from accord.demo.catalog import demo_catalog
from accord.demo.domain import Report, SubmissionState, accept_submission, operation_for, report
from accord.demo.errors import DemoError, SubmissionConflict
from accord.demo.job import (
    DEFAULT_OWNER,
    EFFECT_KEY,
    WORKFLOW,
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
    "app",
    "demo_catalog",
    "demo_topology",
    "operation_for",
    "register_demo",
    "report",
    "report_handler",
]
