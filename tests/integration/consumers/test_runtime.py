"""The consumer runtime on real RabbitMQ and PostgreSQL: commit, then ack; poison; retries."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import aio_pika
import asyncpg
import pytest

from accord.consumers import Handlers, PoisonReason, TransientFailure
from accord.schemas.errors import ConfigError
from accord.schemas.events import Event
from accord.schemas.topology import Topology
from tests.integration.consumers.support import (
    amqp_message,
    counts,
    declare_topology,
    drain_queue,
    effect_handlers,
    publish,
    publish_events,
    queue_depth,
    report,
    running,
    runtime_for,
    wire_message,
)
from tests.support import scaled, wait_for

pytestmark = pytest.mark.timeout(120)


async def _delivered(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM consumers.deliveries") >= n)


async def _poisoned(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM consumers.poison") >= n)


async def test_one_event_delivered_many_times_has_one_effect(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    copies = scaled(1000, 10_000)
    event = report()
    msg = wire_message(event)
    await declare_topology(amqp_url, topo)
    await publish(amqp_url, topo, ((event.ce_type, amqp_message(msg)) for _ in range(copies)))
    async with running(runtime_for(amqp_url, pg_dsn, topo)) as runtime:
        await wait_for(lambda: _delivered(effects_pg, copies))
    assert await effects_pg.fetchval("SELECT count(*) FROM public.effects") == 1
    assert await counts(effects_pg) == {"new": 1, "duplicate": copies - 1}
    assert runtime.stats.new == 1 and runtime.stats.duplicate == copies - 1
    assert await queue_depth(amqp_url, topo.queue("report")) == 0


async def test_changed_digest_is_poisoned_and_dead_lettered(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    first = report("op-7", subject="first meaning")
    changed = report("op-7", subject="another meaning")
    async with running(runtime_for(amqp_url, pg_dsn, topo)):
        await publish_events(amqp_url, topo, [first])  # control: applied
        await wait_for(lambda: _delivered(effects_pg, 1))
        await publish_events(amqp_url, topo, [changed])
        await wait_for(lambda: _poisoned(effects_pg, 1))
    effects = await effects_pg.fetch("SELECT event_id FROM public.effects")
    assert [r["event_id"] for r in effects] == [first.event_id]
    row = await effects_pg.fetchrow("SELECT * FROM consumers.poison")
    assert row["reason"] == PoisonReason.CONFLICT
    assert row["event_id"] == str(changed.event_id) and row["operation_id"] == "op-7"
    detail = json.loads(row["detail"])
    assert detail["stored_digest"] != detail["incoming_digest"]
    assert await counts(effects_pg) == {"new": 1, "conflict": 1}
    dead = await drain_queue(amqp_url, topo.poison_queue("report"))
    assert [m.message_id for m in dead] == [str(changed.event_id)]


async def test_always_transient_handler_is_dead_lettered_after_the_limit(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    seen: list[int] = []
    handlers = effect_handlers()
    failing = Handlers("report")

    @failing.on("report.accepted", 1)
    async def always_fails(tx: Any, event: Event) -> None:
        await tx.execute("SELECT 1")
        seen.append(1)
        raise TransientFailure("downstream unavailable")

    good, bad = report(), report()
    async with running(runtime_for(amqp_url, pg_dsn, topo, handlers)) as ok:
        await publish_events(amqp_url, topo, [good])  # control: the same message succeeds
        await wait_for(lambda: _delivered(effects_pg, 1))
    assert ok.stats.new == 1
    async with running(runtime_for(amqp_url, pg_dsn, topo, failing)) as runtime:
        await publish_events(amqp_url, topo, [bad])
        await wait_for(lambda: _poisoned(effects_pg, 1))
    limit = topo.workflow("report").delivery_limit
    assert len(seen) == limit + 1  # first delivery plus `limit` redeliveries
    assert runtime.stats.retried == limit
    row = await effects_pg.fetchrow("SELECT * FROM consumers.poison")
    assert row["reason"] == PoisonReason.RETRIES_EXHAUSTED
    assert row["delivery_count"] == limit and row["redelivered"] is True
    assert await effects_pg.fetchval("SELECT count(*) FROM public.effects") == 1
    assert (
        await effects_pg.fetchval(
            "SELECT count(*) FROM consumers.inbox WHERE operation_id = $1", bad.operation_id
        )
        == 0
    )
    dead = await drain_queue(amqp_url, topo.poison_queue("report"))
    assert [m.message_id for m in dead] == [str(bad.event_id)]


def _bad_messages() -> list[tuple[PoisonReason, str, aio_pika.Message]]:
    """(expected reason, routing key, message) for each kind of bad input."""
    cases: list[tuple[PoisonReason, str, aio_pika.Message]] = []

    def variant(reason: PoisonReason, body: bytes | None = None, **headers: Any) -> None:
        msg = wire_message(report())
        new_headers = {**msg.headers, **headers}
        for name in [k for k, v in new_headers.items() if v is None]:
            del new_headers[name]
        cases.append(
            (
                reason,
                msg.routing_key,
                aio_pika.Message(
                    body if body is not None else msg.body,
                    headers=new_headers,
                    message_id=msg.message_id,
                    content_type=msg.content_type,
                ),
            )
        )

    variant(PoisonReason.MALFORMED_JSON, b'{"report_id": "r-1", "subject": ')
    variant(PoisonReason.MISSING_HEADER, **{"ce-tenantid": None, "ce-operationid": None})
    variant(PoisonReason.UNKNOWN_VERSION, **{"ce-type": "report.accepted.v9"})
    variant(PoisonReason.TENANT_MISMATCH, **{"ce-tenantid": "globex"})
    variant(
        PoisonReason.NON_FINITE_NUMBER, b'{"report_id": "r-1", "subject": "s", "priority": NaN}'
    )
    variant(PoisonReason.DUPLICATE_KEY, b'{"report_id": "r-1", "report_id": "r-2", "subject": "s"}')
    variant(PoisonReason.INVALID_EVENT, b'{"report_id": "r-1"}')
    variant(PoisonReason.DIGEST_MISMATCH, **{"ce-opdigest": "0" * 64})
    variant(PoisonReason.BAD_HEADER, **{"ce-authepoch": "minus one"})
    return cases


async def test_bad_inputs_get_typed_poison_reasons_and_the_consumer_keeps_running(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    cases = _bad_messages()
    # routing: the unknown version must still reach this queue, so bind it for the test
    wrong_version = Topology(
        topo.prefix,
        (replace(topo.workflows[0], event_types=("report.accepted.v1", "report.accepted.v9")),),
    )
    before, after = report(), report()
    runtime = runtime_for(amqp_url, pg_dsn, wrong_version)
    async with running(runtime):
        await publish_events(amqp_url, topo, [before])  # control
        await wait_for(lambda: _delivered(effects_pg, 1))
        for _, routing_key, message in cases:
            await publish(amqp_url, topo, [(routing_key, message)])
        await wait_for(lambda: _poisoned(effects_pg, len(cases)))
        await publish_events(amqp_url, topo, [after])  # still consuming
        await wait_for(lambda: _delivered(effects_pg, 2))
    rows = {r["message_id"]: r for r in await effects_pg.fetch("SELECT * FROM consumers.poison")}
    assert len(rows) == len(cases)
    for reason, _, message in cases:  # two workers: records may be in any order
        row = rows[message.message_id]
        assert row["reason"] == reason
        assert row["body_size"] == len(message.body)
        assert message.body.decode(errors="replace") not in json.dumps(dict(row), default=str)
    assert runtime.sessions == 1  # never restarted
    assert await effects_pg.fetchval("SELECT count(*) FROM public.effects") == 2
    dead = await drain_queue(amqp_url, topo.poison_queue("report"))
    assert len(dead) == len(cases)
    assert math.isfinite(runtime.stats.poisoned) and runtime.stats.poisoned == len(cases)


async def test_a_topology_that_differs_from_the_brokers_is_a_config_error(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    await declare_topology(amqp_url, topo)
    same = runtime_for(amqp_url, pg_dsn, topo)
    async with running(same):  # control: the declared topology matches
        pass
    other = Topology(topo.prefix, (replace(topo.workflows[0], delivery_limit=9),))
    with pytest.raises(ConfigError):
        await runtime_for(amqp_url, pg_dsn, other).run()
