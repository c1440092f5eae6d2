"""`accord replay`: replay retained events to projections (placeholder)."""

from __future__ import annotations

import argparse
import sys

from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("replay", help="replay retained events to projections")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    print("accord replay: not implemented yet", file=sys.stderr)
    return 2
