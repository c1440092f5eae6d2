"""The single `accord` command. Settings are read here, once, and passed down."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from accord.commands import COMMANDS
from schemas.errors import AccordError
from schemas.settings import load_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accord", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"accord.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = load_settings()
    try:
        code: int = args.handler(args, settings)
    except AccordError as exc:
        print(f"accord: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
