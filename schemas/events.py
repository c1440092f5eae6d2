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

Values: ``check_values`` is the one check of everything the wire format, the digest and
PostgreSQL's jsonb need from a payload, whatever the catalog model says (an application's
model may be as loose as ``dict[str, Any]``): text that is valid UTF-8 without NUL (keys
too), integers within the I-JSON range, finite floats, JSON types only, bounded nesting.
``Catalog.validate`` runs it before the model and before anything is encoded or digested,
in both directions; what is encoded and digested is then ``event.payload`` itself (the
checked dict, never the model's dump), so nothing after the check can change a key or a
value.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import rfc8785
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from uuid6 import uuid7

from accord.schemas import canonical as canonical_json
from accord.schemas.errors import (
    InvalidEvent,
    PayloadTooLarge,
    TenantConflict,
    UnknownEventType,
)

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
_NAME = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"
_IDENT = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$"
_IDENT_RE = re.compile(_IDENT)
# ASCII digits only (str.isdigit() also accepts "²" or Arabic-Indic digits), no leading
# zero, at most 999.
_VERSION_RE = re.compile(r"[1-9][0-9]{0,2}")
_NAME_RE = re.compile(_NAME)
#: I-JSON (RFC 7493): integers a binary64 double holds exactly, |n| <= 2**53 - 1.
MAX_SAFE_INTEGER = 2**53 - 1
#: Nesting of objects and arrays a payload may have (the parsers and the digest recurse).
MAX_DEPTH = 64
#: Top-level payload keys that name a tenant; when present they must be the event's tenant.
TENANT_KEYS = ("tenant", "tenantid")


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


def valid_tenant(tenant: str) -> bool:
    """Whether ``tenant`` is an identifier an event can carry (Event.tenant's pattern)."""
    return bool(_IDENT_RE.fullmatch(tenant))


def check_versioned(type_: object, version: object) -> None:
    """Refuse (ValueError) a type name or version no event can carry (a handler or catalog
    entry for them would match nothing: every delivery of its queue would be poisoned)."""
    if not isinstance(type_, str) or not _NAME_RE.fullmatch(type_):
        raise ValueError(f"event type {type_!r}: dotted lowercase names, e.g. order.placed")
    if type(version) is not int or not 1 <= version <= 999:
        raise ValueError(f"{type_} version {version!r}: an int from 1 to 999")


def split_versioned_type(ce_type: str) -> tuple[str, int]:
    """``order.placed.v1`` → (``order.placed``, 1); UnknownEventType if it has no version."""
    base, _, tail = ce_type.rpartition(".v")
    if not base or not _VERSION_RE.fullmatch(tail):
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


def _payload_keys(model: type[BaseModel]) -> dict[str, tuple[str, ...]]:
    """Each field of ``model`` by the keys a payload may carry it under: its alias (or
    validation alias) when it has one, its name when the model validates by name too; none
    for an alias that is not one key (``AliasChoices``, ``AliasPath``)."""
    config = model.model_config
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    by_alias = config.get("validate_by_alias", True) is not False
    keys: dict[str, tuple[str, ...]] = {}
    for name, field in model.model_fields.items():
        alias = field.validation_alias if field.validation_alias is not None else field.alias
        if alias is None or alias == name or not by_alias:
            keys[name] = (name,)
        elif isinstance(alias, str):
            keys[name] = (alias, name) if by_name else (alias,)
        else:
            keys[name] = (name,) if by_name else ()
    return keys


def _check_material(entry: EventType, material: tuple[str, ...]) -> None:
    """ValueError unless each name in ``material`` is the one key payloads carry its
    field under: the digest reads the payload by those keys, so a field name whose payloads
    use an alias (or a field carried under two names) would drop out of the digest, and a
    changed meaning would read as a duplicate."""
    keys = _payload_keys(entry.model)
    owner = {key: name for name, carried in keys.items() for key in carried}
    known = sorted(set(keys) | set(owner))
    unknown = sorted(m for m in material if m not in keys and m not in owner)
    if not material or unknown:
        raise ValueError(
            f"{entry.ce_type}: material must name fields of {entry.model.__name__}"
            f" ({', '.join(known)}); {unknown or 'it names none'}"
        )
    for m in material:
        field = owner.get(m, m)
        carried = keys[field]
        if carried != (m,):
            names = " or ".join(map(repr, carried)) or "no one key"
            how = (
                f"payloads carry it as {carried[0]!r}: name that"
                if len(carried) == 1
                else f"payloads may carry it under {names}: give it one name (no"
                " validate_by_name, a plain string alias)"
            )
            raise ValueError(f"{entry.ce_type}: material {m!r} names field {field!r}; {how}")


class Catalog:
    """The registered event types; an unknown type or version is UnknownEventType."""

    def __init__(self, entries: Iterable[EventType] = ()) -> None:
        self._entries: dict[tuple[str, int], EventType] = {}
        for entry in entries:
            self.register(entry)

    def register(self, entry: EventType) -> None:
        """Raises ValueError for a type or version no event can carry, a type already
        registered, or ``material`` naming no field or a field its model lacks (a name
        missing from the payload would drop out of the digest silently, and a changed
        meaning would read as a duplicate)."""
        check_versioned(entry.name, entry.version)
        key = (entry.name, entry.version)
        if key in self._entries:
            raise ValueError(f"{entry.ce_type} is already registered")
        if entry.material is not None:
            _check_material(entry, entry.material)
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
        """Validate the payload against its model: strict when producing, tolerant when reading.

        First, whatever the model: ``check_values`` (InvalidEvent) and ``check_tenant``
        (TenantConflict), so every catalog type is safe to encode, digest and store."""
        return self._validate(event, producing=producing)[0]

    def _validate(self, event: Event, *, producing: bool) -> tuple[BaseModel, bool]:
        entry = self.get(event.type, event.version)
        plain = check_values(event.payload)
        check_tenant(event.payload, event.tenant)
        try:
            extra: Literal["forbid", "ignore"] = "forbid" if producing else "ignore"
            return entry.model.model_validate(event.payload, extra=extra), plain
        except ValidationError as exc:
            fields = sorted({".".join(map(str, e["loc"])) for e in exc.errors()})
            raise InvalidEvent(event_type=event.ce_type, fields=fields) from None
        except Exception as exc:
            # pydantic wraps only ValueError and AssertionError: a validator's TypeError (say)
            # would escape as itself, and a consumer would crash on the message at every
            # redelivery instead of poisoning it. It is this payload's refusal, mapped here.
            raise InvalidEvent(
                event_type=event.ce_type, detail=f"its model raised {type(exc).__name__}"
            ) from exc

    def prepare(self, event: Event, max_payload_bytes: int) -> tuple[bytes, str]:
        """What producing ``event`` needs, its payload walked once: validated as ``validate``
        (producing), then its body (``encode_payload``) and its digest. Raises what those
        raise (UnknownEventType, InvalidEvent, TenantConflict, PayloadTooLarge)."""
        _, plain = self._validate(event, producing=True)
        body = encode_payload(event, max_payload_bytes, checked=True)
        return body, self.digest(event, plain=plain)

    def material(self, event: Event) -> dict[str, Any]:
        return dict(self._material(event))

    def _material(self, event: Event) -> Mapping[str, Any]:
        """What the digest covers: the payload itself (not a copy: it is only read) or the
        fields the type names."""
        entry = self.get(event.type, event.version)
        if entry.material is None:
            return event.payload
        return {k: event.payload[k] for k in entry.material if k in event.payload}

    def digest(self, event: Event, *, plain: bool = False) -> str:
        """The semantic digest (hex SHA-256 of RFC 8785 JSON); see the module docstring.
        ``plain``: ``check_values`` found the payload plain (``Catalog.prepare``)."""
        return semantic_digest(
            tenant=event.tenant,
            operation_id=event.operation_id,
            type_=event.type,
            version=event.version,
            authority_epoch=event.authority_epoch,
            material=self._material(event),
            plain_material=plain,
        )


def semantic_digest(
    *,
    tenant: str,
    operation_id: str,
    type_: str,
    version: int,
    authority_epoch: int,
    material: Mapping[str, Any],
    plain_material: bool = False,
) -> str:
    """``plain_material``: ``check_values`` found the material plain, so the document is plain
    too when its envelope numbers are integers in the I-JSON range (its keys are ASCII, its
    other fields text): then the canonical fast path writes the document without walking it
    again (``canonical.plain_bytes``: one orjson call, keys sorted as RFC 8785 sorts them)."""
    try:
        texts = type(tenant) is str and type(operation_id) is str and type(type_) is str
        fast = plain_material and texts and type(material) is dict
        document: dict[str, Any] = {
            "tenant": tenant,
            "operation_id": operation_id,
            "type": type_,
            "version": version,
            "authority_epoch": authority_epoch,
            "material": material if fast else dict(material),
        }
        if fast and _envelope_int(version) and _envelope_int(authority_epoch):
            canonical = canonical_json.plain_bytes(document)
        else:
            canonical = canonical_json.dumps(document)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise InvalidEvent(detail=f"payload is not canonical JSON: {exc}") from exc
    return hashlib.sha256(canonical).hexdigest()


def _envelope_int(value: Any) -> bool:
    """An envelope number the fast path writes as RFC 8785 does (a bool is not one)."""
    return type(value) is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


def check_values(value: Any, path: str = "payload") -> bool:
    """Refuse, with InvalidEvent naming the field, any value the wire format, the digest
    (RFC 8785) or PostgreSQL (jsonb) cannot keep faithfully: text that is not valid UTF-8
    (a lone surrogate) or holds NUL, in values and in keys; an integer outside the I-JSON
    range; NaN or an infinity; a key that is not text (JSON would turn ``1`` into ``"1"``,
    perhaps beside a real ``"1"``); anything that is not JSON (bytes, sets, datetimes, ...);
    nesting deeper than MAX_DEPTH. ``None``, booleans, lists, tuples and dicts are fine.
    Keys are unique: a dict's keys are distinct text, and JSON text keeps them distinct.

    Returns whether ``value`` is *plain* (no float, every key ASCII): then its RFC 8785 form
    is what the canonical fast path writes (``canonical.dumps(..., plain=True)``), and the
    digest need not walk it again."""
    return _check(value, path, 0)


def _check(value: Any, path: str, depth: int) -> bool:
    if isinstance(value, str):
        _check_text(value, path)
        return True
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise InvalidEvent(detail="integer outside the I-JSON range", field=path)
        return True
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidEvent(detail="non-finite number", field=path)
        return False
    if isinstance(value, dict | list | tuple):
        if depth >= MAX_DEPTH:
            raise InvalidEvent(detail="nested too deep", field=path, limit=MAX_DEPTH)
        plain = True
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str) or _text_problem(key) is not None:
                    raise InvalidEvent(detail="bad object key", field=path)
                plain = _check(item, f"{path}.{key}", depth + 1) and key.isascii() and plain
        else:
            for index, item in enumerate(value):
                plain = _check(item, f"{path}[{index}]", depth + 1) and plain
        return plain
    raise InvalidEvent(detail="not a JSON value", field=path, type=type(value).__name__)


def _check_text(value: str, path: str) -> None:
    problem = _text_problem(value)
    if problem is not None:
        raise InvalidEvent(detail=problem, field=path)


def _text_problem(value: str) -> str | None:
    if "\x00" in value:
        return "NUL character"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "not valid UTF-8 (lone surrogate)"
    return None


def check_tenant(payload: Mapping[str, Any], tenant: str) -> None:
    """TenantConflict when the payload names a tenant (a top-level ``tenant`` or
    ``tenantid``) other than the event's: never silently the envelope's."""
    for key in TENANT_KEYS:
        if key in payload and payload[key] != tenant:
            named = payload[key]
            shown = (
                named
                if isinstance(named, str) and _IDENT_RE.fullmatch(named)
                else f"<{type(named).__name__}>"
            )
            raise TenantConflict(tenant=tenant, key=key, payload_tenant=shown)


def encode_payload(
    event: Event, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES, *, checked: bool = False
) -> bytes:
    """The body bytes (compact JSON); InvalidEvent for values ``check_values`` refuses,
    PayloadTooLarge over ``max_bytes``. ``checked``: the caller ran ``Catalog.validate``
    (which runs ``check_values``) on this very event, so the walk is not done twice."""
    if not checked:
        check_values(event.payload)
    try:
        # orjson, or the stdlib for what it refuses: the same JSON values (a float may be
        # spelled differently, 1e-05 as 0.00001; the digest never reads the body).
        body = canonical_json.compact_bytes(event.payload)
    except (TypeError, ValueError, RecursionError) as exc:  # not after check_values
        raise InvalidEvent(detail=f"payload is not JSON: {type(exc).__name__}") from exc
    if len(body) > max_bytes:
        raise PayloadTooLarge(event_type=event.ce_type, size=len(body), limit=max_bytes)
    return body
