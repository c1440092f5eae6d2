"""`accord worker`: run job workers for one workflow class (placeholder)."""

from __future__ import annotations

import argparse
import sys

from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("worker", help="run job workers for one workflow class")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    print("accord worker: not implemented yet", file=sys.stderr)
    return 2
