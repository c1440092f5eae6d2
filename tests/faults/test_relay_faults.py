"""The relay under faults: kill -9 in a loop, and a broker restart, while events flow, on a
private RabbitMQ node the module starts (the shared broker is never restarted).

Loss is never allowed; duplicates are, bounded by what a dead relay can have claimed and
not settled (``in_flight``) times the number of kills, and a duplicate always carries the
same message id and the same body.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import aio_pika
import anyio
import asyncpg
import pytest
from anyio.abc import Process

from accord.relay import Relay
from accord.schemas.topology import Topology
from tests.integration.relay import helpers
from tests.rabbit_node import RabbitNode
from tests.support import enqueue, scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]
IN_FLIGHT = 40
# Rows leased by a claim made after $1 (a lease of $2 s runs past $1 + $2) and not settled.
HOLDS_A_BATCH = (
    "SELECT EXISTS (SELECT 1 FROM relay.outbox WHERE state = 'pending'"
    " AND lease_token IS NOT NULL"
    " AND lease_expires_at > $1::timestamptz + make_interval(secs => $2::float8))"
)


@pytest.fixture(scope="module")
def amqp_url(rabbit_node: RabbitNode) -> str:
    """The module's private node (tests/rabbit_node.py): the broker restart below stops and
    starts it, so it is never the shared broker (broker_names and topo follow)."""
    return rabbit_node.url


@pytest.fixture
async def topo(amqp_url: str, broker_names: object) -> Topology:
    return await helpers.declare_demo(amqp_url, broker_names)


async def holds_a_batch(admin: asyncpg.Connection, since: object, lease_s: float) -> bool:
    """A relay started at ``since`` has claimed rows it has not settled yet."""
    return bool(await admin.fetchval(HOLDS_A_BATCH, since, lease_s))


async def produce(dsn: str, ids: list[str], total: int, per_second: float) -> None:
    """Commit ``total`` events one transaction each, at about ``per_second``."""
    conn = await asyncpg.connect(dsn)
    try:
        for n in range(total):
            event = helpers.make_event(n)
            async with conn.transaction():
                await enqueue(conn, event)
            ids.append(str(event.event_id))
            if n % 10 == 9:
                await anyio.sleep(10 / per_second)
    finally:
        await conn.close()


def relay_env(dsn: str, amqp_url: str, topo: Topology) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ACCORD_APP="accord.demo:app",
        ACCORD_PG_DSN=dsn,
        ACCORD_AMQP_URL=amqp_url,
        ACCORD_TOPOLOGY_PREFIX=topo.prefix,
        ACCORD_RELAY_IN_FLIGHT=str(IN_FLIGHT),
        ACCORD_RELAY_BATCH=str(IN_FLIGHT),
        ACCORD_RELAY_LEASE_S="3.0",
        ACCORD_RELAY_PUBLISH_TIMEOUT_S="2.0",
        ACCORD_RELAY_POLL_S="0.1",
    )
    return env


async def start_relay(env: dict[str, str], log: Path) -> Process:
    """``accord relay`` as a real process; returns once it printed that it is ready."""
    with log.open("ab") as stderr:
        process = await anyio.open_process(
            [sys.executable, "-m", "accord", "relay"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    assert process.stdout is not None
    seen = b""
    with anyio.fail_after(20):
        while b"relay ready" not in seen:
            try:
                seen += await process.stdout.receive()
            except anyio.EndOfStream:
                text = await anyio.Path(log).read_text()
                pytest.fail(f"accord relay exited before ready: {text[-1000:]}")
    return process


async def drain_with_bodies(amqp_url: str, queue: str) -> dict[str, list[tuple[bytes, str]]]:
    """message id → [(body, ce-id header)] for every message now in the queue."""
    found: dict[str, list[tuple[bytes, str]]] = {}
    conn = await aio_pika.connect(amqp_url)
    try:
        q = await (await conn.channel()).get_queue(queue)
        while (message := await q.get(no_ack=True, fail=False)) is not None:
            assert message.message_id is not None
            ce_id = str(message.headers["ce-id"])
            found.setdefault(message.message_id, []).append((message.body, ce_id))
    finally:
        await conn.close()
    return found


@pytest.mark.timeout(180)
async def test_sigkill_loop_loses_nothing_and_bounds_duplicates(
    pg_dsn: str, amqp_url: str, topo: Topology, tmp_path: Path
) -> None:
    total = scaled(2000, 20000)
    kills = scaled(8, 60)
    env = relay_env(pg_dsn, amqp_url, topo)
    log = tmp_path / "relay.log"
    ids: list[str] = []
    rng = random.Random(11)
    killed = 0
    admin = await asyncpg.connect(pg_dsn)

    lease_s = float(env["ACCORD_RELAY_LEASE_S"])

    async with anyio.create_task_group() as tg:
        # Traffic lasts as long as the kill loop (a relay starts in ~1 s, then lives ~0.25 s).
        tg.start_soon(produce, pg_dsn, ids, total, total / (kills * 1.2))
        for _ in range(kills):
            process = await start_relay(env, log)
            started = await admin.fetchval("SELECT now()")
            await anyio.sleep(0.2 + rng.random() * 0.1)
            # Aim at the crash window: kill while this relay holds a claimed batch, if it gets
            # one within a second (it is killed anyway after that).
            with anyio.move_on_after(1.0):
                await wait_for(partial(holds_a_batch, admin, started, lease_s), 5, 0.002)
            process.send_signal(signal.SIGKILL)
            await process.wait()
            await process.aclose()
            killed += 1
    await admin.close()
    final = await start_relay(env, log)
    try:
        await helpers.wait_until_settled(pg_dsn, expect_published=total, within_s=60)
    finally:
        final.terminate()  # SIGTERM: finish the batch, exit cleanly
        with anyio.fail_after(20):
            code = await final.wait()
        await final.aclose()
    relay_log = log.read_text()
    assert code == 0, relay_log[-2000:]
    found = await drain_with_bodies(amqp_url, topo.queue("report"))
    assert set(found) == set(ids), "a committed event was lost"
    counts = Counter({k: len(v) for k, v in found.items()})
    duplicates = sum(counts.values()) - len(counts)
    # Each kill can repeat at most what that relay had in flight; a publish that did not
    # count (logged, e.g. a confirm timeout on a loaded machine) can repeat one more.
    failed_publishes = relay_log.count("publish failed:")
    bound = IN_FLIGHT * killed + failed_publishes
    assert duplicates <= bound, (duplicates, killed, failed_publishes, relay_log[-2000:])
    for message_id, copies in found.items():
        assert {body for body, _ in copies} == {copies[0][0]}  # byte-identical re-publishes
        assert {ce_id for _, ce_id in copies} == {message_id}
    # The kills landed in the crash window: rows a killed relay had claimed and not settled
    # were claimed again (every claim counts an attempt; a row that only failed a publish
    # keeps that failure's reason), so the test exercised recovery, not just restarts.
    reclaimed = await helpers.pg_value(
        pg_dsn, "SELECT count(*) FROM relay.outbox WHERE attempts > 1 AND last_reason IS NULL"
    )
    assert isinstance(reclaimed, int) and reclaimed > 0, relay_log[-2000:]
    print(
        f"kills={killed} reclaimed={reclaimed} duplicates={duplicates}"
        f" failed={failed_publishes} bound={bound}"
    )


@pytest.mark.timeout(120)
async def test_sigterm_mid_stream_settles_its_batch_and_exits_cleanly(
    pg_dsn: str, amqp_url: str, topo: Topology, tmp_path: Path
) -> None:
    total = 3000
    await helpers.enqueue_committed(pg_dsn, [helpers.make_event(n) for n in range(total)])
    # small batches, so the stop lands with a batch in flight and work left behind it
    env = {**relay_env(pg_dsn, amqp_url, topo), "ACCORD_RELAY_BATCH": "4"}
    log = tmp_path / "relay.log"
    process = await start_relay(env, log)

    async def under_way() -> bool:
        return (await helpers.outbox_stats(pg_dsn)).published >= 200

    await wait_for(under_way, within=30)
    process.terminate()
    with anyio.fail_after(20):
        code = await process.wait()
    await process.aclose()
    assert code == 0, log.read_text()[-2000:]
    rows = await helpers.pg_value(
        pg_dsn,
        "SELECT jsonb_build_object("
        " 'published', count(*) FILTER (WHERE state = 'published'),"
        " 'leased', count(*) FILTER (WHERE lease_token IS NOT NULL))::text FROM relay.outbox",
    )
    assert isinstance(rows, str)
    figures = json.loads(rows)
    assert 200 <= figures["published"] < total  # stopped mid-stream (control: it was working)
    assert figures["leased"] == 0  # every row it had claimed was settled before it exited
    published = await helpers.pg_value(
        pg_dsn, "SELECT array_agg(event_id::text) FROM relay.outbox WHERE state = 'published'"
    )
    assert isinstance(published, list)
    found = await drain_with_bodies(amqp_url, topo.queue("report"))
    assert set(found) == set(published)  # the broker holds exactly what is marked published


@pytest.fixture
async def broker_restart(rabbit_node: RabbitNode) -> AsyncIterator[RabbitNode]:
    yield rabbit_node
    # Whatever happened, leave the module's node running for the tests after this one.
    await anyio.to_thread.run_sync(rabbit_node.ctl, "start_app")


@pytest.mark.timeout(180)
async def test_broker_restart_mid_stream_loses_nothing(
    pg_dsn: str, amqp_url: str, topo: Topology, broker_restart: RabbitNode
) -> None:
    total = scaled(2000, 20000)
    ids: list[str] = []
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        async with anyio.create_task_group() as flow:
            flow.start_soon(produce, pg_dsn, ids, total, total / 3.0)
            with anyio.fail_after(30):
                while relay.stats.published < total // 4:  # noqa: ASYNC110 (another task's counter)
                    await anyio.sleep(0.02)
            await anyio.to_thread.run_sync(broker_restart.ctl, "stop_app")
            await anyio.to_thread.run_sync(broker_restart.ctl, "start_app")
        await helpers.wait_until_settled(pg_dsn, expect_published=total, within_s=90)
        relay.stop()
    assert relay.stats.reconnects >= 1  # control: the restart really cut the relay off
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == set(ids)


@pytest.fixture
async def memory_alarm(rabbit_node: RabbitNode) -> AsyncIterator[RabbitNode]:
    yield rabbit_node
    # Whatever happened, clear the alarm for the tests after this one (the default mark).
    await anyio.to_thread.run_sync(rabbit_node.ctl, "set_vm_memory_high_watermark", "0.4")


@pytest.mark.timeout(120)
async def test_a_memory_alarm_holds_the_relay_back_and_costs_no_copies(
    pg_dsn: str, amqp_url: str, topo: Topology, memory_alarm: RabbitNode
) -> None:
    """The module's node raises a memory alarm: RabbitMQ blocks the relay's connection at its
    first publish after it (that claim's publishes wait in the connection and time out). The
    relay then claims nothing more while blocked, and says so; when the alarm clears each
    row is published, at most once more than the broker already had. Before, it kept
    claiming: every publish timed out and was published again, a copy per timeout (a 35 s
    alarm: 8 copies of each row). Control: a row published before the alarm."""
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo, publish_timeout_s=0.5, poll_s=0.1))
    first = helpers.make_event(0)
    later = [helpers.make_event(n) for n in range(1, 21)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.enqueue_committed(pg_dsn, [first])
        await helpers.wait_until_settled(pg_dsn, expect_published=1, within_s=30)  # control
        await anyio.to_thread.run_sync(
            memory_alarm.ctl, "set_vm_memory_high_watermark", "absolute", "1"
        )
        await helpers.enqueue_committed(pg_dsn, later)
        with anyio.fail_after(30):
            while not relay.blocked:  # noqa: ASYNC110 (the relay's own state)
                await anyio.sleep(0.05)
        await anyio.sleep(2.0)  # four publish timeouts, and their backoffs over
        attempts = await helpers.pg_value(
            pg_dsn, "SELECT max(attempts) FROM relay.outbox WHERE state = 'pending'"
        )
        assert attempts == 1 and relay.blocked  # the claim at the onset, none since
        await anyio.to_thread.run_sync(memory_alarm.ctl, "set_vm_memory_high_watermark", "0.4")
        await helpers.wait_until_settled(pg_dsn, expect_published=21, within_s=60)
        relay.stop()
    assert not relay.blocked
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == {str(e.event_id) for e in [first, *later]}
    assert max(counts.values()) <= 2 and counts[str(first.event_id)] == 1
