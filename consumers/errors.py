"""The consumers package's errors: one tree, rooted under schemas' AccordError::

    AccordError
    └── ConsumerError                 consumption failed
        ├── PermanentFailure          this message can never be applied: poison it
        │   ├── InboxConflict         the operation (or event id) came back with another meaning
        │   ├── ReplayTooOld          older than the inbox replay window: refused, never new
        │   ├── TenantMismatch        the event's tenant is not one this consumer serves
        │   ├── DigestMismatch        the producer's digest is not the one we compute
        │   ├── NoHandler             the catalog knows the type; this workflow has no handler
        │   └── Rejected              a handler refused the event for good
        ├── TransientFailure          try again later (requeue, bounded by the delivery limit)
        └── ConnectionLost            PostgreSQL or RabbitMQ went away; the session reconnects

Wire-level problems are schemas' own errors (MalformedMessage, UnknownEventType,
InvalidEvent) and are also permanent; consumers.poison maps every permanent error to
one typed poison reason. Every error's docstring is its default message.
"""

from __future__ import annotations

from accord.schemas.errors import AccordError


class ConsumerError(AccordError):
    """Consumption failed."""

    reason = "consumer"


class PermanentFailure(ConsumerError):
    """This message can never be applied; it goes to the poison queue."""

    reason = "rejected"


class InboxConflict(PermanentFailure):
    """The operation or event id was seen before with another meaning (digest or operation)."""

    reason = "conflict"


class ReplayTooOld(PermanentFailure):
    """The event is older than the inbox replay window; it is refused, not treated as new."""

    reason = "too_old"


class TenantMismatch(PermanentFailure):
    """The event's tenant is not one this consumer is configured to serve."""

    reason = "tenant_mismatch"


class DigestMismatch(PermanentFailure):
    """The digest on the wire differs from the digest computed from the event."""

    reason = "digest_mismatch"


class NoHandler(PermanentFailure):
    """No handler is registered for this event type and version in this workflow class."""

    reason = "no_handler"


class Rejected(PermanentFailure):
    """A handler refused the event permanently."""

    reason = "rejected"


class TransientFailure(ConsumerError):
    """The message could not be applied now; it is requeued (bounded by the delivery limit)."""

    reason = "transient"


class ConnectionLost(ConsumerError):
    """A connection to PostgreSQL or RabbitMQ was lost; the consumer reconnects."""

    reason = "connection_lost"
