"""The operational view: `accord status`, `/metrics` and projection replay (read side).

Everything here reads; the only writes are replay's projection batches (under the
``accord_projection`` principal) and its ledger (``ops.replay_runs``, ``ops.replay_refusals``).
"""

from accord.ops.errors import (
    InvalidSince,
    OpsError,
    ProjectionPrincipalLost,
    RebuildIncomplete,
    ReplayHandlerFailed,
    ReplayInterrupted,
    ReplayWindowExceeded,
    UnknownProjection,
)
from accord.ops.messaging import MessagingMetrics, install_span_metrics
from accord.ops.metrics import MetricsServer, StatusCollector, families, serve_metrics, serving
from accord.ops.models import StatusReport, WaitCategory, WaitReason
from accord.ops.projections import Projection
from accord.ops.replay import (
    Refusal,
    ReplaySummary,
    parse_since,
    prune_ledger,
    replay,
    resolve_since,
)
from accord.ops.status import collect_status, render_table, to_json

__all__ = [
    "InvalidSince",
    "MessagingMetrics",
    "MetricsServer",
    "OpsError",
    "Projection",
    "ProjectionPrincipalLost",
    "RebuildIncomplete",
    "Refusal",
    "ReplayHandlerFailed",
    "ReplayInterrupted",
    "ReplaySummary",
    "ReplayWindowExceeded",
    "StatusCollector",
    "StatusReport",
    "UnknownProjection",
    "WaitCategory",
    "WaitReason",
    "collect_status",
    "families",
    "install_span_metrics",
    "parse_since",
    "prune_ledger",
    "render_table",
    "replay",
    "resolve_since",
    "serve_metrics",
    "serving",
    "to_json",
]
