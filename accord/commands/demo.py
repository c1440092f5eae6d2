"""`accord demo [--n N] [--faults]`: the demo application (``accord.demo:app``, the report
workflow) end to end through the real `accord` processes, with a summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from accord import runtime
from accord.app import load_app
from accord.commands import args
from accord.commands.common import app_spec
from accord.demo.run import DemoOptions, run_demo
from accord.errors import AppInvalid
from accord.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("demo", help="run the end-to-end demo workflow", description=__doc__)
    parser.add_argument(
        "--n", type=args.count(maximum=100_000), default=24, help="submissions (%(default)s)"
    )
    parser.add_argument(
        "--faults",
        action="store_true",
        help="also SIGKILL the relay and a worker mid-run and lose some provider replies",
    )
    parser.add_argument(
        "--timeout-s", type=args.seconds(positive=True), default=120.0, help="give up after this"
    )
    parser.add_argument("--workdir", default="var/demo", help="logs, journals, objects")
    parser.set_defaults(handler=handle)


DEMO_APP = "accord.demo:app"


def handle(args: argparse.Namespace, settings: Settings) -> int:
    spec = app_spec(args, settings) or DEMO_APP
    if load_app(spec).name != "demo":
        raise AppInvalid("`accord demo` runs the demo application only", app=spec)
    options = DemoOptions(
        n=args.n, faults=args.faults, timeout_s=args.timeout_s, workdir=Path(args.workdir)
    )
    return int(runtime.run(run_demo, settings, options))
