"""Process plumbing for long-running commands: the event loop and exit codes."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from accord import logs, observe, telemetry
from accord.schemas.settings import Settings

if TYPE_CHECKING:
    from accord.ops.health import Check
    from accord.ops.metrics import MetricsServer

log = logging.getLogger("accord.runtime")


#: A one-shot command stopped by SIGTERM exits as a process the signal ended would (128 + 15).
INTERRUPTED = 128 + signal.SIGTERM


def _stop_before_ready(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _interrupted(signum: int, frame: object) -> None:
    print(
        "accord: stopped by SIGTERM before the command finished; what it committed stays"
        " (each step is its own transaction): run it again",
        file=sys.stderr,
    )
    raise SystemExit(INTERRUPTED)


def run(main: Callable[..., Awaitable[Any]], *args: Any, service: bool = False) -> Any:
    """Run ``main`` on asyncio, with uvloop as the loop where it is installed.

    A ``service`` (a long-running command) installs its own SIGTERM handling once it serves
    (finish the batch, then exit 0); until then a SIGTERM ends it at once with exit 0:
    nothing has been claimed, consumed or published yet, so there is nothing to drain. A
    one-shot command (migrate, replay, repair, ...) stopped by SIGTERM did not finish: it
    exits 143, so that ``accord migrate && start`` does not go on.
    """
    signal.signal(signal.SIGTERM, _stop_before_ready if service else _interrupted)
    observe.starting()
    with telemetry.tracing():  # OTEL_* configure this process's traces; flushed on return
        try:
            import uvloop  # noqa: F401
        except ImportError:
            return anyio.run(main, *args)
        return anyio.run(main, *args, backend_options={"use_uvloop": True})


def ready(logger: logging.Logger, message: str, *args: object) -> None:
    """The process has started and serves: its ready line (``event=ready``, also on stdout)
    and, from now on, `/readyz` may say ready (before, it says ``startup: starting``)."""
    observe.serving()
    logger.info(message, *args, extra=logs.READY)


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
                log.warning("%s: %s again, stopping now", name, what)
                service.stop(now=True)
                return
            log.info("%s: %s, draining", name, what)
            service.stop()
            draining = True


async def wait_for_signal() -> None:
    """Return at the first SIGTERM or SIGINT (a process with nothing to drain)."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            return


@contextmanager
def metrics(
    settings: Settings, *, checks: Sequence[Check] | None = None
) -> Iterator[MetricsServer | None]:
    """`/metrics`, `/healthz` and `/readyz` inside a long-running process when ``metrics_port``
    is set (else nothing; yields the server or None).

    The process's own publish and process spans feed the OpenTelemetry messaging metrics on
    the same endpoint, its loops the flow counters and `/healthz` (accord.observe). The
    status figures (a snapshot of the whole database per scrape) only with
    ``metrics_status``: they are the same in every process, and `accord metrics-serve`
    serves them once. `/readyz` runs ``checks`` (default: PostgreSQL reachable with a
    current schema, RabbitMQ reachable) every two seconds.
    """
    if settings.metrics_port <= 0:
        yield None
        return
    from accord.ops import checks as ready_checks
    from accord.ops import install_span_metrics, serving
    from accord.ops.health import Readiness

    if checks is None:
        checks = [
            ready_checks.postgresql(settings.pg_dsn),
            ready_checks.rabbitmq(settings.amqp_url),
        ]
    # ACCORD_HEALTH_GRACE_S where the settings define it: how overdue a loop may be.
    observe.LIVENESS.grace_s = settings.health_grace_s
    observe.start_measuring()
    readiness = Readiness(checks)
    status_dsn = settings.pg_dsn if settings.metrics_status else None
    with serving(settings.metrics_port, dsn=status_dsn, readiness=readiness) as server:
        install_span_metrics(server.messaging)
        yield server
