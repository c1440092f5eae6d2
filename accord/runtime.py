"""Process plumbing for long-running commands: the event loop and exit codes."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

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
