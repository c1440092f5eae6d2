"""Poison records leave after their own retention (consumers.prune_poison, migration 0023),
in bounded batches, through the function only: the consumer role cannot delete one at will."""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from accord.consumers import inbox
from accord.schemas.topology import Topology
from tests.integration.consumers.support import running, runtime_for
from tests.support import wait_for

DAY = 86400.0
INSERT = (
    "INSERT INTO consumers.poison (consumer, queue, reason, redelivered, delivery_count,"
    " headers, body_size, body_sha256, created_at)"
    " VALUES ('report', 'q', 'malformed', false, 0, '{}', 0, repeat('0', 64),"
    " now() - make_interval(secs => $1)) RETURNING id"
)


async def test_poison_records_leave_after_their_retention_in_bounded_batches(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    old = [await pg.fetchval(INSERT, 31 * DAY + n) for n in range(5)]
    young = await pg.fetchval(INSERT, 29 * DAY)
    consumer = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_consumer"})
    try:
        # control: the consumer role cannot remove a poison record by plain SQL
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await consumer.execute("DELETE FROM consumers.poison WHERE id = $1", old[0])
        async with consumer.transaction():
            assert await inbox.prune_poison(consumer, retention_s=40 * DAY) == 0
        batches = []
        for _ in range(3):
            async with consumer.transaction():
                batches.append(await inbox.prune_poison(consumer, retention_s=30 * DAY, limit=2))
        assert batches == [2, 2, 1]
    finally:
        await consumer.close()
    assert [r[0] for r in await pg.fetch("SELECT id FROM consumers.poison")] == [young]


async def test_the_consumer_runtime_prunes_old_poison_with_its_inbox(
    amqp_url: str, pg_dsn: str, pg: asyncpg.Connection, topo: Topology
) -> None:
    old = await pg.fetchval(INSERT, 31 * DAY)
    young = await pg.fetchval(INSERT, 29 * DAY)
    keeping = runtime_for(amqp_url, pg_dsn, topo)  # control: no poison retention, none pruned
    async with running(keeping):
        await anyio.sleep(0.5)
    assert await pg.fetchval("SELECT count(*) FROM consumers.poison") == 2
    async with running(runtime_for(amqp_url, pg_dsn, topo, poison_retention_s=30 * DAY)):

        async def pruned() -> bool:
            return (
                await pg.fetchval("SELECT count(*) FROM consumers.poison WHERE id = $1", old) == 0
            )

        await wait_for(pruned, within=20)
    assert [r[0] for r in await pg.fetch("SELECT id FROM consumers.poison")] == [young]
