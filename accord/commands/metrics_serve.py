"""`accord metrics-serve [--port P] [--addr A]`: serve /metrics until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging

from accord import runtime
from accord.commands import args
from accord.ops import checks, install_span_metrics, serving
from accord.ops.health import Readiness
from accord.schemas import migrate
from accord.schemas.settings import Settings

DEFAULT_PORT = 9464

log = logging.getLogger("accord.metrics")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "metrics-serve", help="serve /metrics in Prometheus format", description=__doc__
    )
    parser.add_argument(
        "--port",
        type=args.port,
        default=None,
        help=f"TCP port (0: ephemeral; default ACCORD_METRICS_PORT, else {DEFAULT_PORT})",
    )
    parser.add_argument("--addr", default="127.0.0.1", help="bind address (default loopback)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    port = args.port if args.port is not None else (settings.metrics_port or DEFAULT_PORT)
    return int(runtime.run(_main, settings.pg_dsn, port, args.addr, service=True))


async def _main(dsn: str, port: int, addr: str) -> int:
    await migrate.require_current_at(dsn)
    readiness = Readiness([checks.postgresql(dsn, writable=False)])  # it reads only
    with serving(port, dsn=dsn, addr=addr, readiness=readiness) as server:
        install_span_metrics(server.messaging)
        # The ready line names the bound port; it also reaches stdout (accord.logs), so a
        # supervisor or test can find an ephemeral one there.
        runtime.ready(log, "serving /metrics on http://%s:%d/metrics", addr, server.port)
        await runtime.wait_for_signal()
    return 0
