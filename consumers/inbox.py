"""The inbox: one reserved semantic operation per (tenant, consumer, operation id).

Invariant: an inbox row exists if and only if its consumer's effect for that operation
committed, because ``reserve`` writes the row in the caller's transaction, the same one
that applies the effect (the "tracking record" of eventsourcing). A redelivery finds the
row and is skipped; the same operation with another digest, or the same event id under
another operation or digest, is an ``InboxConflict``. Ids are tenant-scoped: the same
operation id under two tenants is two operations.

Retention: rows are kept for the replay window after ``GREATEST(first_seen_at,
occurred_at)``, plus a safety margin, and pruned in bounded batches. ``reserve`` refuses
a *new* event older than the window (``ReplayTooOld``) using the database clock, so an
event whose row was pruned can never be mistaken for a new one. The time judged (the
column ``occurred_at``) is the delivery's enqueue time (``ce-time``, ``Delivery.enqueued_at``),
the same on every delivery of the event: a producer's own ``occurred_at`` (a backfill dated
last month, an appointment dated tomorrow) is the event's content, not its age.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from accord.consumers import sql
from accord.consumers.errors import (
    InboxConflict,
    OccurredInFuture,
    ReplayTooOld,
    TransientFailure,
)
from accord.schemas.db import require_transaction, retention_refusal, rows_affected
from accord.schemas.errors import ConfigError
from accord.schemas.events import Catalog, Event
from accord.schemas.settings import duration_ok

# Pruning keeps rows this much longer than the window: a reserve whose transaction began
# just before a prune must still find the row it collides with.
PRUNE_MARGIN_S = 300.0
_RESERVE_ATTEMPTS = 3


class InboxOutcome(StrEnum):
    """What the inbox decided for one delivery (mirrors ``deliveries_outcome_check``)."""

    NEW = "new"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class Consumer:
    """An inbox identity: the consumer's name (its workflow class) and how it judges events."""

    name: str
    catalog: Catalog
    replay_window_s: float

    def __post_init__(self) -> None:
        if not duration_ok(self.replay_window_s, positive=True):
            raise ConfigError(
                "a replay window must be a number of seconds > 0, at most 100 years",
                consumer=self.name,
                replay_window_s=self.replay_window_s,
            )

    @property
    def horizon_s(self) -> float:
        return replay_horizon_s(self.replay_window_s)


def replay_horizon_s(replay_window_s: float) -> float:
    """How long after an event a redelivery of it may still arrive and be absorbed: the
    replay window plus the margin the inbox's pruner keeps."""
    return replay_window_s + PRUNE_MARGIN_S


@dataclass(frozen=True, slots=True)
class Delivery:
    """The identity of one delivery, recorded apart from the operation it carries.

    ``delivery_count`` is the broker's ``x-delivery-count`` (0 on a first delivery).
    ``enqueued_at`` is the message's ``ce-time`` (``wire.Inbound.enqueued_at``), the time
    the replay window judges; None (a delivery built by hand) judges ``event.occurred_at``.
    """

    publish_id: str | None = None
    redelivered: bool = False
    delivery_count: int = 0
    enqueued_at: datetime | None = None

    def judged(self, event: Event) -> datetime:
        """The time the replay window judges for ``event`` carried by this delivery."""
        return event.occurred_at if self.enqueued_at is None else self.enqueued_at


@dataclass(frozen=True, slots=True)
class InboxRow:
    """A stored inbox row's identity (the part the conflict check compares)."""

    operation_id: str
    event_id: uuid.UUID
    digest: str

    @classmethod
    def from_record(cls, record: Any) -> InboxRow:
        return cls(record["operation_id"], record["event_id"], record["digest"])


async def reserve(
    tx: Any, consumer: Consumer, event: Event, delivery: Delivery, *, digest: str | None = None
) -> bool:
    """Runs in the caller's transaction; never commits. True: newly reserved, apply the effect.

    False: already applied (a duplicate; its delivery is logged), skip the effect.
    Raises InboxConflict (with both digests) when the operation or the event id comes back
    with another meaning, ReplayTooOld for a new event older than the replay window, and
    OccurredInFuture for one dated more than the prune margin ahead of the database clock.
    After either error the caller must roll back (at least to its savepoint).
    ``digest`` may be passed when already computed with ``consumer.catalog``.
    """
    require_transaction(tx)
    digest = digest or consumer.catalog.digest(event)
    for _ in range(_RESERVE_ATTEMPTS):
        row = await tx.fetchrow(
            sql.RESERVE,
            event.tenant,
            consumer.name,
            event.operation_id,
            event.event_id,
            digest,
            event.type,
            event.version,
            delivery.judged(event),
            consumer.replay_window_s,
            delivery.publish_id,
            delivery.redelivered,
            delivery.delivery_count,
            PRUNE_MARGIN_S,
        )
        if row["fresh"]:
            return True
        found = [
            InboxRow.from_record(r)
            for r in await tx.fetch(
                sql.COLLISIONS, event.tenant, consumer.name, event.operation_id, event.event_id
            )
        ]
        if found:
            _check_same_meaning(consumer, event, digest, found)
            await record_delivery(tx, consumer, event, delivery, InboxOutcome.DUPLICATE)
            return False
        named = {
            "tenant": event.tenant,
            "consumer": consumer.name,
            "operation_id": event.operation_id,
            "event_id": str(event.event_id),
            "enqueued_at": delivery.judged(event).isoformat(),
        }
        if row["too_old"]:
            # The window applied: the lesser of this process's and its consumer's declared
            # one (migration 0028).
            raise ReplayTooOld(**named, window_s=row["window_s"])
        if row["too_new"]:
            raise OccurredInFuture(**named, tolerance_s=PRUNE_MARGIN_S)
        # Neither inserted nor found: the colliding row was pruned between the two
        # statements. Decide again on a fresh snapshot.
    raise TransientFailure(
        "the inbox row kept changing under reserve",
        tenant=event.tenant,
        operation_id=event.operation_id,
    )


async def reserve_many(
    tx: Any, consumer: Consumer, batch: Sequence[tuple[Event, Delivery, str]]
) -> list[bool]:
    """Runs in the caller's transaction; never commits. ``reserve`` for a batch of
    (event, delivery, digest), each still its own decision, in one round trip for the
    common case: newly reserved operations are decided (and logged) by one statement;
    every other one (duplicate, conflict, too old) is then decided by ``reserve`` itself,
    in order, with the same results and errors as calling ``reserve`` one by one.
    """
    require_transaction(tx)
    if not batch:
        return []
    columns = list(zip(*(_row(e, d, digest) for e, d, digest in batch), strict=True))
    fresh = {
        record["n"]
        for record in await tx.fetch(
            sql.RESERVE_MANY,
            *map(list, columns),
            consumer.name,
            consumer.replay_window_s,
            PRUNE_MARGIN_S,
        )
    }
    decided: list[bool] = []
    for n, (event, delivery, digest) in enumerate(batch, start=1):
        if n in fresh:
            decided.append(True)
        else:
            decided.append(await reserve(tx, consumer, event, delivery, digest=digest))
    return decided


def _row(event: Event, delivery: Delivery, digest: str) -> tuple[Any, ...]:
    return (
        event.tenant,
        event.operation_id,
        event.event_id,
        digest,
        event.type,
        event.version,
        delivery.judged(event),
        delivery.publish_id,
        delivery.redelivered,
        delivery.delivery_count,
    )


def _check_same_meaning(
    consumer: Consumer, event: Event, digest: str, found: list[InboxRow]
) -> None:
    for stored in found:
        same_operation = stored.operation_id == event.operation_id
        if same_operation and stored.digest == digest:
            # Same operation, same meaning. A matching event id row, if any, is this row.
            continue
        raise InboxConflict(
            tenant=event.tenant,
            consumer=consumer.name,
            operation_id=event.operation_id,
            event_id=str(event.event_id),
            stored_operation_id=stored.operation_id,
            stored_event_id=str(stored.event_id),
            stored_digest=stored.digest,
            incoming_digest=digest,
        )


async def record_delivery(
    tx: Any, consumer: Consumer, event: Event, delivery: Delivery, outcome: InboxOutcome
) -> None:
    """Runs in the caller's transaction; never commits. Logs one delivery and its outcome."""
    require_transaction(tx)
    await tx.execute(
        sql.RECORD_DELIVERY,
        event.tenant,
        consumer.name,
        event.operation_id,
        event.event_id,
        delivery.publish_id,
        delivery.redelivered,
        delivery.delivery_count,
        str(outcome),
    )


async def prune(tx: Any, consumer: Consumer, *, limit: int = 1000) -> tuple[int, int]:
    """Runs in the caller's transaction; never commits. Deletes at most ``limit`` of
    ``consumer``'s rows past its replay window (plus the margin) from the inbox and from the
    delivery log; returns (inbox rows, delivery rows) deleted. Another consumer's rows are
    never touched: each keeps its own window (migration 0026).

    Callers loop, one short transaction per batch, until both counts are below ``limit``.
    """
    require_transaction(tx)
    inbox = await tx.execute(sql.PRUNE_INBOX, consumer.horizon_s, limit, consumer.name)
    deliveries = await tx.execute(sql.PRUNE_DELIVERIES, consumer.horizon_s, limit, consumer.name)
    return rows_affected(inbox), rows_affected(deliveries)


async def prune_poison(tx: Any, consumer: str, *, retention_s: float, limit: int = 1000) -> int:
    """Runs in the caller's transaction; never commits. Deletes at most ``limit`` of
    ``consumer``'s poison records older than ``retention_s`` (oldest first); returns how
    many. A poison record is evidence of a dead-lettered message: ``retention_s`` shorter
    than the consumer's declared horizon is refused (RetentionTooShort, nothing removed)."""
    require_transaction(tx)
    with retention_refusal(retention_s):
        removed: int = await tx.fetchval(sql.PRUNE_POISON, consumer, float(retention_s), limit)
    return removed


async def declare_window(conn: Any, consumer: Consumer) -> None:
    """Records ``consumer``'s replay window and prune margin in the database (its own
    statement; the last declaration of a consumer stands), so that every pruner keeps
    what a redelivery may still need: jobs.prune refuses a retention shorter than the
    longest declared horizon, consumers.prune_poison one shorter than its consumer's.
    The runtime declares at every start; code that reserves without the runtime calls it
    once before its first delivery."""
    await conn.execute(sql.DECLARE_WINDOW, consumer.name, consumer.replay_window_s, PRUNE_MARGIN_S)


async def replay_windows(conn: Any) -> list[Any]:
    """Read-only: each consumer's declared window, margin and horizon (accord status)."""
    return list(await conn.fetch(sql.REPLAY_WINDOWS))


async def delivery_counts(conn: Any, since: datetime) -> list[Any]:
    """Read-only: inbox decisions received since ``since``, by consumer, tenant and outcome
    (accord status); reads the deliveries in that window only."""
    return list(await conn.fetch(sql.DELIVERY_COUNTS, since))


async def conflict_count(conn: Any) -> int:
    """Read-only: conflicts among all retained deliveries (accord status, /metrics)."""
    return int(await conn.fetchval(sql.CONFLICT_COUNT))


async def admit_floor(conn: Any, window_s: float | None) -> datetime | None:
    """Read-only: the oldest enqueue time (``ce-time``) every consumer still admits, by the
    strictest of ``window_s`` and each consumer's declared replay window, less what a
    release needs to reach them (a tenth of the window, at least a minute), and the latest
    admit_from of a raised window (0046). An event enqueued before it would be refused as
    ``too_old``. None: no window to go by."""
    floor: datetime | None = await conn.fetchval(sql.ADMIT_FLOOR, window_s)
    return floor
