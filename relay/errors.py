"""The relay's errors: what enqueue refuses and why a publish did not count.

Enqueue raises the shared event errors of ``schemas`` (UnknownEventType, InvalidEvent,
PayloadTooLarge, NotInTransaction) before anything is written, and DuplicateEvent when
the row's event id is already in the outbox. A publish that did not count raises one
PublishFailed subclass, mapped once from aio-pika/aiormq at the seam
(``relay.publisher``); its ``reason`` is what the outbox row records::

    AccordError (schemas.errors)
    └── RelayError                   the relay failed
        ├── DuplicateEvent           the (tenant, event id) is already in the outbox
        ├── ExchangeMissing          the events exchange is not on the broker (the relay waits)
        ├── JoinedStatementInvalid   enqueue_joined's domain statement has no RETURNING
        ├── ReleaseRefused           a held-row release named a row that is not held (or no
        │                            principal): nothing was changed
        ├── DiscardRefused           a held-row discard named a row that is not held (or no
        │                            principal): nothing was changed
        └── PublishFailed            the broker did not confirm the publish: not published
            ├── Nacked               the broker answered basic.nack (transient)
            ├── PublishTimeout       no confirm within the timeout (transient)
            ├── ConnectionLost       the channel or connection went away (transient)
            ├── Unroutable           basic.return: no queue is bound (permanent after N tries)
            └── MessageTooLarge      over the broker's message size (permanent)
"""

from __future__ import annotations

from accord.schemas import errors as schemas_errors
from accord.schemas.errors import AccordError


class RelayError(AccordError):
    """The relay failed."""

    reason = "relay"


class ExchangeMissing(RelayError):
    """The events exchange does not exist on the broker: declare the application's topology
    (ACCORD_TOPOLOGY_DECLARE=true lets the relay declare it at each connection, else
    deploy/rabbitmq/definitions.json). A running relay whose exchange was deleted publishes
    nothing and waits for it, its rows kept; /readyz names the exchange meanwhile."""

    reason = "exchange_missing"


class BrokerBlocked(RelayError):
    """RabbitMQ blocked the relay's connection (a memory or disk alarm): nothing can be
    published until it clears; the relay claims nothing meanwhile."""

    reason = "broker_blocked"


class DuplicateEvent(RelayError):
    """This event id is already in the outbox for this tenant."""

    reason = "duplicate_event"


class PublishFailed(RelayError):
    """The broker did not confirm the publish; the row stays unpublished."""

    reason = "publish_failed"
    permanent = False


class Nacked(PublishFailed):
    """The broker refused the publish (basic.nack)."""

    reason = "nacked"


class PublishTimeout(PublishFailed):
    """No publisher confirm arrived within the timeout."""

    reason = "timeout"


class PublishRefused(PublishFailed, schemas_errors.BrokerAccessRefused):
    """The broker refused this user publishing to the exchange (ACCESS_REFUSED): not the
    row's fault, and refused at every retry. The row stays pending with this reason; the
    relay settles its batch, then stops with one line (a ServiceRefused)."""

    reason = "access_refused"


class ConnectionLost(PublishFailed, schemas_errors.ConnectionLost):
    """The broker channel or connection was lost before the confirm (a publish outcome, and
    the same lost connection every module sees)."""

    reason = "connection_lost"


class Unroutable(PublishFailed):
    """The broker returned the message: no queue is bound for its routing key."""

    reason = "unroutable"


class MessageTooLarge(PublishFailed):
    """The message is larger than the broker accepts."""

    reason = "oversize"
    permanent = True


class ReleaseRefused(RelayError):
    """Not released: every named row must be held, and the release needs --who and
    --evidence; nothing was changed."""

    reason = "release_refused"


class DiscardRefused(RelayError):
    """Not discarded: every named row must be held, and the discard needs --who and
    --evidence; nothing was changed."""

    reason = "discard_refused"


class JoinedStatementInvalid(RelayError):
    """The joined enqueue takes one INSERT, UPDATE or DELETE with a RETURNING clause, its
    parameters exactly $1..$n for the n arguments given, no WITH of its own and no trailing
    ';': the outbox row is written only when it returns a row. ``detail`` says which rule
    the statement broke (or PostgreSQL's words); nothing was written and the caller's
    transaction is still usable."""

    reason = "joined_statement_invalid"
