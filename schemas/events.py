"""The event envelope, the catalog of versioned event types, and the semantic digest.

Evolution rules (pinned by tests/unit/test_catalog_schemas.py):
- Within a version, only additive changes: a new *optional* field. Producers validate
  with ``extra="forbid"``; consumers read tolerantly (unknown fields are ignored), so an
  older consumer accepts a newer producer of the same version.
- Anything else (a removed, renamed, retyped or newly required field) is a new version:
  register ``(type, version + 1)`` beside the old one; both stay readable.

The digest is SHA-256 over RFC 8785 canonical JSON of tenant, operation id, type,
version, authority epoch and the payload's *material* content (the catalog entry says
which fields are material; by default all). It never covers event or publish ids,
timestamps or trace context, so a redelivery or a re-publish has the same digest while
a changed meaning does not.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import rfc8785
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from uuid6 import uuid7

from accord.schemas.errors import InvalidEvent, PayloadTooLarge, UnknownEventType

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
_NAME = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"
_IDENT = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$"


class Event(BaseModel):
    """One versioned domain event: the envelope every boundary agrees on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str = Field(pattern=_IDENT)
    operation_id: str = Field(pattern=_IDENT)
    type: str = Field(pattern=_NAME, max_length=200)
    version: int = Field(ge=1, le=999)
    authority_epoch: int = Field(default=0, ge=0)
    payload: dict[str, Any]
    event_id: uuid.UUID = Field(default_factory=lambda: new_event_id())
    occurred_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def ce_type(self) -> str:
        """The versioned type on the wire and as the routing key, e.g. ``order.placed.v1``."""
        return versioned_type(self.type, self.version)


def new_event_id() -> uuid.UUID:
    """A time-ordered (RFC 9562 version 7) id: the outbox's unique index then appends instead
    of touching a random page per insert (far fewer full-page images in the WAL after each
    checkpoint). Uniqueness still rests on the 74 random bits, not on the clock."""
    return uuid.UUID(bytes=uuid7().bytes)


def versioned_type(type_: str, version: int) -> str:
    return f"{type_}.v{version}"


def split_versioned_type(ce_type: str) -> tuple[str, int]:
    """``order.placed.v1`` → (``order.placed``, 1); UnknownEventType if it has no version."""
    base, _, tail = ce_type.rpartition(".v")
    if not base or not tail.isdigit():
        raise UnknownEventType(event_type=ce_type, detail="no .vN version suffix")
    return base, int(tail)


@dataclass(frozen=True, slots=True)
class EventType:
    """A registered (type, version): its payload model and which fields are material."""

    name: str
    version: int
    model: type[BaseModel]
    material: tuple[str, ...] | None = None  # None: every payload field is material

    @property
    def ce_type(self) -> str:
        return versioned_type(self.name, self.version)


class Catalog:
    """The registered event types; an unknown type or version is UnknownEventType."""

    def __init__(self, entries: Iterable[EventType] = ()) -> None:
        self._entries: dict[tuple[str, int], EventType] = {}
        for entry in entries:
            self.register(entry)

    def register(self, entry: EventType) -> None:
        key = (entry.name, entry.version)
        if key in self._entries:
            raise ValueError(f"{entry.ce_type} is already registered")
        self._entries[key] = entry

    def __iter__(self) -> Any:
        return iter(sorted(self._entries.values(), key=lambda e: (e.name, e.version)))

    def get(self, type_: str, version: int) -> EventType:
        try:
            return self._entries[(type_, version)]
        except KeyError:
            known = sorted(v for t, v in self._entries if t == type_)
            raise UnknownEventType(
                event_type=type_, version=version, known_versions=known
            ) from None

    def validate(self, event: Event, *, producing: bool) -> BaseModel:
        """Validate the payload against its model: strict when producing, tolerant when reading."""
        entry = self.get(event.type, event.version)
        check_values(event.payload)
        try:
            extra: Literal["forbid", "ignore"] = "forbid" if producing else "ignore"
            return entry.model.model_validate(event.payload, extra=extra)
        except ValidationError as exc:
            fields = sorted({".".join(map(str, e["loc"])) for e in exc.errors()})
            raise InvalidEvent(event_type=event.ce_type, fields=fields) from None

    def material(self, event: Event) -> dict[str, Any]:
        entry = self.get(event.type, event.version)
        if entry.material is None:
            return dict(event.payload)
        return {k: event.payload[k] for k in entry.material if k in event.payload}

    def digest(self, event: Event) -> str:
        """The semantic digest (hex SHA-256 of RFC 8785 JSON); see the module docstring."""
        return semantic_digest(
            tenant=event.tenant,
            operation_id=event.operation_id,
            type_=event.type,
            version=event.version,
            authority_epoch=event.authority_epoch,
            material=self.material(event),
        )


def semantic_digest(
    *,
    tenant: str,
    operation_id: str,
    type_: str,
    version: int,
    authority_epoch: int,
    material: Mapping[str, Any],
) -> str:
    document: dict[str, Any] = {
        "tenant": tenant,
        "operation_id": operation_id,
        "type": type_,
        "version": version,
        "authority_epoch": authority_epoch,
        "material": dict(material),
    }
    try:
        canonical = rfc8785.dumps(document)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidEvent(detail=f"payload is not canonical JSON: {exc}") from exc
    return hashlib.sha256(canonical).hexdigest()


def check_values(value: Any, path: str = "payload") -> None:
    """Refuse values PostgreSQL or JSON cannot keep faithfully: NUL characters, NaN, infinities."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidEvent(detail="NUL character", field=path)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEvent(detail="non-finite number", field=path)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str) or "\x00" in key:
                raise InvalidEvent(detail="bad object key", field=path)
            check_values(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_values(item, f"{path}[{index}]")


def encode_payload(event: Event, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    """The body bytes (compact JSON); PayloadTooLarge over ``max_bytes``."""
    check_values(event.payload)
    body = json.dumps(
        event.payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()
    if len(body) > max_bytes:
        raise PayloadTooLarge(event_type=event.ce_type, size=len(body), limit=max_bytes)
    return body
