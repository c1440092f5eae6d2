"""`accord relay` when its exchange is deleted under it: the rows wait, the process stays,
and publishing resumes once the exchange is there again (declared by the relay's next
session when it declares the topology, else by whoever owns the topology). Before, the next
session's check ended the relay (exit 2) and its rows waited for a restart."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aio_pika
import anyio
import asyncpg
import pytest

from accord.demo import demo_topology
from accord.schemas import topology as topologies
from accord.schemas.events import Event
from tests.conftest import BrokerNames
from tests.support import enqueue, wait_for

STATE = "SELECT state FROM relay.outbox WHERE operation_id = $1"


async def _submit(pg: asyncpg.Connection, n: int) -> str:
    operation = f"report:x{n}"
    async with pg.transaction():
        await enqueue(pg, Event(
            tenant="acme", operation_id=operation, type="report.accepted", version=1,
            payload={"report_id": f"x{n}", "subject": "topology"},
        ))  # fmt: skip
    return operation


async def _published(pg: asyncpg.Connection, operation: str) -> None:
    async def published() -> bool:
        return bool(await pg.fetchval(STATE, operation) == "published")

    await wait_for(published, within=45)


async def _received(queue: aio_pika.abc.AbstractQueue, n: int) -> list[Any]:
    ids: list[Any] = []

    async def got() -> bool:
        message = await queue.get(fail=False)
        if message is not None:
            await message.ack()
            ids.append(message.message_id)
        return len(ids) >= n

    await wait_for(got, within=30)
    return ids


def _demo_relay(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames
) -> tuple[topologies.Topology, dict[str, str]]:
    """The demo's topology under this test's prefix (deleted after it), and the environment
    of an `accord relay` publishing to it."""
    names = demo_topology(broker_names.prefix)
    exchanges, queues = names.names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    env = {
        **os.environ,
        "ACCORD_APP": "accord.demo:app",
        "ACCORD_PG_DSN": pg_dsn,
        "ACCORD_AMQP_URL": amqp_url,
        "ACCORD_TOPOLOGY_PREFIX": broker_names.prefix,
        "ACCORD_RELAY_POLL_S": "0.1",
    }
    return names, env


@pytest.mark.timeout(150)
@pytest.mark.parametrize("declares", [True, False])
async def test_a_relay_whose_exchange_is_deleted_waits_and_resumes(
    pg_dsn: str,
    pg: asyncpg.Connection,
    amqp_url: str,
    broker_names: BrokerNames,
    declares: bool,
    tmp_path: Path,
) -> None:
    names, env = _demo_relay(pg_dsn, amqp_url, broker_names)
    amqp = await aio_pika.connect(amqp_url)
    channel = await amqp.channel()
    await topologies.declare(channel, names)  # the topology's owner declared it once
    env["ACCORD_TOPOLOGY_DECLARE"] = "true" if declares else "false"
    log = tmp_path / "relay.log"
    with log.open("wb") as out:
        process = await anyio.open_process(
            [sys.executable, "-m", "accord", "relay"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        queue = await channel.get_queue(f"{broker_names.prefix}.wf.report")
        # control: the relay publishes
        await _published(pg, await _submit(pg, 1))
        assert len(await _received(queue, 1)) == 1
        await channel.exchange_delete(names.exchange)  # its bindings go with it
        waiting = await _submit(pg, 2)
        if not declares:
            # the next session finds no exchange: the row waits, the relay stays
            await anyio.sleep(5)
            assert await pg.fetchval(STATE, waiting) == "pending"
            assert process.returncode is None
            await topologies.declare(channel, names)  # whoever owns the topology
        await _published(pg, waiting)
        assert len(await _received(queue, 1)) == 1  # bound again: it reached the queue
        assert process.returncode is None
    finally:
        with contextlib.suppress(ProcessLookupError):  # ended already: the code says how
            process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            code = await process.wait()
        await amqp.close()
    said = log.read_text()
    assert code == 0, said[-2000:]
    if not declares:  # one actionable line per try while it waits
        assert "lost a service; retrying in" in said
        assert "The events exchange does not exist on the broker" in said


@pytest.mark.timeout(120)
async def test_a_topology_the_broker_holds_otherwise_at_a_later_session_ends_the_relay(
    pg_dsn: str, pg: asyncpg.Connection, amqp_url: str, broker_names: BrokerNames, tmp_path: Path
) -> None:
    """A permanent refusal is not waited for: the exchange deleted and a queue declared again
    with other arguments (classic, not quorum) between two sessions, the next session's
    declaration is refused as the start's is (one line, exit 2), never retried for ever."""
    names, env = _demo_relay(pg_dsn, amqp_url, broker_names)
    log = tmp_path / "relay.log"
    amqp = await aio_pika.connect(amqp_url)
    try:
        with log.open("wb") as out:
            process = await anyio.open_process(
                [sys.executable, "-m", "accord", "relay"], env=env, stdout=out, stderr=out
            )
        await _published(pg, await _submit(pg, 1))  # control: the first session publishes
        channel = await amqp.channel()
        queue = f"{broker_names.prefix}.wf.report"
        await channel.queue_delete(queue)
        await channel.declare_queue(queue, durable=True)  # classic: the code declares quorum
        await channel.exchange_delete(names.exchange)
        await _submit(pg, 2)  # its publish fails: the next session declares, and is refused
        with anyio.fail_after(60):
            code = await process.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        await amqp.close()
    said = log.read_text()
    assert code == 2, said[-2000:]
    assert "the broker's topology differs from the code's" in said
    assert "Traceback" not in said
