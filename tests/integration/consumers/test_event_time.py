"""The replay window judges when an event was enqueued (``ce-time``, DESIGN §3), not the date
its producer gave it: a backfill dated last month or an appointment dated next week is
content, and is applied with its date; a row enqueued before the window is still refused.
The relay publishes and the consumer runtime consumes, on real RabbitMQ and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from accord.consumers import Handlers, PoisonReason
from accord.relay import Relay
from accord.schemas.events import Event
from accord.schemas.topology import Topology
from tests.integration.consumers.support import (
    INSERT_EFFECT,
    declare_topology,
    report,
    running,
    runtime_for,
)
from tests.integration.relay import helpers
from tests.support import wait_for

pytestmark = pytest.mark.timeout(120)


def dated_handlers(seen: dict[str, datetime]) -> Handlers:
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def apply(tx: Any, event: Event) -> None:
        seen[event.operation_id] = event.occurred_at
        await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

    return handlers


async def _settled(pg: asyncpg.Connection, n: int) -> bool:
    done = await pg.fetchval(
        "SELECT (SELECT count(*) FROM public.effects) + (SELECT count(*) FROM consumers.poison)"
    )
    return bool(done >= n)


async def relay_then_consume(
    amqp_url: str, pg_dsn: str, pg: asyncpg.Connection, topo: Topology, handlers: Handlers, n: int
) -> None:
    await helpers.run_until_settled(
        [Relay(helpers.config(pg_dsn, amqp_url, topo))], pg_dsn, n, within_s=30
    )
    async with running(runtime_for(amqp_url, pg_dsn, topo, handlers)):
        await wait_for(lambda: _settled(pg, n))


async def test_a_backfilled_or_future_dated_event_is_applied_with_its_own_date(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    now = datetime.now(UTC)
    events = [
        report(occurred_at=now),  # control: dated when it is enqueued
        report(occurred_at=now - timedelta(days=30)),  # a backfill: past the 7-day window
        report(occurred_at=now + timedelta(days=2)),  # past the 300 s margin ahead
    ]
    await declare_topology(amqp_url, topo)
    await helpers.enqueue_committed(pg_dsn, events)
    seen: dict[str, datetime] = {}
    await relay_then_consume(amqp_url, pg_dsn, effects_pg, topo, dated_handlers(seen), 3)
    assert await effects_pg.fetch("SELECT reason FROM consumers.poison") == []
    assert seen == {e.operation_id: e.occurred_at for e in events}
    # The inbox judged, and keeps its row by, each row's enqueue time.
    judged = await effects_pg.fetch(
        """SELECT i.occurred_at = o.enqueued_at AS same FROM consumers.inbox i
           JOIN relay.outbox o ON o.event_id = i.event_id"""
    )
    assert [r["same"] for r in judged] == [True, True, True]


async def test_an_event_enqueued_before_the_window_is_still_refused_too_old(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    control, late = report(), report()
    await declare_topology(amqp_url, topo)
    await helpers.enqueue_committed(pg_dsn, [control, late])
    # As a row that waited (held, then released) longer than the window: dated today, it
    # is still older than any inbox row its consumers keep.
    await effects_pg.execute(
        "UPDATE relay.outbox SET enqueued_at = now() - interval '30 days' WHERE event_id = $1",
        late.event_id,
    )
    seen: dict[str, datetime] = {}
    await relay_then_consume(amqp_url, pg_dsn, effects_pg, topo, dated_handlers(seen), 2)
    assert list(seen) == [control.operation_id]
    rows = await effects_pg.fetch("SELECT event_id, reason FROM consumers.poison")
    assert [(r["event_id"], r["reason"]) for r in rows] == [
        (str(late.event_id), PoisonReason.TOO_OLD)
    ]
