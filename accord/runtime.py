"""Process plumbing for long-running commands: the event loop and exit codes."""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import anyio

from accord.schemas.settings import Settings


def _stop_before_ready(signum: int, frame: object) -> None:
    raise SystemExit(0)


def run(main: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run ``main`` on asyncio, with uvloop as the loop where it is installed.

    Until ``main`` installs its own SIGTERM handling (each long-running command does once it
    serves: finish the batch, then exit 0), a SIGTERM ends the process at once with exit 0:
    nothing has been claimed, consumed or published yet, so there is nothing to drain.
    """
    signal.signal(signal.SIGTERM, _stop_before_ready)
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return anyio.run(main, *args)
    return anyio.run(main, *args, backend_options={"use_uvloop": True})


class Stoppable(Protocol):
    """A long-running service: the relay, a consumer runtime, a worker."""

    def stop(self, *, now: bool = False) -> None: ...


async def stop_on_signals(service: Stoppable, name: str) -> None:
    """The one place a long-running process turns signals into a stop: the first SIGTERM or
    SIGINT asks ``service`` to drain (finish the batch, commit, ack, exit 0), a second one
    to stop now. Run it beside ``service.run()`` in the command's task group."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        draining = False
        async for signum in signals:
            what = signal.Signals(signum).name
            if draining:
                print(f"{name}: {what} again, stopping now", file=sys.stderr, flush=True)
                service.stop(now=True)
                return
            print(f"{name}: {what}, draining", file=sys.stderr, flush=True)
            service.stop()
            draining = True


async def wait_for_signal() -> None:
    """Return at the first SIGTERM or SIGINT (a process with nothing to drain)."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            return


@contextmanager
def metrics(settings: Settings) -> Iterator[None]:
    """`/metrics` inside a long-running process when ``metrics_port`` is set (else nothing).

    The status figures come from the database on each scrape; the process's own publish and
    process spans feed the OpenTelemetry messaging metrics on the same endpoint.
    """
    if settings.metrics_port <= 0:
        yield
        return
    from accord.ops import install_span_metrics, serving

    with serving(settings.metrics_port, dsn=settings.pg_dsn) as server:
        install_span_metrics(server.messaging)
        yield
