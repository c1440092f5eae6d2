"""Property tests on the real database (issue #16): whatever a producer hands ``enqueue``,
and whatever a delivery carries, the answer is a typed accord error or success, never
another exception; and what is accepted or recorded is what PostgreSQL keeps.

- enqueue (``accord.relay.enqueue`` in a transaction, rolled back after each example) with
  a type whose model is unconstrained: arbitrary JSON-like and Python payloads. What it
  accepts, jsonb accepts too (a consumer stores payloads as jsonb: jobs.submit).
- the consumer's judging of one delivery (``BatchProcessor.admit``: the size bound, the
  parser, the catalog) on arbitrary bodies and header values, then, for a permanent error,
  its poison record written into consumers.poison: always storable.
Bigger runs under ACCORD_SOAK=1.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.trace import NoOpTracer

from accord.consumers import Consumer, Handlers, poison
from accord.consumers.batch import BatchProcessor
from accord.relay import enqueue
from accord.schemas.errors import AccordError
from accord.schemas.events import Event, encode_payload
from tests.support import scaled
from tests.unit.test_input_properties import (
    BODIES,
    GOOD,
    HEADER_NAMES,
    HEADER_VALUES,
    LOOSE,
    PYTHON_LIKE,
    TEXT,
)

pytestmark = pytest.mark.timeout(600)

ON_THE_DATABASE = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@settings(ON_THE_DATABASE, max_examples=scaled(60, 1000))
@given(payload=st.dictionaries(TEXT, PYTHON_LIKE, max_size=4), note=TEXT)
async def test_enqueue_raises_only_typed_errors_and_jsonb_keeps_what_it_accepts(
    pg: asyncpg.Connection, payload: dict[str, Any], note: str
) -> None:
    event = Event(
        tenant="acme",
        operation_id=f"op-{uuid.uuid4().hex[:8]}",
        type="app.noted",
        version=1,
        payload={"note": note, "data": payload},
    )
    tx = pg.transaction()
    await tx.start()
    try:
        try:
            row_id = await enqueue(pg, event, catalog=LOOSE)
        except AccordError:
            return
        stored = await pg.fetchval(
            "SELECT convert_from(body, 'UTF8')::jsonb::text FROM relay.outbox WHERE id = $1",
            row_id,
        )
        # the same document (jsonb keeps numbers as decimals: compare them as doubles)
        assert _doubles(stored) == _doubles(encode_payload(event))
        # what a consumer does with it (jobs.submit: json.dumps(payload) as jsonb) works too
        await pg.fetchval("SELECT $1::jsonb", json.dumps(event.payload))
    finally:
        await tx.rollback()


def _doubles(text: str | bytes) -> Any:
    return json.loads(text, parse_int=float, parse_float=float)


@dataclass
class Delivered:
    """The part of aio_pika's incoming message that judging and the poison record read."""

    body: bytes
    headers: dict[str, Any]
    content_type: str | None
    message_id: Any = None
    routing_key: str | None = "app.noted.v1"
    redelivered: bool = False
    delivery_tag: int = 1


PROCESSOR = BatchProcessor(
    consumer=Consumer("noted", LOOSE, 7 * 24 * 3600.0),
    handlers=Handlers("noted"),
    tenants=frozenset({"acme"}),
    queue="t.noted",
    delivery_limit=3,
    tracer=NoOpTracer(),
    max_body_bytes=512,
)


@settings(ON_THE_DATABASE, max_examples=scaled(100, 2000))
@given(
    body=st.one_of(st.none(), BODIES, st.binary(min_size=513, max_size=600)),
    changes=st.one_of(
        st.just({}),
        st.dictionaries(HEADER_NAMES, st.one_of(st.none(), HEADER_VALUES), max_size=3),
    ),
    message_id=st.one_of(st.none(), TEXT),
    content_type=st.sampled_from(["application/json", None, "text/plain"]),
)
async def test_every_refused_delivery_gets_a_storable_poison_record(
    pg: asyncpg.Connection,
    body: bytes | None,
    changes: dict[str, Any],
    message_id: str | None,
    content_type: str | None,
) -> None:
    good_body, good_headers = GOOD["loose"]
    headers = dict(good_headers)
    for name, value in changes.items():
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    message = Delivered(good_body if body is None else body, headers, content_type, message_id)
    item = PROCESSOR.admit(message)  # type: ignore[arg-type]
    item.span.end()
    if item.permanent is None:
        assert item.event is not None and item.digest is not None
        return
    record = PROCESSOR._record(item)
    assert record.reason in set(poison.PoisonReason)
    tx = pg.transaction()
    await tx.start()
    try:
        poison_id, _ = await poison.record_poison(pg, record)
        stored = await pg.fetchrow(
            "SELECT reason, detail FROM consumers.poison WHERE id = $1", poison_id
        )
        assert stored["reason"] == record.reason
    finally:
        await tx.rollback()
