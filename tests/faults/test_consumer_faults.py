"""Consumer processes killed with SIGKILL (between commit and ack, and at random points) and
stopped with SIGTERM: every event's effect exists exactly once, none missing.

Two measurement rules keep these tests exact rather than lucky:

- Signals go out with ``os.kill``, never ``Process.send_signal``/``kill``: those call
  ``Popen.poll()`` first, and a poll that finds a child which has *just* exited (the hook's
  own SIGKILL) reaps it before asyncio's child watcher does; the watcher then reports
  returncode 255 instead of the real status.
- The queue depth after a consumer exits is read once the queue has no consumer left. A
  quorum queue keeps a cancelled consumer (and counts it) while it holds unacknowledged
  messages, and drops it in the same step that returns them; with no consumer left, every
  message is either acknowledged or back in the queue, so the depth is final.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import anyio
import anyio.abc
import asyncpg
import pytest

from tests.conftest import BrokerNames
from tests.integration.consumers.conftest import own
from tests.integration.consumers.support import (
    CREATE_EFFECTS,
    counts,
    declare_topology,
    publish_events,
    queue_depth,
    report,
    topology_for,
)
from tests.support import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


class Consumers:
    """Starts consumer processes (tests/faults/consumer_proc.py) for one test."""

    def __init__(self, amqp_url: str, pg_dsn: str, prefix: str, tmp: Path) -> None:
        self.base = [
            sys.executable, "-m", "tests.faults.consumer_proc",
            "--amqp-url", amqp_url, "--pg-dsn", pg_dsn, "--prefix", prefix,
            "--marker", str(tmp / "hook-kills"), "--log", str(tmp / "consumer.log"),
        ]  # fmt: skip
        self.marker = tmp / "hook-kills"
        self.log = tmp / "consumer.log"
        self.started = 0

    async def start(self, kill_after: int = 0) -> anyio.abc.Process:
        self.started += 1
        argv = [*self.base, "--kill-after", str(kill_after)]
        # stderr joins stdout: a crash's traceback is read back by ``report``.
        return await anyio.open_process(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    @staticmethod
    async def consuming(process: anyio.abc.Process) -> None:
        """Wait until the process says it consumes (its SIGTERM handler is installed by then)."""
        assert process.stdout is not None
        seen = b""
        with anyio.fail_after(30):
            async for chunk in process.stdout:
                seen += chunk
                if b"consuming" in seen:
                    return
        raise AssertionError("the consumer exited before consuming")

    async def hook_kills(self) -> int:
        path = anyio.Path(self.marker)
        return len((await path.read_text()).splitlines()) if await path.exists() else 0

    async def log_lines(self, process: anyio.abc.Process) -> list[str]:
        """This process's lines of the shared consumer log."""
        path = anyio.Path(self.log)
        text = await path.read_text() if await path.exists() else ""
        return [line for line in text.splitlines() if f" pid={process.pid} " in line]

    async def report(self, process: anyio.abc.Process) -> str:
        """For failure messages: the exited process's status, output and log lines."""
        output = b""
        if process.stdout is not None:
            with anyio.move_on_after(5), contextlib.suppress(anyio.EndOfStream):
                async for chunk in process.stdout:
                    output += chunk
        log = "\n".join((await self.log_lines(process))[-20:])
        return f"returncode={process.returncode}\noutput:\n{output.decode()}\nlog:\n{log}"


async def _effects(pg: asyncpg.Connection) -> int:
    return int(await pg.fetchval("SELECT count(*) FROM public.effects"))


async def _assert_exactly_once(pg: asyncpg.Connection, operation_ids: set[str]) -> None:
    rows = await pg.fetch("SELECT operation_id, count(*) AS n FROM public.effects GROUP BY 1")
    assert {r["operation_id"] for r in rows} == operation_ids  # none missing, none extra
    assert max(r["n"] for r in rows) == 1  # none twice
    assert await pg.fetchval("SELECT count(*) FROM consumers.poison") == 0


def _signal(process: anyio.abc.Process, signum: int) -> None:
    """Signal the child without polling it (see the module docstring). Only asyncio's
    watcher reaps it, so its pid is not reused while ``returncode`` is still None."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # exited; the watcher has its status
            os.kill(process.pid, signum)


async def _stop(process: anyio.abc.Process) -> int:
    """SIGTERM, and the exit code of the drained process."""
    _signal(process, signal.SIGTERM)
    with anyio.fail_after(30):
        return await process.wait()


async def _settled_depth(amqp_url: str, queue: str) -> int:
    """The queue's depth once no consumer holds messages of it (see the module docstring)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        with anyio.fail_after(30):
            while True:
                declared = await channel.declare_queue(queue, passive=True)
                result = declared.declaration_result
                if result.consumer_count == 0:
                    return int(result.message_count or 0)
                await anyio.sleep(0.05)
    finally:
        await connection.close()


async def _drain_cleanly(amqp_url: str, queue: str, procs: Consumers) -> None:
    """Run a consumer without faults until the queue is empty, then stop it with SIGTERM."""
    for _ in range(5):
        process = await procs.start()
        await procs.consuming(process)
        with anyio.fail_after(60):
            while await queue_depth(amqp_url, queue) > 0:  # noqa: ASYNC110 - broker has no event
                await anyio.sleep(0.2)
        await anyio.sleep(0.5)  # let it settle the last prefetched batch
        assert await _stop(process) == 0, await procs.report(process)
        if await _settled_depth(amqp_url, queue) == 0:
            return
    raise AssertionError("the queue never drained")


async def test_sigkill_between_commit_and_ack_and_at_random_points(
    amqp_url: str,
    pg_dsn: str,
    pg: asyncpg.Connection,
    broker_names: BrokerNames,
    tmp_path: Path,
) -> None:
    n = scaled(2000, 20_000)
    topo = own(broker_names, topology_for(broker_names.prefix, delivery_limit=1000))
    await pg.execute(CREATE_EFFECTS)
    await declare_topology(amqp_url, topo)
    events = [report() for _ in range(n)]
    procs = Consumers(amqp_url, pg_dsn, topo.prefix, tmp_path)
    chance = random.Random(7)
    external_kills = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(publish_events, amqp_url, topo, events)  # events flow while we kill
        with anyio.fail_after(240):
            for rounds in itertools.count():
                if await _effects(pg) >= n:
                    break
                # Both kinds of kill, in turns (a race between them would let a fast
                # machine's hook win every time): the hook kills it right after a random
                # commit, before that batch's acks; or we kill it from outside at a random
                # point of its consumption (timed from when it consumes, not from spawn).
                if rounds % 2 == 0:
                    process = await procs.start(kill_after=chance.randint(1, 4))
                    wait_s = 5.0  # then from outside, if the events ran out first
                else:
                    process = await procs.start()
                    await procs.consuming(process)
                    wait_s = chance.uniform(0.0, 0.25)
                with anyio.move_on_after(wait_s):
                    await process.wait()
                if process.returncode is None:
                    _signal(process, signal.SIGKILL)
                    external_kills += 1
                    await process.wait()
                assert process.returncode == -signal.SIGKILL, await procs.report(process)
    hook_kills = await procs.hook_kills()
    print(f"rounds={rounds} hook_kills={hook_kills} external_kills={external_kills}")
    assert hook_kills > 0, "no kill between commit and ack happened"
    assert external_kills > 0, "no kill at a random point happened"
    await _drain_cleanly(amqp_url, topo.queue("report"), procs)
    await _assert_exactly_once(pg, {e.operation_id for e in events})
    delivered = await counts(pg)
    assert delivered["new"] == n
    # kills after commit and before ack left committed, unacknowledged messages: the
    # broker redelivered them and the inbox recorded them as duplicates
    assert delivered.get("duplicate", 0) > 0


async def test_sigterm_drains_in_flight_messages_and_exits_cleanly(
    amqp_url: str,
    pg_dsn: str,
    pg: asyncpg.Connection,
    broker_names: BrokerNames,
    tmp_path: Path,
) -> None:
    n = scaled(2000, 20_000)
    topo = own(broker_names, topology_for(broker_names.prefix, delivery_limit=1000))
    await pg.execute(CREATE_EFFECTS)
    await declare_topology(amqp_url, topo)
    events = [report() for _ in range(n)]
    await publish_events(amqp_url, topo, events)
    procs = Consumers(amqp_url, pg_dsn, topo.prefix, tmp_path)
    process = await procs.start()
    await procs.consuming(process)
    await wait_for(lambda: _over(pg, n // 10))
    assert await _stop(process) == 0, await procs.report(process)  # drained, mid-flow
    # The premise: one uninterrupted session. A lost connection (e.g. another test
    # restarting the shared broker) legitimately redelivers committed, unacknowledged
    # messages as duplicates; say so instead of failing on the counts below.
    reconnects = [line for line in await procs.log_lines(process) if "reconnecting" in line]
    assert not reconnects, f"the consumer lost a connection mid-test: {reconnects}"
    applied = await _effects(pg)
    assert applied < n
    # everything committed was acknowledged before exit: exactly the rest is still queued
    assert await _settled_depth(amqp_url, topo.queue("report")) == n - applied
    await _drain_cleanly(amqp_url, topo.queue("report"), procs)
    await _assert_exactly_once(pg, {e.operation_id for e in events})
    assert await counts(pg) == {"new": n}  # no committed-but-unacked message was left behind


async def _over(pg: asyncpg.Connection, n: int) -> bool:
    return await _effects(pg) >= n
