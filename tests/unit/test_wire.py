"""CloudEvents 1.0 binary mode over AMQP 0-9-1, both directions, against the official SDK."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from cloudevents.core.bindings.rabbitmq import RabbitMQMessage, from_binary, to_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from accord.demo.catalog import demo_catalog
from accord.schemas.errors import InvalidEvent, MalformedMessage, TenantConflict, UnknownEventType
from accord.schemas.events import Event, encode_payload
from accord.schemas.wire import from_amqp, to_amqp

TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
PUBLISH_ID = "0b9c7f8e-3a1d-4c2b-9e5f-6a7b8c9d0e1f"


def event() -> Event:
    return Event(
        tenant="tenant-a",
        operation_id="op-1",
        type="report.accepted",
        version=1,
        authority_epoch=3,
        payload={"report_id": "r1", "subject": "quarterly ü"},
        occurred_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    )


def wire_headers(e: Event | None = None) -> tuple[bytes, dict[str, str]]:
    e = e or event()
    message = to_amqp(
        e,
        encode_payload(e),
        digest=demo_catalog().digest(e),
        publish_id=PUBLISH_ID,
        trace={"traceparent": TRACEPARENT},
    )
    return message.body, message.headers


def test_round_trip_keeps_event_digest_publish_id_and_trace() -> None:
    e = event()
    message = to_amqp(
        e,
        encode_payload(e),
        digest="d" * 64,
        publish_id=PUBLISH_ID,
        trace={"traceparent": TRACEPARENT},
    )
    assert message.message_id == str(e.event_id) == message.headers["ce-id"]
    assert message.routing_key == "report.accepted.v1" == message.headers["ce-type"]
    assert message.headers["ce-authepoch"] == "3"
    inbound = from_amqp(message.body, message.headers, message.content_type)
    assert inbound.event == e
    assert inbound.digest == "d" * 64 and inbound.publish_id == PUBLISH_ID
    assert inbound.trace == {"traceparent": TRACEPARENT}


def test_the_time_is_the_enqueue_time_and_the_event_keeps_its_own_date() -> None:
    """DESIGN §3: ``ce-time`` is the enqueue time, which the replay window judges; the
    event's own ``occurred_at`` (here a month earlier) travels as ``occurredat``."""
    e = event()
    enqueued = e.occurred_at + timedelta(days=30)
    message = to_amqp(e, encode_payload(e), digest="d" * 64, publish_id=PUBLISH_ID,
                      enqueued_at=enqueued)  # fmt: skip
    assert message.headers["ce-time"] == "2026-02-01T03:04:05.678901Z"
    assert message.headers["ce-occurredat"] == "2026-01-02T03:04:05.678901Z"
    inbound = from_amqp(message.body, message.headers, message.content_type)
    assert inbound.event == e and inbound.enqueued_at == enqueued
    ce = from_binary(
        RabbitMQMessage(message.headers, "application/json", message.body), JSONFormat(), CloudEvent
    )
    assert ce.get_time() == enqueued
    assert ce.get_extension("occurredat") == "2026-01-02T03:04:05.678901Z"
    # Control: a message with no occurredat (a producer before it, or any other) is dated
    # by its time, as before.
    plain = to_amqp(e, encode_payload(e), digest="d" * 64, publish_id=PUBLISH_ID)
    assert "ce-occurredat" not in plain.headers
    inbound = from_amqp(plain.body, plain.headers, plain.content_type)
    assert inbound.event.occurred_at == inbound.enqueued_at == e.occurred_at


def test_our_message_reads_with_the_sdk() -> None:
    e = event()
    body, headers = wire_headers(e)
    ce = from_binary(RabbitMQMessage(headers, "application/json", body), JSONFormat(), CloudEvent)
    assert ce.get_id() == str(e.event_id)
    assert ce.get_type() == "report.accepted.v1"
    assert ce.get_specversion() == "1.0"
    assert ce.get_source() == "/accord"
    assert ce.get_time() == e.occurred_at
    assert ce.get_datacontenttype() == "application/json"
    assert ce.get_extension("tenantid") == "tenant-a"
    assert ce.get_extension("operationid") == "op-1"
    assert ce.get_extension("authepoch") == "3"
    assert ce.get_extension("opdigest") == demo_catalog().digest(e)
    assert ce.get_data() == e.payload


def test_sdk_message_reads_with_ours() -> None:
    event_id = str(uuid.uuid4())
    when = datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)
    ce = CloudEvent(
        attributes={
            "id": event_id,
            "type": "report.accepted.v1",
            "source": "/elsewhere",
            "specversion": "1.0",
            "time": when,
            "datacontenttype": "application/json",
            "tenantid": "tenant-b",
            "operationid": "op-9",
            "authepoch": "12",
            "opdigest": "f" * 64,
        },
        data={"report_id": "r9", "subject": "s"},
    )
    message = to_binary(ce, JSONFormat())
    inbound = from_amqp(message.body, message.headers, message.content_type)
    assert inbound.event.event_id == uuid.UUID(event_id)
    assert (inbound.event.type, inbound.event.version) == ("report.accepted", 1)
    assert inbound.event.tenant == "tenant-b" and inbound.event.operation_id == "op-9"
    assert inbound.event.authority_epoch == 12
    assert inbound.event.occurred_at == when
    assert inbound.event.payload == {"report_id": "r9", "subject": "s"}
    assert inbound.digest == "f" * 64 and inbound.publish_id is None


@pytest.mark.parametrize("prefix", ["ce-", "cloudEvents_", "cloudEvents:", "CE-"])
def test_every_accepted_prefix_reads(prefix: str) -> None:
    body, headers = wire_headers()
    renamed = {
        (prefix + k[3:] if k.startswith("ce-") else k): v.encode() if k == "ce-id" else v
        for k, v in headers.items()
    }
    assert from_amqp(body, renamed).event == from_amqp(body, headers).event


def broken(change: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    _, headers = wire_headers()
    result: dict[str, Any] = {k: v for k, v in headers.items() if k not in drop}
    result.update(change)
    return result


GOOD_BODY, _ = wire_headers()


@pytest.mark.parametrize(
    ("body", "headers", "content_type", "problem"),
    [
        (GOOD_BODY, broken({}, drop=("ce-tenantid",)), "application/json", "missing_header"),
        # Without its time, an event would be dated by the consumer's clock: new at every
        # redelivery once its inbox row was pruned, past the replay window's refusal.
        (GOOD_BODY, broken({}, drop=("ce-time",)), "application/json", "missing_header"),
        (GOOD_BODY, None, "application/json", "missing_header"),
        (GOOD_BODY, broken({"ce-specversion": "0.3"}), "application/json", "bad_specversion"),
        (GOOD_BODY, broken({}), "text/plain", "bad_content_type"),
        (GOOD_BODY, broken({}), "application/json; charset=latin-1", "bad_content_type"),
        (GOOD_BODY, broken({}), "application/jsonp", "bad_content_type"),
        (GOOD_BODY, broken({"ce-authepoch": "-1"}), "application/json", "bad_header"),
        (GOOD_BODY, broken({"ce-id": b"\xff\xfe"}), "application/json", "bad_header"),
        (GOOD_BODY, broken({"ce-id": 42}), "application/json", "bad_header"),
        (GOOD_BODY, broken({"cloudEvents_id": "x"}), "application/json", "duplicate_header"),
        (GOOD_BODY, broken({"ce-id": "not-a-uuid"}), "application/json", "bad_attribute"),
        (GOOD_BODY, broken({"ce-time": "yesterday"}), "application/json", "bad_attribute"),
        (GOOD_BODY, broken({"ce-occurredat": "2026-01-02"}), "application/json", "bad_attribute"),
        (GOOD_BODY, broken({"ce-tenantid": "has space"}), "application/json", "bad_attribute"),
        (b"{not json", broken({}), "application/json", "malformed_json"),
        (b"\xff\xfe", broken({}), "application/json", "malformed_json"),
        (b'{"a":1,"a":2}', broken({}), "application/json", "duplicate_key"),
        (b'{"a":NaN}', broken({}), "application/json", "non_finite_number"),
        (b"[1,2]", broken({}), "application/json", "body_not_object"),
    ],
    ids=[
        "missing-tenant",
        "missing-time",
        "no-headers",
        "specversion",
        "content-type",
        "content-type-latin-1",
        "content-type-jsonp",
        "authepoch",
        "header-not-utf8",
        "header-not-text",
        "two-prefixes",
        "bad-id",
        "bad-time",
        "bad-occurredat",
        "bad-tenant",
        "bad-json",
        "body-not-utf8",
        "duplicate-key",
        "nan",
        "array-body",
    ],
)
def test_malformed_inputs_raise_a_specific_problem(
    body: bytes, headers: dict[str, Any] | None, content_type: str, problem: str
) -> None:
    from_amqp(GOOD_BODY, broken({}), "application/json")  # control: the good message reads
    with pytest.raises(MalformedMessage) as info:
        from_amqp(body, headers, content_type)
    assert info.value.fields["problem"] == problem
    assert info.value.reason == "malformed"


def test_type_without_version_is_an_unknown_type() -> None:
    with pytest.raises(UnknownEventType):
        from_amqp(GOOD_BODY, broken({"ce-type": "report.accepted"}))


def test_body_bytes_are_the_domain_json() -> None:
    e = event()
    body, _ = wire_headers(e)
    assert json.loads(body) == e.payload
    assert b" " not in body.replace(b"quarterly \xc3\xbc", b"")  # compact, UTF-8 kept


# -- strict header values: exact formats, never what a lenient library would accept --------


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"ce-authepoch": "\u0661"}, "bad_header"),  # ARABIC-INDIC DIGIT ONE: isdigit() is True
        ({"ce-authepoch": "\u00b2"}, "bad_header"),  # SUPERSCRIPT TWO
        ({"ce-authepoch": "\uff11\uff12"}, "bad_header"),  # FULLWIDTH "12"
        ({"ce-authepoch": "3 "}, "bad_header"),
        ({"ce-authepoch": "1" * 19}, "bad_header"),  # beyond PostgreSQL's bigint
        ({"ce-opdigest": "D" * 64}, "bad_header"),
        ({"ce-opdigest": "d" * 63}, "bad_header"),
        ({"publish-id": "p-1"}, "bad_header"),
        ({"publish-id": PUBLISH_ID.upper()}, "bad_header"),
        ({"publish-id": PUBLISH_ID, "Publish-Id": PUBLISH_ID}, "duplicate_header"),
        ({"ce-time": "2026-01-02T03:04:05"}, "bad_attribute"),  # no offset
        ({"ce-time": "2026-01-02 03:04:05Z"}, "bad_attribute"),  # a space
        ({"ce-time": "2026-01-02"}, "bad_attribute"),
        ({"ce-time": "20260102T030405Z"}, "bad_attribute"),  # fromisoformat takes it
        ({"ce-time": "2026-W01-5T03:04:05Z"}, "bad_attribute"),  # and this
        ({"ce-time": "2026-01-02T03:04:05+0000"}, "bad_attribute"),  # and this
        ({"ce-time": "2026-01-02T03:04Z"}, "bad_attribute"),
        ({"ce-time": "2026-01-02T03:04:60Z"}, "bad_attribute"),
        ({"ce-time": "\u0662026-01-02T03:04:05Z"}, "bad_attribute"),
        ({"ce-time": ""}, "missing_header"),  # required: an empty one is none
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else v,
)
def test_header_values_are_read_by_exact_format(change: dict[str, Any], problem: str) -> None:
    from_amqp(GOOD_BODY, broken({}))  # control: the same message with our own values reads
    with pytest.raises(MalformedMessage) as info:
        from_amqp(GOOD_BODY, broken(change))
    assert info.value.fields["problem"] == problem


@pytest.mark.parametrize(
    "text",
    [
        lambda u: str(u).upper(),
        lambda u: "{" + str(u) + "}",
        lambda u: "urn:uuid:" + str(u),
        lambda u: u.hex,
        lambda u: str(u).replace("a", "\u0661") if "a" in str(u) else "\u0661" + str(u)[1:],
    ],
    ids=["upper", "braces", "urn", "no-hyphens", "non-ascii-digit"],
)
def test_event_id_is_canonical_uuid_text(text: Any) -> None:
    e = event()
    body, headers = wire_headers(e)
    assert from_amqp(body, headers).event.event_id == e.event_id  # control
    with pytest.raises(MalformedMessage) as info:
        from_amqp(body, {**headers, "ce-id": text(e.event_id)})
    assert info.value.fields["problem"] == "bad_attribute"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-02T03:04:05Z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2026-01-02t03:04:05z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2026-01-02T03:04:05.5Z", datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)),
        ("2026-01-02T03:04:05.123456789Z", datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        (
            "2026-01-02T03:04:05-05:30",
            datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(-timedelta(hours=5, minutes=30))),
        ),
        ("2026-01-02T03:04:05-00:00", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ],
)
def test_rfc3339_times_with_an_offset_read_timezone_aware(text: str, expected: datetime) -> None:
    inbound = from_amqp(GOOD_BODY, broken({"ce-time": text}))
    assert inbound.event.occurred_at == expected
    assert inbound.event.occurred_at.utcoffset() == expected.utcoffset()


@pytest.mark.parametrize(
    ("edge", "past"),
    [
        ("0001-01-01T01:00:00+01:00", "0001-01-01T00:30:00+01:00"),
        ("9999-12-31T23:00:00-00:59", "9999-12-31T23:30:00-01:00"),
    ],
)
@pytest.mark.parametrize("header", ["ce-time", "ce-occurredat"])
def test_a_time_outside_the_years_once_in_utc_is_a_bad_attribute(
    edge: str, past: str, header: str
) -> None:
    """Valid RFC 3339 whose instant falls before year 1 or after 9999 once in UTC: no write
    can take it (asyncpg cannot encode it), so it is refused where it is read, not met by the
    inbox's statement. Control: the same edge inside the range reads."""
    assert from_amqp(GOOD_BODY, broken({header: edge}))  # control
    with pytest.raises(MalformedMessage) as info:
        from_amqp(GOOD_BODY, broken({header: past}))
    assert info.value.fields["problem"] == "bad_attribute"


def test_sdk_times_with_an_offset_and_fraction_read() -> None:
    when = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=-5)))
    ce = CloudEvent(
        attributes={
            "id": str(uuid.uuid4()),
            "type": "report.accepted.v1",
            "source": "/elsewhere",
            "specversion": "1.0",
            "time": when,
            "tenantid": "tenant-b",
            "operationid": "op-9",
            "authepoch": "0",
        },
        data={"report_id": "r9", "subject": "s"},
    )
    message = to_binary(ce, JSONFormat())
    assert from_amqp(message.body, message.headers, message.content_type).event.occurred_at == when


@pytest.mark.parametrize("suffix", ["v\u0661", "v\u00b9", "v01", "v1000", "v"])
def test_type_version_is_ascii_digits(suffix: str) -> None:
    assert from_amqp(GOOD_BODY, broken({"ce-type": "report.accepted.v1"}))  # control
    with pytest.raises(UnknownEventType):
        from_amqp(GOOD_BODY, broken({"ce-type": f"report.accepted.{suffix}"}))


@pytest.mark.parametrize("key", ["tenant", "tenantid"])
def test_a_body_naming_another_tenant_is_a_tenant_conflict(key: str) -> None:
    same = {"report_id": "r1", "subject": "s", key: "tenant-a"}  # the header's tenant
    assert from_amqp(json.dumps(same).encode(), broken({})).event.payload == same  # control
    for other in ("tenant-b", 7, None, {"id": "tenant-a"}):
        with pytest.raises(TenantConflict) as info:
            from_amqp(json.dumps({**same, key: other}).encode(), broken({}))
        assert info.value.reason == "tenant_conflict"
        assert info.value.fields["tenant"] == "tenant-a" and info.value.fields["key"] == key


@pytest.mark.parametrize(
    "body",
    [
        b'{"n": ' + b"9" * 5000 + b"}",  # beyond int_max_str_digits: a ValueError
        b'{"n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # a RecursionError
    ],
    ids=["huge-integer", "deep-nesting"],
)
def test_json_the_parser_cannot_hold_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedMessage) as info:
        from_amqp(body, broken({}))
    assert info.value.fields["problem"] == "malformed_json"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (rb'"a\u0000b"', "payload.subject"),  # jsonb refuses it (22P05)
        (rb'"\ud800"', "payload.subject"),  # a lone surrogate: not UTF-8
        (rb"9007199254740992", "payload.subject"),  # beyond I-JSON's 2**53 - 1
        (rb"1e400", "payload.subject"),  # json reads it as inf
    ],
    ids=["nul", "surrogate", "big-integer", "overflowing-float"],
)
def test_values_json_accepts_but_accord_refuses_are_invalid_events(raw: bytes, field: str) -> None:
    body = b'{"report_id":"r1","subject":' + raw + b"}"
    inbound = from_amqp(body, broken({}))  # well formed JSON ...
    with pytest.raises(InvalidEvent) as info:  # ... whose values are refused before any model
        demo_catalog().validate(inbound.event, producing=False)
    assert info.value.fields["field"] == field


@pytest.mark.parametrize(
    "odd",
    [
        {"traceparent": 12345},
        {"traceparent": b"\xff\xfe"},
        {"tracestate": ["a=1"]},
        {"Traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    ],
    ids=["not-text", "not-utf8", "a-list", "twice"],
)
def test_a_trace_header_that_cannot_be_read_is_dropped_never_refusing_the_event(
    odd: dict[str, Any],
) -> None:
    """W3C Trace Context: an invalid trace header is ignored (a new trace starts). It is
    never a reason to dead-letter a sound event. Control: a readable one is kept."""
    e = event()
    body, headers = wire_headers(e)
    inbound = from_amqp(body, headers)
    assert inbound.trace == {"traceparent": TRACEPARENT}
    name = next(iter(odd)).lower()
    inbound = from_amqp(body, {**headers, **odd})
    assert inbound.event == e
    assert name not in inbound.trace


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "APPLICATION/JSON", "application/json; charset=utf-8",
     'application/json;charset="UTF-8"', "", None],
)  # fmt: skip
def test_json_in_utf8_however_spelt_is_accepted(content_type: str | None) -> None:
    """Another CloudEvents producer may spell the media type with a charset or in capitals:
    the same JSON (before, poisoned bad_content_type; control: text/plain and a latin-1
    charset are still refused, above)."""
    body, headers = wire_headers()
    assert from_amqp(body, headers, content_type).event == from_amqp(body, headers).event
