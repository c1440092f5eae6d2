"""Contracts every accord module agrees on: settings, errors, migrations, events, topology."""

from schemas.errors import (
    AccordError,
    ConfigError,
    EventError,
    InvalidEvent,
    MalformedMessage,
    MigrationError,
    MigrationTampered,
    NotInTransaction,
    PayloadTooLarge,
    SchemaAhead,
    SchemaBehind,
    ServiceUnavailable,
    UnknownEventType,
)
from schemas.settings import Settings

__all__ = [
    "AccordError",
    "ConfigError",
    "EventError",
    "InvalidEvent",
    "MalformedMessage",
    "MigrationError",
    "MigrationTampered",
    "NotInTransaction",
    "PayloadTooLarge",
    "SchemaAhead",
    "SchemaBehind",
    "ServiceUnavailable",
    "Settings",
    "UnknownEventType",
]
