"""/healthz and /readyz over HTTP, with loops and checks of the test's own: a loop that
stops beating turns /healthz red naming it (after its promise and the grace), an idle
one never does, an ended one is forgotten; /readyz says which check fails and why, and that
the process is still starting until it says it serves."""

from __future__ import annotations

import json
import logging
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import anyio
import pytest

from accord import observe
from accord.ops import serve_metrics
from accord.ops.health import Readiness


def get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def grace() -> Iterator[None]:
    before = observe.LIVENESS.grace_s
    observe.LIVENESS.grace_s = 0.3
    try:
        yield
    finally:
        observe.LIVENESS.grace_s = before


def test_liveness_keys_loops_by_task_and_forgets_ended_ones() -> None:
    liveness = observe.Liveness(grace_s=0.0)
    liveness.beat("outside", within_s=-1)  # a thread's beat (no task): kept until it beats
    assert [s.loop for s in liveness.stuck()] == ["outside"]

    async def main() -> None:
        async def loop() -> None:
            liveness.beat("lane", within_s=-1.0)  # overdue at once

        async with anyio.create_task_group() as tg:
            tg.start_soon(loop)
        liveness.idle("idle lane")

    anyio.run(main)
    assert [s.loop for s in liveness.stuck()] == ["outside"]  # the ended task is dropped


async def test_a_loop_that_stops_beating_turns_healthz_red(grace: None) -> None:
    server = serve_metrics(0, dsn=None)
    stop = anyio.Event()
    try:

        async def beating() -> None:
            while not stop.is_set():
                observe.beat("test.beating", within_s=0.1)
                with anyio.move_on_after(0.1):
                    await stop.wait()

        async def stalls() -> None:
            observe.beat("test.stalls", within_s=0.1)
            await stop.wait()  # stuck: never beats again

        async def waits() -> None:
            observe.idle("test.idle")  # waiting for a delivery: not stuck however long
            await stop.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(beating)
            tg.start_soon(waits)
            await anyio.sleep(0.2)
            code, body = await anyio.to_thread.run_sync(get, server.port, "/healthz")
            assert code == 200 and body["status"] == "ok"  # control: all alive
            tg.start_soon(stalls)
            await anyio.sleep(0.8)  # its promise (0.1 s) and the grace (0.3 s) are past
            code, body = await anyio.to_thread.run_sync(get, server.port, "/healthz")
            assert code == 503 and body["status"] == "stuck"
            assert list(body["overdue_s"]) == ["test.stalls"]  # type: ignore[call-overload]
            stop.set()
        await anyio.sleep(0.05)
        code, _ = await anyio.to_thread.run_sync(get, server.port, "/healthz")
        assert code == 200  # the stuck loop's task ended: forgotten
    finally:
        server.close()


def test_readyz_names_the_failing_check_and_metrics_still_serve() -> None:
    healthy = True

    async def database() -> None:
        if not healthy:
            raise ConnectionRefusedError("secret text never shown")

    async def broker() -> None:
        pass

    readiness = Readiness(
        [("postgresql", database), ("rabbitmq", broker)], every_s=0.05, started=lambda: True
    )
    server = serve_metrics(0, dsn=None, readiness=readiness)
    try:
        readiness.check_once()
        assert get(server.port, "/readyz") == (200, {"status": "ready"})
        healthy = False
        readiness.check_once()
        code, body = get(server.port, "/readyz")
        assert code == 503
        assert body == {"status": "not_ready", "failing": {"postgresql": "ConnectionRefusedError"}}
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as response:
            text = response.read().decode()
        assert 'accord_ready{check="postgresql"} 0.0' in text
        assert 'accord_ready{check="rabbitmq"} 1.0' in text
    finally:
        server.close()


def test_a_round_that_started_earlier_never_overwrites_a_later_one() -> None:
    """Two threads run rounds (the loop's, and a caller's check_once): a slow round that saw
    the database up and reports last does not hide the later round that saw it down."""
    release, entered = threading.Event(), threading.Event()
    rounds: list[int] = []

    async def database() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:  # the first round: slow, and the database was up
            entered.set()
            await anyio.to_thread.run_sync(release.wait)
            return
        raise ConnectionRefusedError("down")

    readiness = Readiness([("postgresql", database)], timeout_s=10.0, started=lambda: True)
    slow_saw: list[dict[str, str]] = []
    slow = threading.Thread(target=lambda: slow_saw.append(readiness.check_once()))
    slow.start()
    assert entered.wait(5)
    down = {"postgresql": "ConnectionRefusedError"}
    assert readiness.check_once() == down  # the later round reports first
    release.set()
    slow.join(5)
    assert not slow.is_alive() and slow_saw == [{}]  # control: the slow round saw it up
    assert readiness.failing() == down  # and the later round's word stands


def test_readyz_says_starting_until_the_process_serves() -> None:
    """Every check passes, but the process has not said it serves (its start is still
    recovering, checking authority, ...): /readyz is 503 naming ``startup`` alone and the
    ``startup`` gauge is 0. Once it serves: 200, gauge 1 (the control)."""
    started = threading.Event()

    async def database() -> None:
        pass

    readiness = Readiness([("postgresql", database)], started=started.is_set)
    server = serve_metrics(0, dsn=None, readiness=readiness)
    try:
        readiness.check_once()
        assert get(server.port, "/readyz") == (
            503,
            {"status": "not_ready", "failing": {"startup": "starting"}},
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as response:
            text = response.read().decode()
        assert 'accord_ready{check="startup"} 0.0' in text
        assert 'accord_ready{check="postgresql"} 1.0' in text
        started.set()
        assert get(server.port, "/readyz") == (200, {"status": "ready"})
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as response:
            assert 'accord_ready{check="startup"} 1.0' in response.read().decode()
    finally:
        server.close()


def test_the_process_wide_flag_is_what_a_ready_line_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """``runtime.ready`` (every long-running command's ready line) sets the flag a Readiness
    reads by default: before it the default Readiness says starting, after it not."""
    from accord import runtime

    monkeypatch.setattr(observe, "_serving", threading.Event())  # this test's own process state

    async def database() -> None:
        pass

    readiness = Readiness([("postgresql", database)])
    readiness.check_once()
    assert readiness.failing() == {"startup": "starting"}
    runtime.ready(logging.getLogger("test"), "test ready")
    assert readiness.failing() == {}
    # A command's run begins unserved, whatever ran before in this process (a test driving
    # several commands in process); the flag stays set while that run serves.
    seen: list[bool] = []

    async def main() -> None:
        seen.append(observe.is_serving())
        runtime.ready(logging.getLogger("test"), "test ready")
        seen.append(observe.is_serving())

    sigterm = signal.getsignal(signal.SIGTERM)  # runtime.run installs its own
    try:
        runtime.run(main)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert seen == [False, True]
