"""`accord consume`: run a consumer for one workflow class (placeholder)."""

from __future__ import annotations

import argparse
import sys

from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("consume", help="run a consumer for one workflow class")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    print("accord consume: not implemented yet", file=sys.stderr)
    return 2
