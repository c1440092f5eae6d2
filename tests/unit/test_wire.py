"""CloudEvents 1.0 binary mode over AMQP 0-9-1, both directions, against the official SDK."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.core.bindings.rabbitmq import RabbitMQMessage, from_binary, to_binary
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from accord.demo.catalog import demo_catalog
from accord.schemas.errors import MalformedMessage, UnknownEventType
from accord.schemas.events import Event, encode_payload
from accord.schemas.wire import from_amqp, to_amqp

TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


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
        publish_id="p-1",
        trace={"traceparent": TRACEPARENT},
    )
    return message.body, message.headers


def test_round_trip_keeps_event_digest_publish_id_and_trace() -> None:
    e = event()
    message = to_amqp(
        e, encode_payload(e), digest="d" * 64, publish_id="p-1", trace={"traceparent": TRACEPARENT}
    )
    assert message.message_id == str(e.event_id) == message.headers["ce-id"]
    assert message.routing_key == "report.accepted.v1" == message.headers["ce-type"]
    assert message.headers["ce-authepoch"] == "3"
    inbound = from_amqp(message.body, message.headers, message.content_type)
    assert inbound.event == e
    assert inbound.digest == "d" * 64 and inbound.publish_id == "p-1"
    assert inbound.trace == {"traceparent": TRACEPARENT}


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
        (GOOD_BODY, None, "application/json", "missing_header"),
        (GOOD_BODY, broken({"ce-specversion": "0.3"}), "application/json", "bad_specversion"),
        (GOOD_BODY, broken({}), "text/plain", "bad_content_type"),
        (GOOD_BODY, broken({"ce-authepoch": "-1"}), "application/json", "bad_header"),
        (GOOD_BODY, broken({"ce-id": b"\xff\xfe"}), "application/json", "bad_header"),
        (GOOD_BODY, broken({"ce-id": 42}), "application/json", "bad_header"),
        (GOOD_BODY, broken({"cloudEvents_id": "x"}), "application/json", "duplicate_header"),
        (GOOD_BODY, broken({"ce-id": "not-a-uuid"}), "application/json", "bad_attribute"),
        (GOOD_BODY, broken({"ce-time": "yesterday"}), "application/json", "bad_attribute"),
        (GOOD_BODY, broken({"ce-tenantid": "has space"}), "application/json", "bad_attribute"),
        (b"{not json", broken({}), "application/json", "malformed_json"),
        (b"\xff\xfe", broken({}), "application/json", "malformed_json"),
        (b'{"a":1,"a":2}', broken({}), "application/json", "duplicate_key"),
        (b'{"a":NaN}', broken({}), "application/json", "non_finite_number"),
        (b"[1,2]", broken({}), "application/json", "body_not_object"),
    ],
    ids=[
        "missing-tenant",
        "no-headers",
        "specversion",
        "content-type",
        "authepoch",
        "header-not-utf8",
        "header-not-text",
        "two-prefixes",
        "bad-id",
        "bad-time",
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
