"""The consumers package's errors: one tree, rooted under schemas' AccordError::

    AccordError
    └── ConsumerError                 consumption failed
        ├── PermanentFailure          this message can never be applied: poison it
        │   ├── InboxConflict         the operation (or event id) came back with another meaning
        │   ├── ReplayTooOld          older than the inbox replay window: refused, never new
        │   ├── TenantMismatch        the event's tenant is not one this consumer serves
        │   ├── DigestMismatch        the producer's digest is not the one we compute
        │   ├── NoHandler             the catalog knows the type; this workflow has no handler
        │   ├── Rejected              a handler refused the event for good
        │   ├── MessageTooLarge       the body is over the consumer's bound: refused unread
        │   └── DatabaseRefused       PostgreSQL refused the message's content (by SQLSTATE)
        │       ├── DataException         class 22: a value a type refuses (jsonb: NUL, ...)
        │       ├── IntegrityViolation    class 23: a CHECK, NOT NULL, foreign or unique key
        │       └── StatementRefused      class 42: a syntax error or an access rule
        ├── TransientFailure          try again later (requeue, bounded by the delivery limit)
        └── PrivilegeMissing          42501: the consumer's role lacks a grant; stop, ack nothing

A lost connection is schemas' ConnectionLost (a ServiceUnavailable: the session reconnects),
the same type the relay and the worker see. Wire-level problems are schemas' own errors
(MalformedMessage, UnknownEventType, InvalidEvent) and are also permanent; consumers.poison
maps every permanent error to one typed poison reason. Every error's docstring is its
default message.

Database errors are classified once, at the seam where a message's transaction failed
(``consumers.verdicts.database_refusal``): SQLSTATE classes 22, 23 and 42 say the content or
the statement can never succeed, so the message is poisoned at once with the SQLSTATE in
the record; a lost connection (class 08), a serialization failure or deadlock (class 40)
and anything else stay transient. One code of class 42 is neither: 42501 (insufficient
privilege) says the *process* lacks a grant, whatever the message, so it stops the consumer
(PrivilegeMissing, one line naming the table) instead of poisoning every message it sees;
the messages stay unacknowledged in the queue until the grant exists.
"""

from __future__ import annotations

from accord.schemas.errors import AccordError
from accord.schemas.errors import ConnectionLost as ConnectionLost  # one type for it, re-exported


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
    """The event was enqueued longer ago than the inbox replay window (its ``ce-time``); it is
    refused, not treated as new."""

    reason = "too_old"


class OccurredInFuture(PermanentFailure):
    """The event's enqueue time (``ce-time``) is further ahead of the database's clock than
    the inbox's prune margin (a producer's database or a publisher's clock that runs
    ahead; an ``occurred_at`` dated ahead by the application is not judged): refused, not
    treated as new. One up to the margin ahead is admitted, and jobs.prune keeps an operation
    key that much past the horizon (0063), since another consumer class may admit the same
    event a window after its date. Fix the producer's clock; a requeued copy is admitted once
    the database's clock is within the margin of its date."""

    reason = "in_future"


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


class MessageTooLarge(PermanentFailure):
    """The message body is larger than this consumer's bound; it is poisoned unread."""

    reason = "too_large"


class DatabaseRefused(PermanentFailure):
    """PostgreSQL refused this message's content for good (see the SQLSTATE)."""

    reason = "database_refused"


class DataException(DatabaseRefused):
    """PostgreSQL refused a value (SQLSTATE class 22, data exception)."""

    reason = "data_exception"


class IntegrityViolation(DatabaseRefused):
    """PostgreSQL refused a row (SQLSTATE class 23, integrity constraint violation)."""

    reason = "integrity_violation"


class StatementRefused(DatabaseRefused):
    """PostgreSQL refused a statement (SQLSTATE class 42, syntax error or access rule)."""

    reason = "statement_refused"


class PrivilegeMissing(ConsumerError):
    """The consumer's database role lacks a privilege its handler needs: grant it to the role
    in the application's migrations; no message was acknowledged."""

    reason = "privilege_missing"
