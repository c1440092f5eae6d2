"""The event envelope and the semantic digest: what it binds, what it ignores, what it refuses."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from accord.demo.catalog import demo_catalog
from accord.schemas.errors import InvalidEvent, PayloadTooLarge, TenantConflict, UnknownEventType
from accord.schemas.events import (
    MAX_DEPTH,
    Catalog,
    Event,
    EventType,
    encode_payload,
    semantic_digest,
    split_versioned_type,
)

CATALOG = demo_catalog()


def accepted(**changes: Any) -> Event:
    fields: dict[str, Any] = {
        "tenant": "tenant-a",
        "operation_id": "op-1",
        "type": "report.accepted",
        "version": 1,
        "authority_epoch": 3,
        "payload": {"report_id": "r1", "subject": "quarterly"},
    }
    fields.update(changes)
    return Event(**fields)


def test_digest_is_stable_and_hex_sha256() -> None:
    first = CATALOG.digest(accepted())
    assert first == CATALOG.digest(accepted())
    assert len(first) == 64 and int(first, 16) >= 0


def test_digest_known_answer() -> None:
    """The digest is SHA-256 of these exact bytes: RFC 8785 JSON of tenant, operation id,
    type, version, epoch and the material payload, spelled out by hand here."""
    canonical = (
        b'{"authority_epoch":3,"material":{"report_id":"r1","subject":"quarterly"},'
        b'"operation_id":"op-1","tenant":"tenant-a","type":"report.accepted","version":1}'
    )
    assert CATALOG.digest(accepted()) == hashlib.sha256(canonical).hexdigest()


def test_digest_is_rfc8785_not_sorted_json() -> None:
    """Where RFC 8785 and sorted compact JSON differ: keys sort by UTF-16 code units (the
    astral U+1F600 before U+FB01), 1.0 is 1, and 1e21 is 1e+21."""
    material = {"n": 1.0, "big": 1e21, "a\U0001f600": 1, "a\ufb01": 2}
    canonical = (
        '{"authority_epoch":0,"material":{"a\U0001f600":1,"a\ufb01":2,"big":1e+21,"n":1},'
        '"operation_id":"op","tenant":"t","type":"x.y","version":2}'
    ).encode()
    digest = semantic_digest(
        tenant="t", operation_id="op", type_="x.y", version=2, authority_epoch=0, material=material
    )
    assert digest == hashlib.sha256(canonical).hexdigest()


def test_digest_excludes_event_id_timestamps_and_key_order() -> None:
    base = CATALOG.digest(accepted())
    other = accepted(
        event_id=uuid.uuid4(),
        occurred_at=datetime.now(UTC) - timedelta(days=3),
        payload={"subject": "quarterly", "report_id": "r1"},
    )
    assert CATALOG.digest(other) == base


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"report_id": "r2", "subject": "quarterly"}},
        {"payload": {"report_id": "r1", "subject": "annual"}},
        {"tenant": "tenant-b"},
        {"operation_id": "op-2"},
        {"authority_epoch": 4},
    ],
    ids=["report_id", "subject", "tenant", "operation", "epoch"],
)
def test_digest_changes_with_material_content(change: dict[str, Any]) -> None:
    assert CATALOG.digest(accepted(**change)) != CATALOG.digest(accepted())


def test_digest_changes_with_version() -> None:
    from pydantic import BaseModel

    from accord.schemas.events import Catalog, EventType

    class V(BaseModel):
        report_id: str
        subject: str

    catalog = Catalog([EventType("report.accepted", 1, V), EventType("report.accepted", 2, V)])
    assert catalog.digest(accepted(version=2)) != catalog.digest(accepted(version=1))


def test_digest_ignores_non_material_priority() -> None:
    with_priority = accepted(payload={"report_id": "r1", "subject": "quarterly", "priority": 7})
    assert CATALOG.digest(with_priority) == CATALOG.digest(accepted())
    # control: a material field in the same position does change it
    assert CATALOG.digest(accepted(payload={"report_id": "r1", "subject": "q"})) != CATALOG.digest(
        accepted()
    )


def test_trace_context_is_not_part_of_the_event() -> None:
    # Trace context lives beside the event (outbox row, headers), never in the digest input.
    assert "trace" not in Event.model_fields
    with pytest.raises(ValueError):
        accepted(trace={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"report_id": "r\x001", "subject": "s"}, "payload.report_id"),
        ({"report_id": "r1", "subject": "s", "x": float("nan")}, "payload.x"),
        ({"report_id": "r1", "subject": "s", "x": [1.0, float("inf")]}, "payload.x[1]"),
        ({"report_id": "r1", "subject": "s", "k\x00": 1}, "payload"),
    ],
    ids=["nul", "nan", "inf", "nul-key"],
)
def test_values_postgres_or_json_cannot_keep_are_refused(
    payload: dict[str, Any], field: str
) -> None:
    event = accepted(payload=payload)
    with pytest.raises(InvalidEvent) as info:
        encode_payload(event)
    assert info.value.fields["field"] == field
    with pytest.raises(InvalidEvent):
        CATALOG.validate(event, producing=True)


def test_oversize_payload_is_a_typed_error() -> None:
    fits = accepted(payload={"report_id": "r1", "subject": "s" * 900})
    assert len(encode_payload(fits, max_bytes=1024)) <= 1024  # control
    big = accepted(payload={"report_id": "r1", "subject": "s" * 1100})
    with pytest.raises(PayloadTooLarge) as info:
        encode_payload(big, max_bytes=1024)
    assert info.value.fields["limit"] == 1024 and info.value.reason == "oversize"


def test_unknown_type_and_version_are_typed_errors() -> None:
    CATALOG.validate(accepted(), producing=True)  # control
    with pytest.raises(UnknownEventType) as info:
        CATALOG.validate(accepted(type="report.unknown"), producing=True)
    assert info.value.reason == "unknown_type"
    with pytest.raises(UnknownEventType) as info:
        CATALOG.digest(accepted(version=9))
    assert info.value.fields["known_versions"] == [1]


def test_schema_violation_names_the_fields() -> None:
    with pytest.raises(InvalidEvent) as info:
        CATALOG.validate(accepted(payload={"report_id": "r1"}), producing=True)
    assert info.value.fields["fields"] == ["subject"]


def test_versioned_type_round_trip() -> None:
    assert accepted().ce_type == "report.accepted.v1"
    assert split_versioned_type("report.accepted.v12") == ("report.accepted", 12)
    with pytest.raises(UnknownEventType):
        split_versioned_type("report.accepted")


def test_envelope_is_frozen_and_strict() -> None:
    event = accepted()
    with pytest.raises(ValueError):
        event.tenant = "other"  # type: ignore[misc]
    with pytest.raises(ValueError):
        accepted(tenant="has space")
    with pytest.raises(ValueError):
        accepted(version=0)


# -- one value check for every catalog type, whatever its model ----------------------------


class Loose(BaseModel):
    """An application's own type with unconstrained fields: the model makes nothing safe."""

    note: str = ""
    data: dict[str, Any] = {}


LOOSE = Catalog([EventType("app.noted", 1, Loose)])


def noted(payload: dict[str, Any]) -> Event:
    return Event(
        tenant="tenant-a", operation_id="op-1", type="app.noted", version=1, payload=payload
    )


@pytest.mark.parametrize(
    ("payload", "field", "detail"),
    [
        ({"note": "\ud800"}, "payload.note", "not valid UTF-8 (lone surrogate)"),
        ({"note": "a\udfffb"}, "payload.note", "not valid UTF-8 (lone surrogate)"),
        ({"data": {"k\ud800": 1}}, "payload.data", "bad object key"),
        ({"data": {"k": "\x00"}}, "payload.data.k", "NUL character"),
        ({"data": {"n": 2**53}}, "payload.data.n", "integer outside the I-JSON range"),
        ({"data": {"n": -(2**53)}}, "payload.data.n", "integer outside the I-JSON range"),
        ({"data": {"n": 10**400}}, "payload.data.n", "integer outside the I-JSON range"),
        ({"data": {"x": [0.5, float("-inf")]}}, "payload.data.x[1]", "non-finite number"),
        ({"data": {"b": b"bytes"}}, "payload.data.b", "not a JSON value"),
        ({"data": {"s": {1, 2}}}, "payload.data.s", "not a JSON value"),
        ({"data": {"t": datetime(2026, 1, 1, tzinfo=UTC)}}, "payload.data.t", "not a JSON value"),
        ({"data": {"d": {1: "one", "1": "uno"}}}, "payload.data.d", "bad object key"),
    ],
    ids=[
        "surrogate",
        "low-surrogate",
        "surrogate-key",
        "nul-nested",
        "2**53",
        "-2**53",
        "huge-int",
        "inf-in-list",
        "bytes",
        "set",
        "datetime",
        "int-key",
    ],
)
def test_every_value_check_runs_before_the_model_and_any_encoding(
    payload: dict[str, Any], field: str, detail: str
) -> None:
    event = noted(payload)
    with pytest.raises(InvalidEvent) as info:
        LOOSE.validate(event, producing=True)
    assert (info.value.fields["field"], info.value.fields["detail"]) == (field, detail)
    with pytest.raises(InvalidEvent):  # the encoder alone refuses it the same way
        encode_payload(event)
    with pytest.raises(InvalidEvent):  # and the reading side
        LOOSE.validate(event, producing=False)


def test_json_values_within_range_pass_the_check() -> None:
    payload: dict[str, Any] = {
        "note": "ü \U0001f600 \ufb01",
        "data": {
            "max": 2**53 - 1,
            "min": -(2**53 - 1),
            "f": -0.0,
            "big": 1e308,
            "t": True,
            "none": None,
            "nested": [[{"a": ()}]],
        },
    }
    event = noted(payload)
    LOOSE.validate(event, producing=True)
    assert json.loads(encode_payload(event)) == {
        **payload,
        "data": {**payload["data"], "nested": [[{"a": []}]]},
    }
    assert len(LOOSE.digest(event)) == 64


class Address(StrEnum):
    CITY = "city"
    ZIP = "zip"


def test_str_subclass_keys_take_the_stdlib_encoder_and_keep_the_bytes() -> None:
    """orjson (the fast encoder of bodies and digests) refuses a key that is a str subclass,
    such as a StrEnum member; such a payload takes the stdlib encoder instead, and its body
    and digest are those of the same payload written with plain strings."""
    with pytest.raises(TypeError):  # control: orjson alone refuses the key
        orjson.dumps({Address.CITY: "x"})
    enum_keys = noted({"data": {Address.ZIP: "1000", Address.CITY: Address.CITY}})
    plain_keys = noted({"data": {"zip": "1000", "city": "city"}})
    assert encode_payload(enum_keys) == encode_payload(plain_keys)
    assert encode_payload(enum_keys) == b'{"data":{"zip":"1000","city":"city"}}'
    assert LOOSE.digest(enum_keys) == LOOSE.digest(plain_keys)
    body, digest = LOOSE.prepare(enum_keys, 1024)
    assert (body, digest) == LOOSE.prepare(plain_keys, 1024)


def test_nesting_is_bounded() -> None:
    """At most MAX_DEPTH objects and arrays inside one another, the payload itself first."""
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH - 2):  # inside the payload and its "data"
        deep = [deep]
    LOOSE.validate(noted({"data": {"x": deep}}), producing=True)  # control: at the limit
    with pytest.raises(InvalidEvent) as info:
        LOOSE.validate(noted({"data": {"x": [deep]}}), producing=True)
    assert info.value.fields["detail"] == "nested too deep"


def test_a_payload_naming_another_tenant_is_refused_when_producing() -> None:
    LOOSE.validate(noted({"note": "x"}), producing=True)  # control: no tenant key
    with pytest.raises(TenantConflict) as info:
        LOOSE.validate(
            Event(
                tenant="tenant-a",
                operation_id="op-1",
                type="app.noted",
                version=1,
                payload={"note": "x", "tenant": "tenant-b"},
            ),
            producing=False,
        )
    assert info.value.fields["payload_tenant"] == "tenant-b"


@pytest.mark.parametrize("tail", ["\u0661", "\u00b2", "01", "0", "1000", "1 "])
def test_version_suffix_is_ascii_digits(tail: str) -> None:
    assert split_versioned_type("x.y.v1") == ("x.y", 1)  # control
    with pytest.raises(UnknownEventType):
        split_versioned_type(f"x.y.v{tail}")


def test_a_model_that_raises_outside_pydantic_refuses_the_payload_typed() -> None:
    """pydantic wraps a validator's ValueError, not its TypeError: that one escaped as
    itself, and a consumer crashed on the message at every redelivery instead of poisoning
    it. It is InvalidEvent now, at the producer and the consumer alike. Control: the same
    model accepts a payload its validator takes."""
    from pydantic import field_validator

    class Picky(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def small(cls, value: int) -> int:
            if value > 10:
                raise TypeError("a bug in the application's validator")
            return value

    catalog = Catalog([EventType("picky.made", 1, Picky)])

    def made(n: int) -> Event:
        return Event(
            tenant="acme", operation_id="o-1", type="picky.made", version=1, payload={"n": n}
        )

    catalog.validate(made(3), producing=False)
    for producing in (False, True):
        with pytest.raises(InvalidEvent) as refused:
            catalog.validate(made(11), producing=producing)
        assert "TypeError" in refused.value.fields["detail"]
