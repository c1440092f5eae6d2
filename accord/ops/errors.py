"""The operational view's errors, rooted at :class:`OpsError`::

AccordError
└── OpsError                      the operational view refused
    ├── UnknownProjection         no projection is registered for the workflow class
    ├── InvalidSince              --since is neither an ISO timestamp nor a duration
    ├── ReplayWindowExceeded      --since is older than the outbox retains events
    ├── RebuildIncomplete         a rebuild would delete rows whose events it cannot apply
    ├── ReplayHandlerFailed       a projection handler's own error (its batch undone)
    ├── ReplayInterrupted         a deadlock or a timeout met again and again (run it again)
    └── ProjectionPrincipalLost   a handler left the projection principal (batch undone)
"""

from __future__ import annotations

from accord.schemas.errors import AccordError


class OpsError(AccordError):
    """The operational view refused."""

    reason = "ops"


class UnknownProjection(OpsError):
    """No projection is registered for this workflow class."""

    reason = "unknown_projection"


class InvalidSince(OpsError):
    """--since must be an ISO 8601 timestamp or a duration such as 90s, 15m, 2h, 7d or 1h30m."""

    reason = "invalid_since"


class ReplayWindowExceeded(OpsError):
    """The outbox no longer retains every event since then: a replay would be incomplete."""

    reason = "replay_window_exceeded"


class RebuildIncomplete(OpsError):
    """A rebuild empties the projection and applies the retained events again: rows made by
    events it would not apply (pruned by the relay, older than --since, or of tenants the
    rebuild does not serve) would be gone for good. Nothing was changed. Replay without
    --rebuild (events applied on top of the projection), start --since at the oldest
    retained event, or rebuild with every tenant."""

    reason = "rebuild_incomplete"


class ReplayHandlerFailed(OpsError):
    """A projection handler raised while replaying (its own error, named by type only: its
    text may quote the event). Its batch was rolled back; batches before it were committed,
    so after a rebuild's reset the projection holds only part of its rows until a rebuild
    succeeds (a failure in a rebuild's first batch rolls its reset and its run back too:
    nothing changed, ``run_id`` None). The run stays unfinished in ops.replay_runs. Fix the
    handler and run again."""

    reason = "replay_handler_failed"


class ReplayInterrupted(OpsError):
    """A projection handler's statement met a deadlock, a serialization failure, a lock or a
    statement timeout at each of its tries (the server's state, not the event's: caused by a
    ServiceUnavailable, so the command exits 75). Its batch was rolled back and the run stays
    unfinished; after a rebuild's reset the projection holds part of its rows until a run
    again (a rebuild, or a replay since the same time) completes."""

    reason = "replay_interrupted"


class ProjectionPrincipalLost(OpsError):
    """A projection handler left the projection principal; its batch was rolled back."""

    reason = "projection_principal_lost"
