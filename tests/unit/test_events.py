"""The event envelope and the semantic digest: what it binds, what it ignores, what it refuses."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from accord.demo.catalog import demo_catalog
from accord.schemas.errors import InvalidEvent, PayloadTooLarge, UnknownEventType
from accord.schemas.events import Event, encode_payload, semantic_digest, split_versioned_type

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
