"""Consumption: the inbox (reserve in the caller's transaction) and the consumer runtime."""

from consumers.batch import ANY_TENANT, Stats
from consumers.errors import (
    ConnectionLost,
    ConsumerError,
    DigestMismatch,
    InboxConflict,
    NoHandler,
    PermanentFailure,
    Rejected,
    ReplayTooOld,
    TenantMismatch,
    TransientFailure,
)
from consumers.handlers import Handler, Handlers
from consumers.inbox import (
    Consumer,
    Delivery,
    InboxOutcome,
    prune,
    record_delivery,
    reserve,
    reserve_many,
)
from consumers.poison import PoisonReason, PoisonRecord
from consumers.runtime import ConsumerRuntime, RuntimeConfig

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
