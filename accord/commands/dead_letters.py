"""`accord dead-letters list|requeue --workflow NAME`: what a workflow class's poison queue
holds, and moving messages back to the class's queue once their cause is fixed.

    accord dead-letters list --workflow W [--limit N]
    accord dead-letters requeue --workflow W [--reason delivery_limit|rejected|any] [--limit N]

``delivery_limit`` (the default): messages the broker dead-lettered after the queue's delivery
limit, with no poison record (on RabbitMQ 3.10 a lost connection's return counts too: a
consumer restarted in a loop sends sound messages there). ``rejected``: messages the consumer
poisoned, each with a record (`accord status`: poison messages), e.g. once the handler that
refused them is fixed. A requeued message the inbox already applied is absorbed as a
duplicate. Each pass reads at most --limit of the messages the poison queue held when it
began, oldest first; what it does not move is put back at the queue's tail. Exit 1 when a
selected message could not be moved, or the poison queue refused a copy put back (the pass
stops there); such messages stay in the poison queue.
"""

from __future__ import annotations

import argparse
import functools

from accord import runtime
from accord.commands import args
from accord.commands.common import prefix, require_app
from accord.consumers import dead_letters
from accord.consumers.dead_letters import DeadLetter, Moved
from accord.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "dead-letters",
        help="list a workflow class's poison queue, or move its messages back",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ops = parser.add_subparsers(dest="dead_letters_op", required=True, metavar="OPERATION")
    listing = ops.add_parser(
        "list",
        help="show the messages of the poison queue (identifiers only; each is put back)",
        description="Print each message of the class's poison queue by its identifiers and"
        " the reason it was last dead-lettered, then put it back (nothing moves).",
    )
    requeue = ops.add_parser(
        "requeue",
        help="move the poison queue's messages of one death reason back",
        description="Move the poison queue's messages last dead-lettered for --reason back to"
        " the class's own queue, each acknowledged only after the broker confirmed its copy;"
        " exit 1 when one could not be moved (it stays).",
    )
    requeue.add_argument(
        "--reason",
        choices=dead_letters.REASONS,
        default="delivery_limit",
        help="why they were last dead-lettered (%(default)s: by the broker, no poison record)",
    )
    for op in (listing, requeue):
        op.add_argument("--workflow", required=True, help="the application's consumer class")
        op.add_argument(
            "--limit",
            type=args.count(maximum=1_000_000),
            default=10_000,
            help="read at most this many messages (%(default)s)",
        )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = require_app(args, settings)
    app.consumer_class(args.workflow)  # an unknown class is refused before connecting
    topology = app.topology(prefix(app, settings))
    listing = args.dead_letters_op == "list"
    if listing:
        action = functools.partial(dead_letters.look, limit=args.limit)
    else:
        action = functools.partial(dead_letters.move_back, reason=args.reason, limit=args.limit)
    done: Moved = runtime.run(action, settings.amqp_url, topology, args.workflow)
    return _report(done, listing=listing)


def _line(verb: str, letter: DeadLetter, *extra: str) -> str:
    return " ".join(
        [
            verb,
            f"message_id={letter.message_id}",
            f"type={letter.event_type}",
            f"tenant={letter.tenant}",
            f"operation_id={letter.operation_id}",
            f"reason={letter.reason}",
            f"deaths={letter.deaths}",
            f"enqueued_at={letter.enqueued_at}",
            f"bytes={letter.body_size}",
            *extra,
        ]
    )


def _report(done: Moved, *, listing: bool) -> int:
    for letter in done.skipped:
        print(_line("held" if listing else "kept", letter))
    for letter in done.moved:
        print(_line("requeued", letter))
    for letter, problem in done.failed:
        print(_line("failed", letter, f"error={problem}"))
    print(
        f"{done.poison_queue}: held={done.held} requeued={len(done.moved)}"
        f" kept={len(done.skipped)} failed={len(done.failed)} (to {done.queue})"
        + (f" stopped={done.stopped}" if done.stopped else "")
    )
    return 1 if done.failed or done.stopped else 0
