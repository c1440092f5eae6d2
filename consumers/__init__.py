"""Consumption: the inbox (reserve in the caller's transaction) and the consumer runtime."""

from accord.consumers.batch import ANY_TENANT, Stats
from accord.consumers.errors import (
    ConnectionLost,
    ConsumerError,
    DigestMismatch,
    InboxConflict,
    NoHandler,
    OccurredInFuture,
    PermanentFailure,
    Rejected,
    ReplayTooOld,
    TenantMismatch,
    TransientFailure,
)
from accord.consumers.handlers import Handler, Handlers
from accord.consumers.inbox import (
    Consumer,
    Delivery,
    InboxOutcome,
    prune,
    record_delivery,
    reserve,
    reserve_many,
)
from accord.consumers.poison import PoisonReason, PoisonRecord
from accord.consumers.runtime import ConsumerRuntime, RuntimeConfig

__all__ = [
    "ANY_TENANT",
    "ConnectionLost",
    "Consumer",
    "ConsumerError",
    "ConsumerRuntime",
    "Delivery",
    "DigestMismatch",
    "Handler",
    "Handlers",
    "InboxConflict",
    "InboxOutcome",
    "NoHandler",
    "OccurredInFuture",
    "PermanentFailure",
    "PoisonReason",
    "PoisonRecord",
    "Rejected",
    "ReplayTooOld",
    "RuntimeConfig",
    "Stats",
    "TenantMismatch",
    "TransientFailure",
    "prune",
    "record_delivery",
    "reserve",
    "reserve_many",
]
