"""Poison records: a message that can never be applied, kept as typed evidence.

A poison record holds a typed reason, the identifiers that could be read, a summary of
the headers and the body's size and SHA-256, never the raw payload. The runtime writes
it in its own short transaction and only then rejects the message to the dead-letter
queue, so every dead-lettered message it decided on has its record; a redelivery of a
message whose reject was lost after that commit finds the record and writes no second one
(the same life of the message: its publish id, body, message id and move id).

Everything a record keeps is made storable first (``storable``): text taken from a
message (a header value, a duplicate key, a message id) may hold NUL or a lone surrogate,
which PostgreSQL's text and jsonb refuse; a record that cannot be written would stop the
consumer instead of setting the message aside.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from accord.consumers import sql
from accord.consumers.errors import PermanentFailure
from accord.schemas.db import require_transaction
from accord.schemas.errors import InvalidEvent, MalformedMessage, UnknownEventType


class PoisonReason(StrEnum):
    """Why a message was poisoned (mirrors ``poison_reason_check``)."""

    MALFORMED = "malformed"
    MALFORMED_JSON = "malformed_json"
    DUPLICATE_KEY = "duplicate_key"
    NON_FINITE_NUMBER = "non_finite_number"
    BODY_NOT_OBJECT = "body_not_object"
    MISSING_HEADER = "missing_header"
    BAD_HEADER = "bad_header"
    DUPLICATE_HEADER = "duplicate_header"
    BAD_SPECVERSION = "bad_specversion"
    BAD_CONTENT_TYPE = "bad_content_type"
    BAD_ATTRIBUTE = "bad_attribute"
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_VERSION = "unknown_version"
    INVALID_EVENT = "invalid_event"
    NO_HANDLER = "no_handler"
    DIGEST_MISMATCH = "digest_mismatch"
    TENANT_MISMATCH = "tenant_mismatch"
    CONFLICT = "conflict"
    TOO_OLD = "too_old"
    IN_FUTURE = "in_future"  # dated past the prune margin ahead of the database clock
    REJECTED = "rejected"
    RETRIES_EXHAUSTED = "retries_exhausted"
    TENANT_CONFLICT = "tenant_conflict"  # the body names another tenant than the header
    TOO_LARGE = "too_large"  # the body is over the consumer's bound (max_body_bytes)
    DATA_EXCEPTION = "data_exception"  # PostgreSQL refused a value: SQLSTATE class 22
    INTEGRITY_VIOLATION = "integrity_violation"  # SQLSTATE class 23
    STATEMENT_REFUSED = "statement_refused"  # SQLSTATE class 42


PERMANENT_ERRORS = (PermanentFailure, MalformedMessage, UnknownEventType, InvalidEvent)

# Header values worth keeping in the summary: identifiers, never free text.
_KEPT = frozenset(
    {"id", "type", "source", "specversion", "time", "tenantid", "operationid", "authepoch",
     "opdigest", "occurredat", "publish-id", "traceparent", "x-delivery-count",
     "x-first-death-reason"}
)  # fmt: skip
_VALUE_LIMIT = 128
_DETAIL_LIMIT = 512


def reason_for(exc: BaseException) -> PoisonReason:
    """The typed poison reason of a permanent error."""
    if isinstance(exc, MalformedMessage):
        problem = getattr(exc, "problem", "")
        try:
            return PoisonReason(problem)
        except ValueError:
            return PoisonReason.MALFORMED
    if isinstance(exc, UnknownEventType):
        return (
            PoisonReason.UNKNOWN_VERSION
            if getattr(exc, "known_versions", None)
            else PoisonReason.UNKNOWN_TYPE
        )
    try:  # every other error names its own reason (TenantConflict, DataException, ...)
        return PoisonReason(getattr(exc, "reason", ""))
    except ValueError:
        return (
            PoisonReason.INVALID_EVENT if isinstance(exc, InvalidEvent) else PoisonReason.REJECTED
        )


def storable(text: str, limit: int | None = None) -> str:
    """``text`` as PostgreSQL text and jsonb keep it: NUL and lone surrogates spelled out
    as backslash escapes; cut to ``limit`` characters."""
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = text.replace("\x00", "\\x00")
    return text if limit is None else text[:limit]


def _storable_opt(text: str | None, limit: int) -> str | None:
    return None if text is None else storable(text, limit)


def summarize_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """Header names with identifier values (truncated); other values only by type and size."""
    summary: dict[str, str] = {}
    for raw_name, value in (headers or {}).items():
        name = storable(str(raw_name), _VALUE_LIMIT)
        bare = name.lower()
        for prefix in ("ce-", "cloudevents_", "cloudevents:"):
            if bare.startswith(prefix):
                bare = bare[len(prefix) :]
                break
        if bare in _KEPT and isinstance(value, str | bytes | int | bool):
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            summary[name] = storable(text, _VALUE_LIMIT)
        else:
            summary[name] = f"<{type(value).__name__}>"
    return summary


@dataclass(frozen=True, slots=True)
class PoisonRecord:
    """One poisoned message as stored (identifiers may be absent when they could not be read)."""

    consumer: str
    queue: str
    reason: PoisonReason
    detail: dict[str, Any]
    headers: dict[str, str]
    body_size: int
    body_sha256: str
    redelivered: bool = False
    delivery_count: int = 0
    tenant: str | None = None
    operation_id: str | None = None
    event_id: str | None = None
    event_type: str | None = None
    message_id: str | None = None
    publish_id: str | None = None
    #: The ``accord-move-id`` header of a message ``accord dead-letters`` moved back.
    move_id: str | None = None


def error_detail(exc: BaseException) -> dict[str, Any]:
    """An error's structured fields (identifiers and digests), JSON-safe, for the record."""
    fields = getattr(exc, "fields", None)
    if not isinstance(fields, dict):
        # InvalidEvent carries a field *named* ``fields``, which shadows the dict of fields.
        fields = {k: v for k, v in vars(exc).items() if not k.startswith("_")}
    detail: dict[str, Any] = {"error": type(exc).__name__}
    for key, value in fields.items():
        if isinstance(value, bool | int | None) or (
            isinstance(value, float) and math.isfinite(value)
        ):
            detail[storable(str(key))] = value
        else:  # text from the message may hold NUL or a lone surrogate: jsonb refuses both
            detail[storable(str(key))] = storable(str(value), _DETAIL_LIMIT)
    return detail


def body_fingerprint(body: bytes) -> tuple[int, str]:
    """(size, SHA-256 hex) of a body: what a poison record keeps instead of the payload."""
    return len(body), hashlib.sha256(body).hexdigest()


async def record_poison(tx: Any, record: PoisonRecord) -> tuple[int, bool]:
    """Runs in the caller's transaction; never commits. Stores one poison record; returns its
    id and True. A redelivered message this consumer already recorded in the same life (its
    reject lost after the record's commit) gets that record's id and False: nothing is
    written (consumers.record_poison, 0057)."""
    require_transaction(tx)
    row = await tx.fetchrow(
        sql.RECORD_POISON,
        record.consumer,
        record.queue,
        str(record.reason),
        json.dumps(record.detail, default=str),
        record.tenant,
        record.operation_id,
        record.event_id,
        record.event_type,
        record.message_id,
        record.publish_id,
        record.redelivered,
        record.delivery_count,
        json.dumps(record.headers),
        record.body_size,
        record.body_sha256,
        record.move_id,
    )
    return int(row["poison_id"]), bool(row["written"])


async def poison_counts(conn: Any) -> list[Any]:
    """Read-only: poison records by consumer and typed reason, with the oldest one's age."""
    return list(await conn.fetch(sql.POISON_COUNTS))
