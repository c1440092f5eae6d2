"""The base of every accord error, and the errors the shared contracts raise.

Each package (``relay``, ``consumers``, ``jobs``) grows its own subtree under
:class:`AccordError` in its own ``errors.py``; this module holds the root and the
errors of the contracts everyone shares::

    AccordError
    ├── NotInTransaction          a durable write was given no open transaction
    ├── ConfigError               settings that cannot work
    │   ├── RetentionTooShort     a prune asked for less than a consumer's declared replay horizon
    │   └── ServiceRefused        a service answered and refused us: retrying cannot help
    │       ├── InvalidDsn            ACCORD_PG_DSN (or another DSN) is not a PostgreSQL DSN
    │       ├── DatabaseLoginRefused  PostgreSQL refused the user, password or role
    │       ├── DatabaseMissing       the database does not exist (`accord migrate` creates it)
    │       ├── BrokerLoginRefused    RabbitMQ refused the login or the vhost's permissions
    │       └── BrokerVhostRefused    the vhost does not exist, or the user may not use it
    ├── ServiceUnavailable        PostgreSQL or RabbitMQ did not answer (transient: retried)
    │   ├── DatabaseReadOnly      PostgreSQL answers but takes no writes (a readiness reason)
    │   └── ConnectionLost        a connection went away while in use (relay.ConnectionLost,
    │                             the publish outcome, is one too)
    ├── MigrationError            the schema ledger and the code disagree
    │   ├── MigrationTampered     an applied file changed after it was applied
    │   ├── SchemaBehind          the database lacks migrations the code needs
    │   └── SchemaAhead           the database has migrations this code does not know
    └── EventError                an event is not acceptable (see schemas.events)
        ├── UnknownEventType      no such type, or no such version of it
        ├── InvalidEvent          fails its catalog model, or carries bad values
        │   └── TenantConflict    the payload names another tenant than the envelope
        ├── PayloadTooLarge       over the configured size limit
        └── MalformedMessage      a wire message that cannot be decoded

Every error's docstring is its default message; structured fields ride along as
attributes so logs carry identifiers and typed reasons, never payloads.
"""

from __future__ import annotations

from typing import Any


class AccordError(Exception):
    """accord failed."""

    reason: str = "error"

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(self, key, value)
        # After the loop: a field named "fields" (InvalidEvent's) must not replace the dict.
        self.fields = fields
        text = message or (self.__doc__ or self.__class__.__name__).strip().splitlines()[0]
        if fields:
            text = f"{text} ({', '.join(f'{k}={v!r}' for k, v in fields.items())})"
        super().__init__(text)


class NotInTransaction(AccordError):
    """A durable write needs the caller's open transaction; none was given."""

    reason = "not_in_transaction"


class ConfigError(AccordError):
    """The configuration cannot work."""

    reason = "config"


class RetentionTooShort(ConfigError):
    """The retention is shorter than a consumer's declared replay horizon; nothing removed.

    A redelivery could outlive what the prune would remove. Set the retention to at least
    ``horizon_s`` (``consumer`` declared it at its start: its replay window plus its prune
    margin, consumers.replay_windows)."""

    reason = "retention_too_short"


class ServiceRefused(ConfigError):
    """A service answered and refused this configuration; retrying cannot help."""

    reason = "service_refused"


class InvalidDsn(ServiceRefused):
    """The PostgreSQL DSN cannot be parsed: use postgresql://USER@HOST:PORT/DATABASE."""

    reason = "invalid_dsn"


class DatabaseLoginRefused(ServiceRefused):
    """PostgreSQL refused the login: check the DSN's user and password (and the role it sets)."""

    reason = "database_login_refused"


class DatabaseMissing(ServiceRefused):
    """The database does not exist: `accord migrate` creates it."""

    reason = "database_missing"


class BrokerLoginRefused(ServiceRefused):
    """RabbitMQ refused the login: check the AMQP URL's user, password and vhost permissions."""

    reason = "broker_login_refused"


class BrokerVhostRefused(ServiceRefused):
    """RabbitMQ refused the vhost: it does not exist or the user has no permissions on it."""

    reason = "broker_vhost_refused"


class BrokerAccessRefused(ServiceRefused):
    """RabbitMQ refused this user an operation on a queue or an exchange (ACCESS_REFUSED):
    grant it the permission named (rabbitmqctl set_permissions: configure, write, read)."""

    reason = "broker_access_refused"


class ServiceUnavailable(AccordError):
    """A required service (PostgreSQL or RabbitMQ) did not answer."""

    reason = "service_unavailable"


class DatabaseReadOnly(ServiceUnavailable):
    """PostgreSQL answers but takes no writes (a standby, a primary stepping down, or
    ``default_transaction_read_only``): point the DSN at the primary, or wait for the
    failover to end."""

    reason = "database_read_only"


class ConnectionLost(ServiceUnavailable):
    """A connection to PostgreSQL or RabbitMQ went away while in use; reconnect and retry."""

    reason = "connection_lost"


class MigrationError(AccordError):
    """The migration ledger and the code disagree."""

    reason = "migration"


class MigrationTampered(MigrationError):
    """An applied migration file changed after it was applied; refusing to continue."""

    reason = "migration_tampered"


class MigrationFailed(MigrationError):
    """A migration's SQL failed, and nothing of it was applied (its transaction rolled back):
    fix the file ``applying`` names (PostgreSQL's words and SQLSTATE are in ``detail`` and
    ``sqlstate``), then migrate again."""

    reason = "migration_failed"


class MigrationRefused(ServiceRefused):
    """PostgreSQL refused the migrating user a privilege a migration needs (creating the
    database, a schema, the process roles, grants): migrate as a user that has it (a
    superuser, or the database's owner with CREATEROLE; CREATEDB for a new database)."""

    reason = "migration_refused"


class SchemaBehind(MigrationError):
    """The database schema is older than this code; run `accord migrate`."""

    reason = "schema_behind"


class SchemaAhead(MigrationError):
    """The database has migrations this code does not know; deploy newer code."""

    reason = "schema_ahead"


class EventError(AccordError):
    """The event is not acceptable."""

    reason = "invalid_event"


class UnknownEventType(EventError):
    """No such event type or version in the catalog."""

    reason = "unknown_type"


class InvalidEvent(EventError):
    """The event fails its catalog model or carries values accord refuses."""

    reason = "invalid_event"


class TenantConflict(InvalidEvent):
    """The payload names another tenant (a top-level ``tenant`` or ``tenantid``) than the event."""

    reason = "tenant_conflict"


class PayloadTooLarge(EventError):
    """The event payload is larger than the configured limit."""

    reason = "oversize"


class MalformedMessage(EventError):
    """The wire message cannot be decoded into an event."""

    reason = "malformed"
