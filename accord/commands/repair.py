"""`accord repair`: repair operations (repair role only) (placeholder)."""

from __future__ import annotations

import argparse
import sys

from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("repair", help="repair operations (repair role only)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    print("accord repair: not implemented yet", file=sys.stderr)
    return 2
