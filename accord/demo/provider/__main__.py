"""``python -m accord.demo.provider --port P --db PATH``: the simulator as its own process."""

from __future__ import annotations

import argparse
import signal
import sys

from accord.demo.provider.server import ProviderServer
from accord.demo.provider.wire import Fault


def main(argv: list[str] | None = None) -> int:
    """``python -m accord.demo.provider --port P --db PATH``: serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(
        prog="accord.demo.provider", description="the accord provider simulator"
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any)")
    parser.add_argument("--db", required=True, help="the evidence file (SQLite)")
    parser.add_argument("--fault", type=Fault, default=Fault.NONE, choices=list(Fault))
    parser.add_argument("--delay-s", type=float, default=0.0, help="delay for --fault slow")
    args = parser.parse_args(argv)
    # Block the stop signals before any thread starts so only sigwait below receives them.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    server = ProviderServer(args.db, port=args.port)
    server.start()
    server.set_fault(args.fault, delay_s=args.delay_s)
    print(f"provider listening on {server.url} evidence={args.db}", flush=True)
    try:
        signal.sigwait(stop)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
