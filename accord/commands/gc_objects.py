"""`accord gc-objects`: remove unreferenced result objects (placeholder)."""

from __future__ import annotations

import argparse
import sys

from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("gc-objects", help="remove unreferenced result objects")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    print("accord gc-objects: not implemented yet", file=sys.stderr)
    return 2
