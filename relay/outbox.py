"""The outbox: enqueue in the producer's transaction, and the relay's claim/settle/prune.

Invariant: a row is ``published`` only after the broker confirmed a publish of it, and
only by the relay that holds its lease token; every other outcome (nack, return,
timeout, lost connection, a relay that died) leaves it ``pending`` and eligible again,
or ``held`` for a permanent failure. Rows are never deleted before they are published, but
for a held row a person discards (``discard_held``, audited).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from accord.relay import sql
from accord.relay.errors import (
    DiscardRefused,
    DuplicateEvent,
    JoinedStatementInvalid,
    ReleaseRefused,
)
from accord.schemas import telemetry
from accord.schemas.db import DB_CONNECTION_LOST, Tx, require_transaction, rows_affected
from accord.schemas.errors import ConfigError, PayloadTooLarge
from accord.schemas.events import DEFAULT_MAX_PAYLOAD_BYTES, Catalog, Event
from accord.schemas.settings import duration_ok
from accord.schemas.statement import split_with


class OutboxState(StrEnum):
    """Mirrors ``outbox_state_check``."""

    PENDING = "pending"
    PUBLISHED = "published"
    HELD = "held"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A claimed row: everything the relay needs to publish it, byte for byte."""

    id: int
    event: Event
    digest: str
    body: bytes
    trace: dict[str, str]
    attempts: int
    #: The broker's returns of this row's publish in a row, before this attempt (0048).
    returns: int = 0
    #: When the row was written (the producer's database clock): the message's ``ce-time``,
    #: by which consumers judge their replay window (DESIGN §3), whatever ``occurred_at`` says.
    enqueued_at: datetime | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> OutboxRow:
        # model_construct: the row was validated by enqueue; the body is the payload.
        event = Event.model_construct(
            tenant=record["tenant"],
            operation_id=record["operation_id"],
            type=record["type"],
            version=record["version"],
            authority_epoch=record["authority_epoch"],
            payload={},
            event_id=record["event_id"],
            occurred_at=record["occurred_at"],
        )
        trace = json.loads(record["trace"]) if record["trace"] else {}
        return cls(
            id=record["id"],
            event=event,
            digest=record["digest"],
            body=bytes(record["body"]),
            trace=trace,
            attempts=record["attempts"],
            returns=record["returns"],
            enqueued_at=record["enqueued_at"],
        )


@dataclass(frozen=True, slots=True)
class Settlement:
    """The outcome of one claimed row: its next state and why."""

    id: int
    state: OutboxState
    reason: str | None = None
    publish_id: uuid.UUID | None = None
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class OutboxStats:
    pending: int
    published: int
    held: int
    oldest_pending_s: float


# A proxy tracer: it follows whichever provider is installed later (OpenTelemetry's
# module-level pattern), so enqueue does not look the tracer up on every call.
_TRACER = telemetry.tracer()


@dataclass(frozen=True, slots=True)
class Prepared:
    """An event validated, encoded and digested by ``prepare``, before its transaction:
    ``enqueue`` and ``enqueue_joined`` then do only the trace context and the statement
    between the transaction's awaits, while its row locks are held."""

    event: Event
    body: bytes
    digest: str
    catalog: Catalog = field(repr=False)
    # Set by ``prepare`` alone: one built by hand, or a copy with a field replaced
    # (``dataclasses.replace``), is not trusted for its body and digest and is prepared
    # again from its event at enqueue.
    issued: bool = field(default=False, init=False, repr=False, compare=False)


def prepare(
    event: Event, *, catalog: Catalog, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> Prepared:
    """Validate, encode and digest ``event`` now, outside any transaction (no I/O). Raises
    what ``enqueue`` raises before writing: UnknownEventType, InvalidEvent, TenantConflict,
    PayloadTooLarge. The result may be enqueued once (its event id is its identity: a second
    enqueue of it is a DuplicateEvent); enqueued under another catalog, it is prepared again
    by that one."""
    body, digest = catalog.prepare(event, max_payload_bytes)
    prepared = Prepared(event, body, digest, catalog)
    object.__setattr__(prepared, "issued", True)  # frozen: only here
    return prepared


def _ready(event: Event | Prepared, catalog: Catalog, max_payload_bytes: int) -> Prepared:
    """``event`` prepared by ``catalog`` within ``max_payload_bytes``: as given when
    ``prepare`` made it with this catalog (its size checked again against this limit), else
    prepared now (a hand-built Prepared's body and digest are never written as given)."""
    if isinstance(event, Prepared):
        if event.catalog is not catalog or not event.issued:
            return prepare(event.event, catalog=catalog, max_payload_bytes=max_payload_bytes)
        if len(event.body) > max_payload_bytes:
            raise PayloadTooLarge(
                event_type=event.event.ce_type, size=len(event.body), limit=max_payload_bytes
            )
        return event
    return prepare(event, catalog=catalog, max_payload_bytes=max_payload_bytes)


async def enqueue(
    tx: Tx,
    event: Event | Prepared,
    *,
    catalog: Catalog,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> int:
    """Runs in the caller's transaction; never commits. Returns the outbox row id.

    Raises NotInTransaction without an open transaction; UnknownEventType, InvalidEvent
    (NUL, NaN, schema) or PayloadTooLarge before anything is written; DuplicateEvent if
    this (tenant, event id) is already enqueued (the caller's transaction is then
    aborted, as after any failed statement). One statement, one round trip. ``event`` may
    be ``prepare``'s result: the validation, encoding and digest then happened before the
    transaction.
    """
    require_transaction(tx)
    ready = _ready(event, catalog, max_payload_bytes)
    with _creating(ready.event):
        carrier = telemetry.current_context_headers()
        try:
            row_id: int = await tx.fetchval(sql.ENQUEUE, *_args(ready, carrier))
        except asyncpg.UniqueViolationError as exc:
            _raise_duplicate(ready.event, exc)
            raise
    return row_id


@dataclass(frozen=True, slots=True)
class Joined:
    """What the joined enqueue's domain statement returned, and the outbox row it wrote (None
    when the statement affected no row: then no event was enqueued either)."""

    rows: list[dict[str, Any]]
    outbox_id: int | None


async def enqueue_joined(
    tx: Tx,
    statement: str,
    *args: Any,
    event: Event | Prepared,
    catalog: Catalog,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Joined:
    """Runs in the caller's transaction; never commits. The domain ``statement`` (an
    ``INSERT``, ``UPDATE`` or ``DELETE ... RETURNING ...`` with parameters ``$1``..``$n`` =
    ``args``) and the outbox row of ``event`` in ONE statement (a data-modifying CTE, one
    round trip): the outbox row is written only when the domain statement affected a row,
    one row for the statement however many rows it affected. Returns what the domain
    statement returned and the outbox row id; check ``rows`` as real code must check an
    affected-row count. Raises what ``enqueue`` raises, before anything is written, and
    JoinedStatementInvalid, with the caller's transaction still usable, for a statement that
    cannot be joined (see ``_joined``). ``event`` may be ``prepare``'s result."""
    require_transaction(tx)
    ready = _ready(event, catalog, max_payload_bytes)
    joined = await _joined(tx, statement, len(args))
    with _creating(ready.event):
        carrier = telemetry.current_context_headers()
        try:
            records = await tx.fetch(joined, *args, *_args(ready, carrier))
        except asyncpg.UniqueViolationError as exc:
            _raise_duplicate(ready.event, exc)
            raise
    rows = [dict(r) for r in records]
    outbox_id = rows[0].pop(sql.JOINED_OUTBOX_ID) if rows else None
    for row in rows[1:]:
        row.pop(sql.JOINED_OUTBOX_ID)
    return Joined(rows, outbox_id)


# INSERT, UPDATE or DELETE as the first word, after any whitespace and comments.
_DML = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*(?:insert|update|delete)\b", re.I | re.S)
# Joined statements already checked, by (domain statement, number of its arguments): an
# application has a handful; checking and composing each time would cost round trips.
_JOINED: dict[tuple[str, int], str] = {}
_JOINED_MAX = 256
_CHECK = "accord_joined_check"


async def _joined(tx: Tx, statement: str, n: int) -> str:
    """The joined statement for a domain statement, checked once per process and statement
    text. A statement with its own WITH list has that list put first in the joined one (a
    data-modifying CTE may stand only at the top level; schemas.statement finds where the list
    ends). Refused with JoinedStatementInvalid (never cached), the caller's transaction
    still usable: a statement other than INSERT, UPDATE or DELETE after any WITH list (a
    SELECT would enqueue with no write); a statement PostgreSQL refuses alone; one whose
    parameters are not exactly ``$1``..``$n`` (the outbox's follow as ``$n+1``.., so a
    domain ``$k`` past the arguments would silently take an outbox value); no RETURNING; a
    returned column named like the outbox id; a statement that does not compose (a
    trailing ``;``, a CTE named like the joined statement's own). PostgreSQL judges by
    preparing the statement alone, then the joined one, each inside a savepoint."""
    composed = _JOINED.get((statement, n))
    if composed is not None:
        return composed
    standard = await tx.fetchval("SELECT current_setting('standard_conforming_strings')")
    ctes, main = split_with(statement, standard_strings=standard == "on")
    if not _DML.match(main):
        raise JoinedStatementInvalid(
            detail="the statement must be an INSERT, UPDATE or DELETE (after its WITH list, if"
            " it has one)"
        )
    domain = await _prepare_or_refuse(tx, statement, "the statement")
    params, columns = len(domain.get_parameters()), [name for name, _ in _shape(domain)]
    if params != n:
        raise JoinedStatementInvalid(
            detail=f"the statement takes {params} parameters ($1..${params}); {n} were given"
        )
    if not columns:
        raise JoinedStatementInvalid(detail="the statement has no RETURNING clause")
    if sql.JOINED_OUTBOX_ID in columns:
        raise JoinedStatementInvalid(detail=f"a returned column is named {sql.JOINED_OUTBOX_ID}")
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:  # the rows come back as dicts: one of the two values would be lost
        raise JoinedStatementInvalid(
            detail=f"returned columns share a name ({', '.join(twice)}): give each its own (AS)"
        )
    composed = sql.enqueue_joined(main, n, ctes)
    joined = await _prepare_or_refuse(tx, composed, "it joined to the outbox row (a trailing ';'?)")
    if (
        _shape(joined)[:-1] != _shape(domain)
        or len(joined.get_parameters()) != n + sql.OUTBOX_PARAMS
    ):
        # Read wrong where its WITH list ends: the joined statement would not be this one.
        raise JoinedStatementInvalid(detail="its WITH list could not be told from the rest")
    if len(_JOINED) >= _JOINED_MAX:
        _JOINED.pop(next(iter(_JOINED)))
    _JOINED[(statement, n)] = composed
    return composed


def _shape(prepared: Any) -> list[tuple[str, int]]:
    """What a prepared statement returns: each column's name and type."""
    return [(a.name, a.type.oid) for a in prepared.get_attributes()]


async def _prepare_or_refuse(tx: Tx, query: str, what: str) -> Any:
    """Prepares ``query`` in a savepoint: a refusal rolls back to it and raises
    JoinedStatementInvalid with PostgreSQL's words (``what`` names the query); a lost
    connection propagates."""
    await tx.execute(f"SAVEPOINT {_CHECK}")
    try:
        prepared = await tx.prepare(query)
    except DB_CONNECTION_LOST:
        raise
    except asyncpg.PostgresError as exc:
        await tx.execute(f"ROLLBACK TO SAVEPOINT {_CHECK}")
        await tx.execute(f"RELEASE SAVEPOINT {_CHECK}")
        raise JoinedStatementInvalid(detail=f"PostgreSQL refused {what}: {exc}") from exc
    await tx.execute(f"RELEASE SAVEPOINT {_CHECK}")
    return prepared


def _args(ready: Prepared, carrier: dict[str, str]) -> tuple[Any, ...]:
    """The outbox parameters of a prepared event with the trace context ``carrier``."""
    trace_json = json.dumps(carrier) if carrier else None
    return enqueue_args(ready.event, ready.digest, ready.body, trace_json)


def _creating(event: Event) -> AbstractContextManager[Any]:
    """The ``create`` span, current around the outbox write, while this process traces.
    Without a tracer provider every span is a no-op whose context is its parent's, so the
    row's trace context (the current context's headers) is the same without building one:
    that is about a fifth of an enqueue's Python (docs/bench-log.md)."""
    if not telemetry.tracing_on():
        return contextlib.nullcontext()
    return trace.use_span(_create_span(event), end_on_exit=True)


def _create_span(event: Event) -> trace.Span:
    """The ``create`` span around the outbox write (its context is stored with the row).
    start_span + use_span is start_as_current_span without its two extra generator-based
    context managers (cheaper per enqueue: docs/bench-log.md)."""
    return _TRACER.start_span(
        f"create {event.ce_type}",
        kind=SpanKind.PRODUCER,
        attributes={
            telemetry.ATTR_SYSTEM: telemetry.SYSTEM,
            telemetry.ATTR_OPERATION_TYPE: "create",
            telemetry.ATTR_OPERATION_NAME: "create",
            telemetry.ATTR_MESSAGE_ID: str(event.event_id),
            telemetry.ATTR_ROUTING_KEY: event.ce_type,
            telemetry.ATTR_TENANT: event.tenant,
            telemetry.ATTR_OPERATION_ID: event.operation_id,
        },
    )


def _raise_duplicate(event: Event, exc: asyncpg.UniqueViolationError) -> None:
    """DuplicateEvent when the unique violation is the outbox's own (tenant, event id)."""
    if (exc.schema_name, exc.table_name, exc.constraint_name) == (
        "relay",
        "outbox",
        "outbox_event_unique",
    ):
        raise DuplicateEvent(tenant=event.tenant, event_id=str(event.event_id)) from exc


def enqueue_args(event: Event, digest: str, body: bytes, trace_json: str | None) -> tuple[Any, ...]:
    """The parameters of ``sql.ENQUEUE`` for ``event``, in order (the body already encoded,
    the digest already computed, the trace context as JSON)."""
    return (
        event.event_id,
        event.tenant,
        event.operation_id,
        event.type,
        event.version,
        event.authority_epoch,
        digest,
        body,
        trace_json,
        event.occurred_at,
    )


async def claim(tx: Tx, token: uuid.UUID, limit: int, lease_s: float) -> list[OutboxRow]:
    """One statement (its own transaction, or the caller's): leases up to ``limit`` eligible
    rows. The relay runs it alone: a BEGIN and a COMMIT around it would be two round trips
    that add nothing to a statement that is atomic by itself."""
    records = await tx.fetch(sql.CLAIM, limit, token, lease_s)
    return sorted((OutboxRow.from_record(r) for r in records), key=lambda row: row.id)


async def settle(tx: Tx, token: uuid.UUID, outcomes: Sequence[Settlement]) -> int:
    """One statement (its own transaction, or the caller's): applies outcomes guarded by
    ``token``; returns the rows settled."""
    if not outcomes:
        return 0
    status: str = await tx.execute(
        sql.SETTLE,
        token,
        [o.id for o in outcomes],
        [str(o.state) for o in outcomes],
        [o.reason for o in outcomes],
        [o.publish_id for o in outcomes],
        [o.delay_s for o in outcomes],
    )
    return rows_affected(status)


async def prune(tx: Tx, retention_s: float, limit: int) -> int:
    """Runs in the caller's transaction. Deletes one bounded batch of old published rows.
    ConfigError for a retention that is not 0 to 100 years (a negative one removed rows
    published a moment ago)."""
    require_transaction(tx)
    if not duration_ok(retention_s):
        raise ConfigError("the outbox retention must be seconds >= 0, at most 100 years")
    removed: int = await tx.fetchval(sql.PRUNE, retention_s, limit)
    return removed


async def prune_release_audit(tx: Tx, retention_s: float, limit: int) -> int:
    """Runs in the caller's transaction; never commits. Deletes one bounded batch of release
    audit rows older than ``retention_s`` whose outbox row is published or gone (a row still
    pending or held keeps its history); returns how many. Held rows themselves are never
    pruned: ``prune`` takes published rows only."""
    require_transaction(tx)
    removed: int = await tx.fetchval(sql.PRUNE_RELEASE_AUDIT, float(retention_s), limit)
    return removed


async def release_held(
    tx: Tx,
    tenant: str,
    event_ids: Sequence[uuid.UUID],
    *,
    who: str,
    evidence: str,
    admit_from: datetime | None = None,
) -> list[Released]:
    """Runs in the caller's transaction; never commits. Makes the held rows of ``tenant``
    with ``event_ids`` pending (publishable) again and writes one ``relay.release_audit`` row
    per row released, in the same transaction (the SQL function relay.release_held does
    both; the repair principal may run it). All or nothing: raises ReleaseRefused (naming
    each id that is missing or not held, ``refused``, or ``principal_required`` without a
    ``who`` and an ``evidence``) and changes nothing. Attempts stay as they were (history).

    ``admit_from``: the oldest enqueue time the consumers still admit
    (``consumers.inbox.admit_floor``). A row enqueued before it is refused too
    (``past_replay_window``, 0056): its ``ce-time`` is its enqueue time, and a consumer would
    refuse it as ``too_old`` at its first delivery. None: not checked."""
    records, refused = await _repair_held(
        tx, ReleaseRefused, "release", sql.RELEASE_HELD_AUDITED, tenant, event_ids, who,
        evidence, admit_from,
    )  # fmt: skip
    if "past_replay_window" in refused.values():
        raise ReleaseRefused(
            "not released (nothing changed): a row was enqueued before admit_from, the oldest"
            " enqueue time the consumers still admit (the strictest replay window less a"
            " margin for the publish: ACCORD_INBOX_REPLAY_WINDOW_S and each consumer's, in"
            " accord status); published, it would be refused as too_old. It stays held;"
            " enqueue its content again as a new event with the same operation id (a"
            " consumer still holding the operation takes that for a duplicate; one that"
            " applied it more than its window ago takes it as new, and a job it submits"
            " meets the job's operation key), then discard the held row (`accord relay"
            " discard-held`)",
            tenant=tenant,
            refused=refused,
            admit_from=admit_from.isoformat() if admit_from is not None else None,
        )
    if refused:
        raise ReleaseRefused(
            "not released: every named row must be held (nothing changed)",
            tenant=tenant,
            refused=refused,
        )
    return [Released(r["outbox_id"], r["event_id"], r["audit_id"]) for r in records]


async def discard_held(
    tx: Tx, tenant: str, event_ids: Sequence[uuid.UUID], *, who: str, evidence: str
) -> list[Released]:
    """Runs in the caller's transaction; never commits. Removes the held rows of ``tenant``
    with ``event_ids`` for good (their body is not kept) and writes one
    ``relay.release_audit`` row each (action ``discard``), in the same transaction (the SQL
    function relay.discard_held; the repair principal may run it): for a row that will never
    be published (a body over the broker's limit, a type nothing binds, a row past the
    consumers' replay window whose content was enqueued again). All or nothing: raises
    DiscardRefused (naming each id that is missing or not held, or ``principal_required``)
    and changes nothing. A row that is not held is never removed."""
    records, refused = await _repair_held(
        tx, DiscardRefused, "discard", sql.DISCARD_HELD, tenant, event_ids, who, evidence
    )
    if refused:
        raise DiscardRefused(
            "not discarded: every named row must be held (nothing changed; not_held: pending,"
            " the relay will publish it, or published already; missing: no such event of"
            " this tenant, or discarded or pruned already)",
            tenant=tenant,
            refused=refused,
        )
    return [Released(r["outbox_id"], r["event_id"], r["audit_id"]) for r in records]


async def _repair_held(
    tx: Tx,
    refusal: type[ReleaseRefused | DiscardRefused],
    verb: str,
    statement: str,
    tenant: str,
    event_ids: Sequence[uuid.UUID],
    who: str,
    evidence: str,
    *more: Any,
) -> tuple[list[asyncpg.Record], dict[str, str]]:
    """A release's or a discard's call of its SQL function: its rows, and each refused id's
    status. Raises ``refusal`` for no id at all and for a missing principal."""
    require_transaction(tx)
    ids = list(dict.fromkeys(event_ids))
    if not ids:
        raise refusal("name at least one held event id", tenant=tenant)
    records = await tx.fetch(statement, tenant, ids, who, evidence, *more)
    refused = {str(r["event_id"]): r["status"] for r in records if r["status"] is not None}
    if any(status == "principal_required" for status in refused.values()):
        raise refusal(f"a {verb} needs --who and --evidence", missing="principal")
    return list(records), refused


async def stats(conn: asyncpg.Connection) -> OutboxStats:
    """Read-only: counts by state and the relay lag (oldest pending age)."""
    record = await conn.fetchrow(sql.STATS)
    return OutboxStats(
        pending=record["pending"],
        published=record["published"],
        held=record["held"],
        oldest_pending_s=record["oldest_pending_s"],
    )


async def figures(conn: asyncpg.Connection) -> asyncpg.Record:
    """Read-only: pending and held rows, the relay lag and pending attempts (accord status)."""
    return await conn.fetchrow(sql.FIGURES)


async def held_by_reason(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Read-only: held rows by typed reason, with the oldest one's age."""
    return list(await conn.fetch(sql.HELD_BY_REASON))


# -- held rows and their releases, for operators (read-only) --------------------------------


@dataclass(frozen=True, slots=True)
class Released:
    """A held row made publishable again (``release_held``) or removed for good
    (``discard_held``), and its audit row."""

    outbox_id: int
    event_id: uuid.UUID
    audit_id: int


@dataclass(frozen=True, slots=True)
class HeldRow:
    """A held outbox row: identifiers, type, why it is held and its attempts (no body)."""

    outbox_id: int
    tenant: str
    event_id: uuid.UUID
    operation_id: str
    type: str
    version: int
    reason: str | None
    attempts: int
    enqueued_at: datetime

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> HeldRow:
        return cls(
            r["id"], r["tenant"], r["event_id"], r["operation_id"], r["type"], r["version"],
            r["last_reason"], r["attempts"], r["enqueued_at"],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReleaseAudit:
    """One ``relay.release_audit`` row."""

    audit_id: int
    at: datetime
    tenant: str
    event_id: uuid.UUID
    outbox_id: int
    held_reason: str | None
    attempts: int
    who: str
    db_user: str
    db_role: str
    evidence: str
    #: ``release`` (made publishable again) or ``discard`` (removed for good, 0061).
    action: str = "release"
    #: What a discarded row's event was (its body is not kept); None for a release.
    operation_id: str | None = None
    type: str | None = None
    version: int | None = None
    digest: str | None = None
    enqueued_at: datetime | None = None

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> ReleaseAudit:
        return cls(**{f.name: r[f.name] for f in fields(cls)})


async def held_rows(conn: Any, *, tenant: str | None = None, limit: int = 100) -> list[HeldRow]:
    """Read-only: held rows, oldest first (of ``tenant`` when given), at most ``limit``."""
    return [HeldRow.from_record(r) for r in await conn.fetch(sql.HELD_ROWS, tenant, limit)]


async def release_audit(
    conn: Any, tenant: str, event_id: uuid.UUID | None = None
) -> list[ReleaseAudit]:
    """Read-only: the release audit of ``tenant`` (of one event when given), oldest first."""
    rows = await conn.fetch(sql.RELEASE_AUDIT, tenant, event_id)
    return [ReleaseAudit.from_record(r) for r in rows]
