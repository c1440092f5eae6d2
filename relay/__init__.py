"""Delivery: the transactional outbox (enqueue in the caller's transaction) and the relay."""

from accord.relay.errors import (
    ConnectionLost,
    DuplicateEvent,
    ExchangeMissing,
    JoinedStatementInvalid,
    MessageTooLarge,
    Nacked,
    PublishFailed,
    PublishTimeout,
    RelayError,
    ReleaseRefused,
    Unroutable,
)
from accord.relay.outbox import (
    Joined,
    OutboxRow,
    OutboxState,
    OutboxStats,
    Prepared,
    Settlement,
    enqueue,
    enqueue_joined,
    prepare,
    release_held,
)
from accord.relay.publisher import AmqpPublisher, Publisher, amqp_publisher
from accord.relay.relay import Relay, RelayConfig, RelayStats

__all__ = [
    "AmqpPublisher",
    "ConnectionLost",
    "DuplicateEvent",
    "ExchangeMissing",
    "Joined",
    "JoinedStatementInvalid",
    "MessageTooLarge",
    "Nacked",
    "OutboxRow",
    "OutboxState",
    "OutboxStats",
    "Prepared",
    "PublishFailed",
    "PublishTimeout",
    "Publisher",
    "Relay",
    "RelayConfig",
    "RelayError",
    "RelayStats",
    "ReleaseRefused",
    "Settlement",
    "Unroutable",
    "amqp_publisher",
    "enqueue",
    "enqueue_joined",
    "prepare",
    "release_held",
]
