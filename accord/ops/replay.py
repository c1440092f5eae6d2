"""Projection replay: re-deliver retained events to a projection's handlers, with no authority.

Invariants:
- Handlers run under the ``accord_projection`` principal (``SET LOCAL ROLE`` in every
  transaction), which PostgreSQL lets write projection tables only. A handler's attempt to
  submit a job, begin an effect or touch the outbox fails with SQLSTATE 42501; that event's
  savepoint is rolled back, and the event is counted and recorded in ``ops.replay_refusals``
  in the same transaction: never silently dropped. Before committing a batch, replay checks
  the transaction still runs as the principal (a handler cannot quietly ``RESET ROLE``).
  This guards against mistakes, not against hostile code running in the same process.
- What the live consumer poisons, replay records and passes (0064): a handler's statement
  that PostgreSQL refuses for the event's content (SQLSTATE class 22 or 23, as
  ``consumers.verdicts`` judges it) and an event that no longer decodes with the catalog are
  recorded in ``ops.replay_refusals`` with the consumer's poison reason, and the run goes on:
  a rebuild ends with every other event applied, never stopped part way for good at an event
  it would stop at again. Class 42 (a missing table or column, a syntax error) is the
  handler's or the schema's defect, whatever the event: ReplayHandlerFailed. A rebuild whose
  first batch applied none of its events is refused (RebuildIncomplete) before its reset
  commits: a defect refusing every event would otherwise leave an empty projection. A
  deadlock, a lock or statement timeout, a database taking no writes or out of resources is
  tried again on the event's savepoint (TRIES in all), then ReplayInterrupted (run it again
  later).
- Events come from ``relay.outbox`` (published rows are kept for ``relay_retention_s``; pending
  ones are read too, held ones not), read in one REPEATABLE READ snapshot through a cursor, in
  outbox order. A ``since`` older than the retention window, or at or before the latest event
  the relay pruned (``relay.pruned``: the relay's retention may be shorter than this
  process's), is refused: the replay could not be complete.
- A rebuild runs beside the projection's live consumer: it takes the projection's rebuild
  guard (``sql.REBUILD_GUARD``) before its snapshot and holds it until its reset commits with
  the first batch. Each of the consumer's transactions takes the guard shared, so it commits
  either before the snapshot (its event is read, as its outbox row committed before it was
  published) or after the reset (its rows stay): none is emptied and not applied again.
- Replay never writes the inbox and never acks anything: it only rebuilds read models.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import asyncpg

from accord.consumers.errors import DataException, IntegrityViolation
from accord.consumers.verdicts import database_refusal
from accord.ops import sql
from accord.ops.errors import (
    InvalidSince,
    ProjectionPrincipalLost,
    RebuildIncomplete,
    ReplayHandlerFailed,
    ReplayInterrupted,
    ReplayWindowExceeded,
)
from accord.ops.projections import Projection
from accord.schemas import wire
from accord.schemas.db import DB_CONNECTION_LOST
from accord.schemas.errors import (
    EventError,
    InvalidEvent,
    MalformedMessage,
    ServiceUnavailable,
    UnknownEventType,
)
from accord.schemas.events import Catalog, Event, versioned_type
from accord.schemas.settings import MAX_DURATION_S

PRINCIPAL = "accord_projection"
REFUSED = "insufficient_privilege"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_UNDECODABLE = (MalformedMessage, UnknownEventType, InvalidEvent)
#: What a handler's statement may meet that says nothing of the event (a deadlock or a
#: serialization failure, a lock or statement timeout): its savepoint is tried again, TRIES
#: times in all, RETRY_DELAY_S apart and more each time.
_TRANSIENT = (
    asyncpg.TransactionRollbackError,
    asyncpg.LockNotAvailableError,
    asyncpg.QueryCanceledError,
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.InsufficientResourcesError,
)
#: The content refusals a replay records and passes (the live consumer poisons them too);
#: class 42 (StatementRefused) is a handler's or a schema's defect here.
_CONTENT = (DataException, IntegrityViolation)
TRIES = 3
RETRY_DELAY_S = 0.1
#: Every reason a refusal is recorded with (ops.replay_refusals_reason_check mirrors it).
REASONS = frozenset(
    {
        REFUSED,
        *(kind.reason for kind in _CONTENT),
        *(kind.reason for kind in _UNDECODABLE),
    }
)


def parse_since(text: str) -> datetime | float:
    """An aware timestamp (ISO 8601; naive means UTC) or a duration in seconds (``1h30m``)."""
    text = text.strip()
    if text and _DURATION.sub("", text) == "":
        seconds = float(sum(float(n) * _UNIT_S[u] for n, u in _DURATION.findall(text)))
        if not seconds <= MAX_DURATION_S:  # the database's timestamps end before that
            raise InvalidSince(since=text, longest_s=MAX_DURATION_S)
        return seconds
    try:
        stamp = datetime.fromisoformat(text)
        stamp = stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
        stamp.astimezone(UTC)  # 0001-01-01T00:30+01:00 is before year 1 in UTC
    except (ValueError, OverflowError):
        raise InvalidSince(since=text) from None
    return stamp


@dataclass(frozen=True, slots=True)
class Refusal:
    """One event not applied (identifiers only): its handler reached past the principal
    (``insufficient_privilege``), PostgreSQL refused its statement for the event's content
    (the live consumer's poison reason), or it no longer decodes (``sqlstate`` None)."""

    outbox_id: int
    tenant: str
    operation_id: str
    event_id: uuid.UUID
    event_type: str
    sqlstate: str | None
    message: str
    reason: str = REFUSED


@dataclass(slots=True)
class ReplaySummary:
    """What one replay run did."""

    run_id: int
    workflow: str
    since: datetime
    events: int = 0
    applied: int = 0
    refused: int = 0  # refusals of the handlers' statements (``refusals``)
    skipped: int = 0  # rows that no longer decode with this catalog (live: poison; recorded)
    refusals: list[Refusal] = field(default_factory=list)  # both, in outbox order


def _decode(record: Mapping[str, Any], catalog: Catalog) -> Event:
    event = Event(
        tenant=record["tenant"],
        operation_id=record["operation_id"],
        type=record["type"],
        version=record["version"],
        authority_epoch=record["authority_epoch"],
        payload=wire.parse_body(bytes(record["body"])),
        event_id=record["event_id"],
        occurred_at=record["occurred_at"],
    )
    catalog.validate(event, producing=False)
    return event


#: Rows one batch of the ledger's retention removes at most (refusals, then runs).
PRUNE_BATCH = 1000


async def prune_ledger(
    conn: Any, *, retention_s: float, batch: int = PRUNE_BATCH
) -> tuple[int, int]:
    """The replay ledger older than ``retention_s`` (0041): the refusals of runs that ended
    (or, never ended, began) before it, then those runs, batch after batch, each batch a
    transaction of its own, until one comes back short. The refusal totals that
    accord_replay_refusals_total reads are kept apart and stay. Returns (runs, refusals)."""
    runs = refusals = 0
    while True:
        row = await conn.fetchrow(sql.PRUNE_REPLAY, retention_s, batch)
        runs, refusals = runs + row["runs"], refusals + row["refusals"]
        if row["runs"] < batch and row["refusals"] < batch:
            return runs, refusals


async def resolve_since(conn: Any, since: datetime | float) -> datetime:
    """A duration becomes a timestamp by the database clock."""
    if isinstance(since, datetime):
        return since
    stamp: datetime = await conn.fetchval(sql.AGO, since)
    return stamp


async def replay(
    reader: Any,
    writer: Any,
    projection: Projection,
    *,
    since: datetime | float,
    catalog: Catalog,
    retention_s: float,
    rebuild: bool = False,
    batch: int = 200,
) -> ReplaySummary:
    """Owns its transactions (a runner): reads on ``reader`` in one snapshot, applies batches on
    ``writer`` under the projection principal. ``rebuild`` empties the projection in the first
    batch's transaction, under the projection's rebuild guard (the live consumer waits for
    that transaction); it needs every event that made a row (RebuildIncomplete otherwise:
    the relay pruned events, or ``since`` is later than the oldest retained one). Raises
    ReplayWindowExceeded if ``since`` predates the retention window (``since`` in seconds: that
    long before the snapshot's clock, read with the window's start); ProjectionPrincipalLost
    (batch rolled back) if a handler left the principal."""
    pending: list[Mapping[str, Any]] = []
    # The run held (HOLD_RUN) until it finished or failed: released last, after the
    # batches' transactions ended (in an aborted one it could not be).
    async with contextlib.AsyncExitStack() as running:
        reset = rebuild
        # A rebuild's first batch (the reset with it) commits in the transaction that took the
        # guard before the snapshot (closing the stack commits it; an error rolls it back).
        async with contextlib.AsyncExitStack() as guard:
            if rebuild:
                await guard.enter_async_context(writer.transaction())
                await writer.execute(sql.REBUILD_GUARD, projection.workflow)
            async with reader.transaction(isolation="repeatable_read", readonly=True):
                # The window is judged in the snapshot the events are read from: a prune committed
                # between the check and the read cannot take an event the check promised.
                ago = None if isinstance(since, datetime) else float(since)
                window = await reader.fetchrow(sql.WINDOW, retention_s, ago)
                retained_from: datetime = window["retained_from"]
                start: datetime = since if isinstance(since, datetime) else window["since"]
                if start < retained_from:
                    raise ReplayWindowExceeded(
                        since=start.isoformat(), retained_from=retained_from.isoformat()
                    )
                # What the relay did prune, whatever retention this process was given.
                pruned: datetime | None = await reader.fetchval(sql.PRUNED_THROUGH)
                if pruned is not None and start <= pruned:
                    raise ReplayWindowExceeded(
                        since=start.isoformat(), pruned_through=pruned.isoformat()
                    )
                if rebuild:
                    await _require_every_event(reader, projection, start, pruned)
                run_id: int = await writer.fetchval(sql.START_RUN, projection.workflow, start)
                await writer.execute(sql.HOLD_RUN, run_id)  # kept from another replay's prune
                running.push_async_callback(_release_run, writer, run_id)
                summary = ReplaySummary(run_id=run_id, workflow=projection.workflow, since=start)
                async for record in reader.cursor(
                    sql.RETAINED_EVENTS,
                    start,
                    projection.event_types,
                    projection.tenant_filter,
                    prefetch=batch,
                ):
                    pending.append(record)
                    if len(pending) >= batch:
                        await _apply(writer, projection, catalog, pending, summary, reset=reset)
                        pending, reset = [], False
                        await guard.aclose()
            if pending or reset:
                await _apply(writer, projection, catalog, pending, summary, reset=reset)
        await writer.execute(
            sql.FINISH_RUN,
            run_id,
            summary.events,
            summary.applied,
            summary.refused,
            summary.skipped,
        )
    return summary


async def _release_run(writer: Any, run_id: int) -> None:
    with contextlib.suppress(*DB_CONNECTION_LOST, asyncpg.PostgresError):
        await writer.execute(sql.RELEASE_RUN, run_id)  # a lost connection released it


async def _require_every_event(
    reader: Any, projection: Projection, since: datetime, pruned: datetime | None
) -> None:
    """A rebuild's reset empties the whole projection: refuse it (RebuildIncomplete) unless
    the events it applies again are every event that made a row, read in the same snapshot
    (taken under the rebuild guard)."""
    if pruned is not None:
        raise RebuildIncomplete(
            "the relay has pruned published events: the rows they made would not come back",
            pruned_through=pruned.isoformat(),
        )
    if projection.tenant_filter:
        # The reset empties every tenant's rows (its statements know no tenant): a rebuild
        # of some tenants would leave the others' rows gone, and their live consumer would
        # not make them again (its inbox holds those events as applied).
        others = await reader.fetch(
            sql.OTHER_TENANTS, projection.event_types, projection.tenant_filter
        )
        if others:
            raise RebuildIncomplete(
                "the reset empties every tenant's rows and only the given tenants' events"
                " would be applied again: rebuild with every tenant (--tenant '*'), or"
                " replay these tenants without --rebuild (on top of the projection)",
                tenants=projection.tenant_filter,
                other_tenants=[r["tenant"] for r in others],
            )
    oldest = await reader.fetchval(
        sql.OLDEST_RETAINED, projection.event_types, projection.tenant_filter
    )
    if oldest is not None and oldest < since:
        raise RebuildIncomplete(
            "--since is later than the oldest retained event of the projection's types",
            since=since.isoformat(),
            oldest=oldest.isoformat(),
        )


async def _apply(
    writer: Any,
    projection: Projection,
    catalog: Catalog,
    records: list[Mapping[str, Any]],
    summary: ReplaySummary,
    *,
    reset: bool,
) -> None:
    """One transaction: the principal, each event under its own savepoint, the principal
    check, then (as the owner again) the refusal records; all commit together."""
    refusals: list[Refusal] = []
    applied = skipped = 0
    # a rebuild's first batch commits with its run: rolled back together
    run_id = None if reset else summary.run_id
    async with writer.transaction():
        await writer.execute(sql.SET_PROJECTION_ROLE)
        if reset:
            await projection.reset(writer)
        for record in records:
            try:
                event = _decode(record, catalog)
            except _UNDECODABLE as exc:
                refusals.append(_undecodable(record, exc))
                skipped += 1
                continue
            refused = await _apply_one(writer, projection, record, event, run_id)
            if refused is None:
                applied += 1
            else:
                refusals.append(refused)
        if reset and records and applied == 0:
            # Rolled back with the reset: nothing of the projection changed.
            first = refusals[0]
            raise RebuildIncomplete(
                "the rebuild's first batch applied none of its events: a handler or schema"
                " defect refusing every event would leave the projection empty; nothing"
                " changed (the events and why each was refused: a replay without --rebuild)",
                refused=len(refusals),
                first_reason=first.reason,
                first_sqlstate=first.sqlstate,
                first_outbox_id=first.outbox_id,
            )
        role = await writer.fetchval(sql.CURRENT_ROLE)
        if role != PRINCIPAL:
            raise ProjectionPrincipalLost(workflow=projection.workflow, role=role)
        await writer.execute(sql.LEAVE_PROJECTION_ROLE)
        for refusal in refusals:
            await writer.execute(
                sql.RECORD_REFUSAL, summary.run_id, projection.workflow, refusal.tenant,
                refusal.operation_id, refusal.event_id, refusal.event_type, refusal.outbox_id,
                refusal.reason, refusal.sqlstate, refusal.message,
            )  # fmt: skip
    summary.events += len(records)
    summary.applied += applied
    summary.skipped += skipped
    summary.refused += len(refusals) - skipped
    summary.refusals.extend(refusals)


async def _apply_one(
    writer: Any,
    projection: Projection,
    record: Mapping[str, Any],
    event: Event,
    run_id: int | None,
) -> Refusal | None:
    """``event``'s handler under a savepoint of its own: None once applied, or the Refusal
    to record (its savepoint rolled back). Raises ReplayInterrupted when a deadlock or a
    timeout is met TRIES times, ReplayHandlerFailed for the handler's own error."""
    handler = projection.handlers.get(event)
    for attempt in range(1, TRIES + 1):
        try:
            async with writer.transaction():
                await handler(writer, event)
        except asyncpg.InsufficientPrivilegeError as exc:
            return _refusal(record, event, REFUSED, exc.sqlstate, str(exc))
        except DB_CONNECTION_LOST:
            raise  # the connection's, not the handler's
        except _TRANSIENT as exc:
            if attempt < TRIES:
                await anyio.sleep(RETRY_DELAY_S * attempt)
                continue
            busy = ServiceUnavailable(service="postgresql", error=type(exc).__name__)
            busy.__cause__ = exc
            raise ReplayInterrupted(
                workflow=projection.workflow, run_id=run_id, outbox_id=record["id"],
                tenant=event.tenant, operation_id=event.operation_id,
                error=type(exc).__name__, sqlstate=exc.sqlstate, tries=TRIES,
            ) from busy  # fmt: skip
        except Exception as exc:
            refused = database_refusal(exc)
            if isinstance(refused, _CONTENT):  # names of constraint, table, column; no values
                sqlstate = str(refused.fields.get("sqlstate"))
                return _refusal(record, event, refused.reason, sqlstate, str(refused))
            raise ReplayHandlerFailed(
                workflow=projection.workflow,
                run_id=run_id,
                outbox_id=record["id"],
                tenant=event.tenant,
                operation_id=event.operation_id,
                error=type(exc).__name__,
                sqlstate=getattr(exc, "sqlstate", None),
            ) from exc
        return None
    raise AssertionError("unreachable: the last try returns or raises")


def _refusal(
    record: Mapping[str, Any], event: Event, reason: str, sqlstate: str, message: str
) -> Refusal:
    return Refusal(
        outbox_id=record["id"],
        tenant=event.tenant,
        operation_id=event.operation_id,
        event_id=event.event_id,
        event_type=event.ce_type,
        sqlstate=str(sqlstate),
        message=message,
        reason=reason,
    )


def _undecodable(record: Mapping[str, Any], exc: EventError) -> Refusal:
    """A row that no longer decodes with the catalog: recorded by what the outbox row says
    (its type and version as stored), the error's type only (its text may quote the body)."""
    return Refusal(
        outbox_id=record["id"],
        tenant=record["tenant"],
        operation_id=record["operation_id"],
        event_id=record["event_id"],
        event_type=versioned_type(record["type"], record["version"]),
        sqlstate=None,
        message=type(exc).__name__,
        reason=exc.reason,
    )
