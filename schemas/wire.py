"""CloudEvents 1.0 binary mode over AMQP 0-9-1 (DESIGN.md §3), both directions.

Producing: the body is the domain JSON; attributes travel as ``ce-`` headers
(``ce-id`` = event id, also ``message_id``; ``ce-type`` = the versioned type, also the
routing key; ``ce-time`` = enqueue time; extensions ``tenantid``, ``operationid``,
``authepoch`` as a decimal string, ``opdigest``, and ``occurredat``, the event's own
``occurred_at`` when the enqueue time is given apart from it), plus ``publish-id`` and W3C
``traceparent``/``tracestate``. Reading accepts the ``ce-``, ``cloudEvents_`` and
``cloudEvents:`` prefixes, parses JSON strictly (no duplicate keys, no NaN) and raises
MalformedMessage with a ``problem`` naming what is wrong; it never guesses.

Header values are read by exact format, never by what a lenient library would accept:
``ce-id`` and ``publish-id`` are canonical UUID text (lowercase, hyphenated: what
``str(uuid)`` gives); ``authepoch`` is ASCII digits (``str.isdigit`` also takes "²" or
Arabic-Indic digits), at most 18 of them; ``ce-time`` is RFC 3339 with an explicit offset or ``Z``
(``datetime.fromisoformat`` takes many other forms); ``opdigest`` is 64 lowercase hex
digits. A body naming another tenant than ``tenantid`` is a TenantConflict. Every failure
is a typed accord error (schemas.errors): MalformedMessage, UnknownEventType, InvalidEvent.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from pydantic import ValidationError

from accord.schemas.errors import MalformedMessage
from accord.schemas.events import Event, check_tenant, split_versioned_type

CONTENT_TYPE = "application/json"
SPECVERSION = "1.0"
DEFAULT_SOURCE = "/accord"
PREFIXES = ("ce-", "cloudevents_", "cloudevents:")
# time: the replay window is judged by it (the enqueue time: a producer's backfilled or
# future-dated occurred_at travels as occurredat, judged by nobody); filled from the
# consumer's clock, an event would look new at every redelivery once its inbox row was pruned.
REQUIRED = (
    "id", "type", "source", "specversion", "time", "tenantid", "operationid", "authepoch",
)  # fmt: skip
# Headers read without a CloudEvents prefix (besides the attributes).
PLAIN = ("publish-id", "traceparent", "tracestate")
#: Stamped by ``accord dead-letters`` on each message it moves back to its class's queue (a
#: fresh UUID per move): a consumer's poison record tells one life of a message from the
#: next by it, the publish id staying the same across a move (consumers.record_poison).
MOVE_ID = "accord-move-id"
_TRACE = ("traceparent", "tracestate")

_DECIMAL = re.compile(r"[0-9]{1,18}")  # below 2**63: PostgreSQL's bigint
_DIGEST = re.compile(r"[0-9a-f]{64}")
# RFC 3339 date-time (section 5.6): "T"/"Z" may be lower case; an offset is required;
# fractions of a second up to nanoseconds (kept to microseconds).
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,9}))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)


@dataclass(frozen=True, slots=True)
class WireMessage:
    """What goes on the wire for one publish (AMQP properties + headers + body)."""

    body: bytes
    headers: dict[str, str]
    message_id: str
    routing_key: str
    content_type: str = CONTENT_TYPE


@dataclass(frozen=True, slots=True)
class Inbound:
    """A decoded delivery: the event plus its delivery-side identity and trace context."""

    event: Event
    digest: str | None
    publish_id: str | None
    trace: dict[str, str] = field(default_factory=dict)
    #: ``ce-time``, the enqueue time the replay window judges; ``event.occurred_at`` is
    #: ``occurredat`` when the producer sent it, else this same time.
    enqueued_at: datetime | None = None


def to_amqp(
    event: Event,
    body: bytes,
    *,
    digest: str,
    publish_id: str,
    source: str = DEFAULT_SOURCE,
    trace: Mapping[str, str] | None = None,
    enqueued_at: datetime | None = None,
) -> WireMessage:
    """Map an event (and its already-encoded body) to binary-mode AMQP headers. ``ce-time``
    is ``enqueued_at`` (the outbox row's, by the producer's database clock) with the
    event's ``occurred_at`` as ``occurredat``; without it, ``occurred_at`` is the time."""
    headers = {
        "ce-specversion": SPECVERSION,
        "ce-id": str(event.event_id),
        "ce-type": event.ce_type,
        "ce-source": source,
        "ce-time": _time(enqueued_at or event.occurred_at),
        "ce-tenantid": event.tenant,
        "ce-operationid": event.operation_id,
        "ce-authepoch": str(event.authority_epoch),
        "ce-opdigest": digest,
        "publish-id": publish_id,
    }
    if enqueued_at is not None:
        headers["ce-occurredat"] = _time(event.occurred_at)
    for key in ("traceparent", "tracestate"):
        if trace and trace.get(key):
            headers[key] = trace[key]
    return WireMessage(
        body=body, headers=headers, message_id=str(event.event_id), routing_key=event.ce_type
    )


def _time(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def _text(name: str, value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise MalformedMessage(problem="bad_header", header=name) from None
    if isinstance(value, str):
        return value
    raise MalformedMessage(problem="bad_header", header=name)


def attributes(headers: Mapping[str, Any]) -> dict[str, str]:
    """The CloudEvents attributes from headers under any accepted prefix (lower-cased names)."""
    found: dict[str, str] = {}
    for raw_name, value in headers.items():
        if not isinstance(raw_name, str):
            raise MalformedMessage(problem="bad_header", header=type(raw_name).__name__)
        name = raw_name.lower()
        for prefix in PREFIXES:
            if name.startswith(prefix):
                attr = name[len(prefix) :]
                if attr in found:
                    raise MalformedMessage(problem="duplicate_header", header=attr)
                found[attr] = _text(raw_name, value)
                break
    return found


def _plain(headers: Mapping[str, Any]) -> dict[str, str]:
    """The unprefixed headers accord reads (PLAIN), by lower-cased name, once each. The
    trace context is advice, never a reason to refuse an event (W3C Trace Context: an
    invalid header is ignored and a new trace starts): one that is not text, or comes twice,
    is dropped, not an error."""
    found: dict[str, str] = {}
    dropped: set[str] = set()
    for raw_name, value in headers.items():
        name = raw_name.lower() if isinstance(raw_name, str) else None
        if name in _TRACE:
            text = _lenient_text(value)
            if text is None or name in found or name in dropped:
                found.pop(name, None)
                dropped.add(name)
            else:
                found[name] = text
        elif name in PLAIN:
            if name in found:
                raise MalformedMessage(problem="duplicate_header", header=name)
            found[name] = _text(name, value)
    return found


def _lenient_text(value: Any) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _canonical_uuid(name: str, text: str, problem: str) -> uuid.UUID:
    """A UUID only in its canonical text (``uuid.UUID`` also takes braces, ``urn:uuid:``,
    no hyphens, upper case, even non-ASCII digits)."""
    try:
        value = uuid.UUID(text)
    except ValueError:
        raise MalformedMessage(problem=problem, header=name) from None
    if str(value) != text:
        raise MalformedMessage(problem=problem, header=name, detail="not canonical UUID text")
    return value


def parse_time(text: str) -> datetime:
    """An RFC 3339 date-time with an explicit offset (or Z), timezone-aware; ValueError
    for anything else (no offset, a space, week dates, an impossible date, a leap second, an
    instant outside years 1..9999 once in UTC: ``0001-01-01T00:30:00+01:00``, which no
    database write could take)."""
    found = _RFC3339.fullmatch(text)
    if found is None:
        raise ValueError("not an RFC 3339 date-time with an offset")
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = found.groups()
    if zulu:
        tz = UTC
    else:
        hours, minutes = int(off_h), int(off_m)
        if hours > 23 or minutes > 59:
            raise ValueError("offset out of range")
        offset = timedelta(hours=hours, minutes=minutes)
        tz = timezone(-offset if sign == "-" else offset) if offset else UTC
    micro = int((fraction or "0").ljust(6, "0")[:6])
    value = datetime(
        int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=tz
    )
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise ValueError("outside years 1..9999 once in UTC") from None
    return value


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise MalformedMessage(problem="duplicate_key", key=key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise MalformedMessage(problem="non_finite_number", constant=name)


def parse_body(body: bytes) -> dict[str, Any]:
    """Strict JSON object: UTF-8, no duplicate keys, no NaN/Infinity. The values are then
    checked by ``Catalog.validate`` (``check_values``): lone surrogates, NUL, huge numbers."""
    try:
        data = json.loads(
            body.decode("utf-8"),
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
        )
    # ValueError: also an integer of more than 4300 digits (int_max_str_digits);
    # RecursionError: nesting deeper than the interpreter's stack.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedMessage(problem="malformed_json", detail=type(exc).__name__) from None
    if not isinstance(data, dict):
        raise MalformedMessage(problem="body_not_object")
    return data


def json_media_type(content_type: str) -> bool:
    """Whether ``content_type`` says JSON in UTF-8 as RFC 9110 spells it: the media type in
    any case, with parameters, a ``charset`` only utf-8 (``application/json; charset=utf-8``
    from another CloudEvents producer is JSON; ``text/plain`` or a latin-1 charset is not)."""
    media, *params = content_type.split(";")
    if media.strip().lower() != CONTENT_TYPE:
        return False
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


def from_amqp(
    body: bytes, headers: Mapping[str, Any] | None, content_type: str | None = CONTENT_TYPE
) -> Inbound:
    """Decode one delivery. Raises MalformedMessage (with ``problem``) for anything not well
    formed, UnknownEventType for a type without a ``.vN`` suffix, TenantConflict for a body
    naming another tenant; nothing else."""
    attrs = attributes(headers or {})
    plain = _plain(headers or {})
    missing = [name for name in REQUIRED if not attrs.get(name)]
    if missing:
        raise MalformedMessage(problem="missing_header", headers=missing)
    if attrs["specversion"] != SPECVERSION:
        raise MalformedMessage(problem="bad_specversion", specversion=attrs["specversion"])
    if content_type not in (None, "", CONTENT_TYPE) and not json_media_type(content_type):
        raise MalformedMessage(problem="bad_content_type", content_type=content_type)
    type_, version = split_versioned_type(attrs["type"])
    if not _DECIMAL.fullmatch(attrs["authepoch"]):
        raise MalformedMessage(problem="bad_header", header="authepoch")
    digest = attrs.get("opdigest")
    if digest is not None and not _DIGEST.fullmatch(digest):
        raise MalformedMessage(problem="bad_header", header="opdigest")
    publish_id = plain.get("publish-id")
    if publish_id is not None:
        _canonical_uuid("publish-id", publish_id, "bad_header")
    event_id = _canonical_uuid("id", attrs["id"], "bad_attribute")
    payload = parse_body(body)
    try:
        enqueued_at = parse_time(attrs["time"])
        occurred = attrs.get("occurredat")
        event = Event(
            tenant=attrs["tenantid"],
            operation_id=attrs["operationid"],
            type=type_,
            version=version,
            authority_epoch=int(attrs["authepoch"]),
            payload=payload,
            event_id=event_id,
            occurred_at=enqueued_at if occurred is None else parse_time(occurred),
        )
    except (ValueError, ValidationError) as exc:
        raise MalformedMessage(problem="bad_attribute", detail=type(exc).__name__) from None
    check_tenant(payload, event.tenant)
    trace: dict[str, str] = {k: plain[k] for k in ("traceparent", "tracestate") if k in plain}
    return Inbound(
        event=event, digest=digest, publish_id=publish_id, trace=trace, enqueued_at=enqueued_at
    )
