"""accord: durable event delivery and job execution on PostgreSQL and RabbitMQ.

What an application imports (pinned by tests/unit/test_public_api.py, listed in the README):
declare an :class:`App` (its catalog, consumer classes, projections, jobs, providers and
migrations), enqueue its events in its own transactions, and run it with the `accord`
command (``--app module:attribute``). Everything else (``accord.relay``, ``accord.jobs``,
...) stays importable for the brave, but is not advertised and may change.
"""

from accord.app import App, Provider, Receipt, ReceiptLookup, load_app
from accord.consumers import Handlers, InboxConflict
from accord.errors import AppError, AppInvalid, AppNotFound
from accord.jobs import EffectsDisabled, FenceLost, LookupUnavailable
from accord.jobs.runner import FailedBeforeDispatch, JobContext, Success
from accord.relay import enqueue
from accord.schemas.db import Tx
from accord.schemas.errors import AccordError, InvalidEvent, UnknownEventType
from accord.schemas.events import Catalog, Event, EventType
from accord.telemetry import configure as configure_tracing

__version__ = "0.2.0"

__all__ = [
    "AccordError",
    "App",
    "AppError",
    "AppInvalid",
    "AppNotFound",
    "Catalog",
    "EffectsDisabled",
    "Event",
    "EventType",
    "FailedBeforeDispatch",
    "FenceLost",
    "Handlers",
    "InboxConflict",
    "InvalidEvent",
    "JobContext",
    "LookupUnavailable",
    "Provider",
    "Receipt",
    "ReceiptLookup",
    "Success",
    "Tx",
    "UnknownEventType",
    "configure_tracing",
    "enqueue",
    "load_app",
]
