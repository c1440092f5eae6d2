"""CloudEvents 1.0 binary mode over AMQP 0-9-1 (DESIGN.md §3), both directions.

Producing: the body is the domain JSON; attributes travel as ``ce-`` headers
(``ce-id`` = event id, also ``message_id``; ``ce-type`` = the versioned type, also the
routing key; ``ce-time`` = enqueue time; extensions ``tenantid``, ``operationid``,
``authepoch`` as a decimal string, ``opdigest``), plus ``publish-id`` and W3C
``traceparent``/``tracestate``. Reading accepts the ``ce-``, ``cloudEvents_`` and
``cloudEvents:`` prefixes, parses JSON strictly (no duplicate keys, no NaN) and raises
MalformedMessage with a ``problem`` naming what is wrong; it never guesses.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from accord.schemas.errors import MalformedMessage
from accord.schemas.events import Event, split_versioned_type

CONTENT_TYPE = "application/json"
SPECVERSION = "1.0"
DEFAULT_SOURCE = "/accord"
PREFIXES = ("ce-", "cloudevents_", "cloudevents:")
REQUIRED = ("id", "type", "source", "specversion", "tenantid", "operationid", "authepoch")


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


def to_amqp(
    event: Event,
    body: bytes,
    *,
    digest: str,
    publish_id: str,
    source: str = DEFAULT_SOURCE,
    trace: Mapping[str, str] | None = None,
) -> WireMessage:
    """Map an event (and its already-encoded body) to binary-mode AMQP headers."""
    headers = {
        "ce-specversion": SPECVERSION,
        "ce-id": str(event.event_id),
        "ce-type": event.ce_type,
        "ce-source": source,
        "ce-time": event.occurred_at.isoformat().replace("+00:00", "Z"),
        "ce-tenantid": event.tenant,
        "ce-operationid": event.operation_id,
        "ce-authepoch": str(event.authority_epoch),
        "ce-opdigest": digest,
        "publish-id": publish_id,
    }
    for key in ("traceparent", "tracestate"):
        if trace and trace.get(key):
            headers[key] = trace[key]
    return WireMessage(
        body=body, headers=headers, message_id=str(event.event_id), routing_key=event.ce_type
    )


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
        name = raw_name.lower()
        for prefix in PREFIXES:
            if name.startswith(prefix):
                attr = name[len(prefix) :]
                if attr in found:
                    raise MalformedMessage(problem="duplicate_header", header=attr)
                found[attr] = _text(raw_name, value)
                break
    return found


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
    """Strict JSON object: UTF-8, no duplicate keys, no NaN/Infinity."""
    try:
        data = json.loads(
            body.decode("utf-8"),
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedMessage(problem="malformed_json", detail=type(exc).__name__) from None
    if not isinstance(data, dict):
        raise MalformedMessage(problem="body_not_object")
    return data


def from_amqp(
    body: bytes, headers: Mapping[str, Any] | None, content_type: str | None = CONTENT_TYPE
) -> Inbound:
    """Decode one delivery; MalformedMessage (with ``problem``) for anything not well formed."""
    attrs = attributes(headers or {})
    missing = [name for name in REQUIRED if not attrs.get(name)]
    if missing:
        raise MalformedMessage(problem="missing_header", headers=missing)
    if attrs["specversion"] != SPECVERSION:
        raise MalformedMessage(problem="bad_specversion", specversion=attrs["specversion"])
    if content_type not in (None, "", CONTENT_TYPE):
        raise MalformedMessage(problem="bad_content_type", content_type=content_type)
    type_, version = split_versioned_type(attrs["type"])
    if not attrs["authepoch"].isdigit():
        raise MalformedMessage(problem="bad_header", header="authepoch")
    payload = parse_body(body)
    try:
        when = {"occurred_at": datetime.fromisoformat(attrs["time"])} if attrs.get("time") else {}
        event = Event(
            tenant=attrs["tenantid"],
            operation_id=attrs["operationid"],
            type=type_,
            version=version,
            authority_epoch=int(attrs["authepoch"]),
            payload=payload,
            event_id=uuid.UUID(attrs["id"]),
            **when,
        )
    except (ValueError, ValidationError) as exc:
        raise MalformedMessage(problem="bad_attribute", detail=type(exc).__name__) from None
    plain = {k.lower(): v for k, v in (headers or {}).items()}
    trace: dict[str, str] = {
        k: _text(k, plain[k]) for k in ("traceparent", "tracestate") if k in plain
    }
    publish_id = _text("publish-id", plain["publish-id"]) if "publish-id" in plain else None
    return Inbound(event=event, digest=attrs.get("opdigest"), publish_id=publish_id, trace=trace)
