"""`accord metrics-serve`: serve /metrics in Prometheus format (placeholder)."""

from __future__ import annotations

import argparse
import sys

from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("metrics-serve", help="serve /metrics in Prometheus format")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    print("accord metrics-serve: not implemented yet", file=sys.stderr)
    return 2
