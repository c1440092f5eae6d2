"""Property tests: whatever a producer or the wire hands accord, the answer is a typed accord
error or success, never another exception (issue #16).

The consumer's parser (``from_amqp``, then the catalog) gets arbitrary bodies (bytes, and
JSON-like documents with surrogates, NUL, huge numbers, NaN and infinities, deep nesting)
and arbitrary header values; the producer's checks get arbitrary Python payloads. A type
with unconstrained fields (``str``, ``dict[str, Any]``) is the subject: nothing may rest on
a model's bounds. Bigger runs under ACCORD_SOAK=1.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_event
from hypothesis import strategies as st
from pydantic import BaseModel

from accord.consumers import poison
from accord.demo.catalog import demo_catalog
from accord.schemas.errors import AccordError
from accord.schemas.events import Catalog, Event, EventType, encode_payload
from accord.schemas.wire import from_amqp, to_amqp
from tests.support import scaled


class Loose(BaseModel):
    note: str = ""
    data: dict[str, Any] = {}


LOOSE = Catalog([EventType("app.noted", 1, Loose)])
DEMO = demo_catalog()
PARSER_EXAMPLES = scaled(200, 5000)
PRODUCER_EXAMPLES = scaled(200, 5000)
PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text with what breaks encoders: NUL, lone surrogates (hypothesis leaves out category Cs
# unless told), astral characters, non-ASCII digits.
_SPECIAL = st.sampled_from(["\x00", "\ud800", "\udfff", "\U0001f600", "\u0661", "\u00b2", "é"])
TEXT = st.text(
    st.one_of(st.characters(exclude_categories=()), _SPECIAL, st.characters(max_codepoint=127)),
    max_size=12,
)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=2**53 - 2, max_value=2**53 + 2),
    st.integers(min_value=-(2**53) - 2, max_value=-(2**53) + 2),
    st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_LIKE = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=20,
)
# What a Python producer may also put in a payload dict: not JSON at all.
NOT_JSON = st.one_of(
    st.binary(max_size=4),
    st.frozensets(st.integers(), max_size=2),
    st.just(datetime(2026, 1, 1, tzinfo=UTC)),
    st.just(Decimal("1.5")),
    st.just(uuid.UUID(int=1)),
    st.tuples(st.integers()),
)
PYTHON_LIKE = st.recursive(
    st.one_of(SCALARS, NOT_JSON),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(TEXT, st.integers()), inner, max_size=4),
    ),
    max_leaves=20,
)
HEADER_VALUES = st.one_of(
    TEXT,
    st.binary(max_size=20),
    st.integers(),
    st.booleans(),
    st.none(),
    st.floats(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(Decimal("3")),
    st.just(datetime(2026, 1, 1, tzinfo=UTC)),
    # near misses of the real formats
    st.sampled_from(
        ["\u0661", "\uff11", "1" * 19, "3", "0", "", " 1", "report.accepted.v1",
         "report.accepted.v\u0661", "app.noted.v1", "2026-01-02T03:04:05Z",
         "2026-01-02T03:04:05", "20260102T030405Z", "d" * 64, "D" * 64,
         str(uuid.UUID(int=7)), str(uuid.UUID(int=7)).upper(), "{" + str(uuid.UUID(int=7)) + "}",
         "acme", "ac me", "op-1", "1.0", "0.3"]
    ),
)  # fmt: skip
HEADER_NAMES = st.sampled_from(
    ["ce-id", "ce-type", "ce-source", "ce-specversion", "ce-time", "ce-tenantid",
     "ce-operationid", "ce-authepoch", "ce-opdigest", "publish-id", "Publish-Id",
     "traceparent", "tracestate", "cloudEvents_id", "cloudEvents:tenantid", "CE-TYPE",
     "x-delivery-count", "ce-other"]
)  # fmt: skip


def valid(catalog: Catalog, type_: str, payload: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    event = Event(tenant="acme", operation_id="op-1", type=type_, version=1, payload=payload)
    message = to_amqp(
        event,
        encode_payload(event),
        digest=catalog.digest(event),
        publish_id=str(uuid.uuid4()),
    )
    return message.body, dict(message.headers)


GOOD = {
    "loose": valid(LOOSE, "app.noted", {"note": "n", "data": {"k": [1, 2.5, None]}}),
    "demo": valid(DEMO, "report.accepted", {"report_id": "r1", "subject": "s"}),
}
CATALOGS = {"loose": LOOSE, "demo": DEMO}


def _body(doc: Any, ensure_ascii: bool) -> bytes:
    # allow_nan: NaN and Infinity reach the wire; surrogatepass: invalid UTF-8 reaches it too
    return json.dumps(doc, ensure_ascii=ensure_ascii, allow_nan=True).encode(
        "utf-8", "surrogatepass"
    )


BODIES = st.one_of(
    st.binary(max_size=64),
    st.builds(_body, JSON_LIKE, st.booleans()),
    st.builds(_body, st.dictionaries(TEXT, JSON_LIKE, max_size=5), st.booleans()),
    st.builds(
        lambda data, note, tenant, a: _body({"note": note, "data": data, **tenant}, a),
        st.dictionaries(TEXT, JSON_LIKE, max_size=4),
        TEXT,
        st.one_of(st.just({}), st.fixed_dictionaries({"tenant": st.one_of(TEXT, st.just("acme"))})),
        st.booleans(),
    ),
)


def assert_storable(exc: AccordError) -> None:
    """What a poison record keeps of the error is text PostgreSQL's jsonb accepts."""
    reason = poison.reason_for(exc)
    assert reason in set(poison.PoisonReason)
    text = json.dumps(poison.error_detail(exc), ensure_ascii=False)
    text.encode("utf-8")  # no lone surrogate
    assert "\x00" not in text and "\\u0000" not in text


@settings(PROPERTY, max_examples=PARSER_EXAMPLES)
@given(
    which=st.sampled_from(sorted(GOOD)),
    body=st.one_of(st.none(), BODIES),
    # Often the headers of a good message, so that the bodies reach the catalog.
    changes=st.one_of(
        st.just({}),
        st.dictionaries(HEADER_NAMES, st.one_of(st.none(), HEADER_VALUES), max_size=3),
    ),
    content_type=st.sampled_from(["application/json", None, "", "text/plain"]),
)
def test_the_consumer_parser_raises_only_typed_errors(
    which: str, body: bytes | None, changes: dict[str, Any], content_type: str | None
) -> None:
    good_body, good_headers = GOOD[which]
    headers = dict(good_headers)
    for name, value in changes.items():
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    catalog = CATALOGS[which]
    try:
        inbound = from_amqp(good_body if body is None else body, headers, content_type)
        catalog.validate(inbound.event, producing=False)
        digest = catalog.digest(inbound.event)
    except AccordError as exc:
        note_event(f"{type(exc).__name__} {poison.reason_for(exc)}")
        assert_storable(exc)
        return
    note_event("accepted")
    # Success: the payload is safe to encode again, digest and store as jsonb.
    again = encode_payload(inbound.event)
    assert json.loads(again) == inbound.event.payload
    assert "\\u0000" not in again.decode()
    assert len(digest) == 64
    assert poison.summarize_headers(headers) is not None


@settings(PROPERTY, max_examples=PRODUCER_EXAMPLES)
@given(payload=st.dictionaries(TEXT, PYTHON_LIKE, max_size=4), note=TEXT)
def test_the_producer_checks_raise_only_typed_errors(payload: dict[str, Any], note: str) -> None:
    """validate → encode → digest, as enqueue runs them; what passes reads back the same."""
    event = Event(
        tenant="acme",
        operation_id="op-1",
        type="app.noted",
        version=1,
        payload={"note": note, "data": payload},
    )
    try:
        LOOSE.validate(event, producing=True)
        body = encode_payload(event)
        digest = LOOSE.digest(event)
    except AccordError as exc:
        note_event(f"{type(exc).__name__} {exc.fields.get('detail')}")
        return
    note_event("accepted")
    message = to_amqp(event, body, digest=digest, publish_id=str(uuid.uuid4()))
    inbound = from_amqp(message.body, message.headers, message.content_type)
    assert inbound.event.payload == json.loads(body)
    assert LOOSE.digest(inbound.event) == digest  # the consumer computes the same digest
    for value in _leaves(inbound.event.payload):
        assert not (isinstance(value, float) and not math.isfinite(value))


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]
