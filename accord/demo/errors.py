"""The demo domain's errors::

AccordError
└── DemoError                 the demo domain refused
    └── SubmissionConflict    the report id was already accepted with another subject
"""

from __future__ import annotations

from accord.schemas.errors import AccordError


class DemoError(AccordError):
    """The demo domain refused."""

    reason = "demo"


class SubmissionConflict(DemoError):
    """This report id was already accepted with another subject."""

    reason = "submission_conflict"
