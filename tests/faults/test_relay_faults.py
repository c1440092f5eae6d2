"""The relay under faults: kill -9 in a loop, and a broker restart, while events flow.

Loss is never allowed; duplicates are, bounded by what a dead relay can have claimed and
not settled (``in_flight``) times the number of kills, and a duplicate always carries the
same message id and the same body.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import anyio
import asyncpg
import pytest
from anyio.abc import Process

from relay import Relay, enqueue
from schemas.topology import Topology
from tests.integration.relay import helpers
from tests.support import scaled, unavailable

ROOT = Path(__file__).resolve().parents[2]
IN_FLIGHT = 40


@pytest.fixture
async def topo(amqp_url: str, broker_names: object) -> Topology:
    return await helpers.declare_demo(amqp_url, broker_names)


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
    async with anyio.create_task_group() as tg:
        tg.start_soon(produce, pg_dsn, ids, total, total / 4.0)  # ~4 s of traffic
        for _ in range(kills):
            process = await start_relay(env, log)
            await anyio.sleep(0.2 + rng.random() * 0.1)
            process.send_signal(signal.SIGKILL)
            await process.wait()
            await process.aclose()
            killed += 1
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
    print(f"kills={killed} duplicates={duplicates} failed={failed_publishes} bound={bound}")


def rabbitmqctl(*args: str) -> None:
    exe = shutil.which("rabbitmqctl")
    if exe is None:
        unavailable("rabbitmqctl not found: cannot restart the broker")
        return
    done = subprocess.run([exe, *args], capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()[-500:]


@pytest.fixture
async def broker_restart() -> AsyncIterator[None]:
    if shutil.which("rabbitmqctl") is None:
        unavailable("rabbitmqctl not found: cannot restart the broker")
    yield
    # Whatever happened, leave the broker running for everyone else.
    await anyio.to_thread.run_sync(rabbitmqctl, "start_app")


@pytest.mark.timeout(180)
async def test_broker_restart_mid_stream_loses_nothing(
    pg_dsn: str, amqp_url: str, topo: Topology, broker_restart: None
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
            await anyio.to_thread.run_sync(rabbitmqctl, "stop_app")
            await anyio.to_thread.run_sync(rabbitmqctl, "start_app")
        await helpers.wait_until_settled(pg_dsn, expect_published=total, within_s=90)
        relay.stop()
    assert relay.stats.reconnects >= 1  # control: the restart really cut the relay off
    counts = await helpers.drain(amqp_url, topo.queue("report"))
    assert set(counts) == set(ids)
