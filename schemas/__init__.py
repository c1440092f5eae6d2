"""Contracts every accord module agrees on: settings, errors, migrations, events, topology."""

from accord.schemas.errors import (
    AccordError,
    ConfigError,
    EventError,
    InvalidEvent,
    MalformedMessage,
    MigrationError,
    MigrationFailed,
    MigrationTampered,
    NotInTransaction,
    PayloadTooLarge,
    SchemaAhead,
    SchemaBehind,
    ServiceUnavailable,
    UnknownEventType,
)
from accord.schemas.events import Catalog, Event, EventType
from accord.schemas.settings import Settings
from accord.schemas.topology import Topology, WorkflowQueue
from accord.schemas.wire import Inbound, WireMessage

__all__ = [
    "AccordError",
    "Catalog",
    "ConfigError",
    "Event",
    "EventError",
    "EventType",
    "Inbound",
    "InvalidEvent",
    "MalformedMessage",
    "MigrationError",
    "MigrationFailed",
    "MigrationTampered",
    "NotInTransaction",
    "PayloadTooLarge",
    "SchemaAhead",
    "SchemaBehind",
    "ServiceUnavailable",
    "Settings",
    "Topology",
    "UnknownEventType",
    "WireMessage",
    "WorkflowQueue",
]
