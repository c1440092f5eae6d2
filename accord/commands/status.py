"""`accord status`: show work by state, and why waiting work waits (placeholder)."""

from __future__ import annotations

import argparse
import sys

from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("status", help="show work by state, and why waiting work waits")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    print("accord status: not implemented yet", file=sys.stderr)
    return 2
