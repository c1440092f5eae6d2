"""A consumer process for the fault tests: effect rows into public.effects, optional suicide.

Run as ``python -m tests.faults.consumer_proc``. With ``--kill-after N`` the ``after_commit``
hook SIGKILLs this very process right after its N-th commit, before that batch's acks,
after appending a line to ``--marker`` (so the test can count those kills). SIGTERM drains.
Log lines carry the pid (the test's failure reports pick this process's lines).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import sys

import anyio

from accord.runtime import stop_on_signals
from tests.integration.consumers.support import runtime_for, topology_for


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--amqp-url", required=True)
    parser.add_argument("--pg-dsn", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--delivery-limit", type=int, default=1000)
    parser.add_argument("--kill-after", type=int, default=0)
    parser.add_argument("--marker", default=os.devnull)
    parser.add_argument("--log", default=None)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        filename=args.log,
        format=f"%(asctime)s pid={os.getpid()} %(name)s %(levelname)s %(message)s",
    )
    commits = itertools.count(1)

    def maybe_die() -> None:
        if next(commits) == args.kill_after:
            with open(args.marker, "a", encoding="utf-8") as marker:
                marker.write("killed after commit, before ack\n")
            os.kill(os.getpid(), signal.SIGKILL)

    runtime = runtime_for(
        args.amqp_url,
        args.pg_dsn,
        topology_for(args.prefix, args.delivery_limit),
        after_commit=maybe_die if args.kill_after > 0 else None,
        prefetch=64,
        batch_max=32,
    )

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_announce, runtime.consuming)
            tg.start_soon(stop_on_signals, runtime, "consumer")
            await runtime.run()
            tg.cancel_scope.cancel()

    anyio.run(run)
    return 0


async def _announce(consuming: anyio.Event) -> None:
    await consuming.wait()
    print("consuming", flush=True)


if __name__ == "__main__":
    sys.exit(main())
