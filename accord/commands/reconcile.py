"""`accord reconcile`: resolve unknown effects with provider evidence (placeholder)."""

from __future__ import annotations

import argparse
import sys

from schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("reconcile", help="resolve unknown effects with provider evidence")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    print("accord reconcile: not implemented yet", file=sys.stderr)
    return 2
