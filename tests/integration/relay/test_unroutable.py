"""A row is held as unroutable after the broker returned its publish that many times in a
row (relay_unroutable_attempts), whatever failed before (migration 0048)."""

from __future__ import annotations

import uuid

import asyncpg

from accord.relay import Relay, outbox
from accord.relay.errors import Nacked, PublishFailed, Unroutable
from accord.schemas.topology import Topology
from accord.schemas.wire import WireMessage
from tests.integration.relay import helpers


class Scripted:
    """A double at the broker seam: each publish meets the next failure of its script."""

    def __init__(self, script: list[type[PublishFailed]]) -> None:
        self.script = script

    async def publish(self, message: WireMessage, *, confirm_timeout_s: float) -> None:
        raise self.script.pop(0)()

    def broken(self) -> bool:
        return False

    async def writable(self) -> None:
        return None


async def test_a_row_is_held_after_returns_in_a_row_not_after_other_failures(
    pg_dsn: str, amqp_url: str, topo: Topology
) -> None:
    """Two nacks (a full queue), then returns (its binding gone for a moment during a
    redeploy): the first return no longer holds the row (before, its third claim did, the
    nacks counted as returns); a nack between returns starts the count again; three returns
    in a row hold it (control: the limit still holds)."""
    await helpers.enqueue_committed(pg_dsn, [helpers.make_event(1)])
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    assert relay.config.unroutable_attempts == 3
    script = [Nacked, Nacked, Unroutable, Unroutable, Nacked, Unroutable, Unroutable, Unroutable]
    double = Scripted(script)
    conn = await asyncpg.connect(pg_dsn)
    seen: list[tuple[str, str | None, int]] = []
    try:
        while double.script:
            await conn.execute("UPDATE relay.outbox SET lease_expires_at = NULL")  # no backoff
            token = uuid.uuid4()
            [row] = await outbox.claim(conn, token, 10, 30.0)
            outcomes = await relay._publish_batch(double, [row])
            assert await outbox.settle(conn, token, outcomes) == 1
            state = await conn.fetchrow("SELECT state, last_reason, returns FROM relay.outbox")
            seen.append(tuple(state))
    finally:
        await conn.close()
    assert seen == [
        ("pending", "nacked", 0),
        ("pending", "nacked", 0),
        ("pending", "unroutable", 1),  # attempt 3: before 0048, held here
        ("pending", "unroutable", 2),
        ("pending", "nacked", 0),
        ("pending", "unroutable", 1),
        ("pending", "unroutable", 2),
        ("held", "unroutable", 3),
    ]
