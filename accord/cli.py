"""The single `accord` command. Settings are read here, once, and passed down.

Every subcommand (and every repair operation) takes ``--app MODULE:ATTRIBUTE`` (default
``ACCORD_APP``): the application whose declarations it runs. Errors accord can name (a
missing or invalid application, settings that cannot work, a schema behind the code) end
the command with one line on stderr and exit status 2 (EXIT_REFUSED): running it again
as it is would meet the same error. A service that did not answer, took no writes or was lost
under a call (ServiceUnavailable, ConnectionLost, DatabaseReadOnly: a PostgreSQL session
lost during a process's start, where nothing reconnects, among them; an error that one
caused, such as the authority ledger's database down: LedgerUnavailable), and a runner
journal whose write failed (JournalBroken: a new process reopens it), end it the same way
with exit status 75 (EXIT_TEMPFAIL, sysexits' EX_TEMPFAIL): it may succeed once the service
or the disk is back, so a supervisor can restart on 75 and stop on 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import asyncpg
from pydantic import ValidationError

from accord import logs, observe
from accord.commands import COMMANDS
from accord.errors import SettingsInvalid
from accord.jobs.errors import JournalBroken
from accord.schemas import db
from accord.schemas.errors import AccordError, ConfigError, ConnectionLost, ServiceUnavailable
from accord.schemas.settings import Settings, load_settings

log = logging.getLogger("accord.cli")

#: An error accord can name that running the command again as it is would meet again.
EXIT_REFUSED = 2
#: A service that did not answer, took no writes or was lost: again later may succeed.
EXIT_TEMPFAIL = 75


def _add_app_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--app`` on every command parser, nested operations included (SUPPRESS: a parser that
    was not given it leaves the value another level set)."""
    for action in parser._actions:  # argparse keeps its subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.add_argument(
                    "--app",
                    default=argparse.SUPPRESS,
                    metavar="MODULE:ATTRIBUTE",
                    help="the application (an accord.App), e.g. myservice.accord_app:app;"
                    " default ACCORD_APP",
                )
                _add_app_everywhere(child)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accord", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"accord.commands.{name}").register(sub)
    _add_app_everywhere(parser)
    return parser


def _settings() -> Settings:
    try:
        return load_settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"ACCORD_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors()
        )
        raise SettingsInvalid(problems) from None


def _accord_error(exc: BaseException) -> AccordError | None:
    """The AccordError a failure comes down to: itself, or one of a task group's exception
    group, a refusal (a ConfigError) before the rest, which it explains (the connections it
    closed, the cancellations it caused). Before a process serves (its start: nothing there
    reconnects), a PostgreSQL session that ended under a call is ConnectionLost: one line,
    exit 75, and the supervisor starts the process again. A
    protocol violation is not a lost session (it is a bug: its traceback stands), nor is a
    session lost once the process serves (its loops reconnect; one that did not is a bug
    too)."""
    found = [(leaf, e) for leaf in _leaves(exc) if (e := _accord_leaf(leaf)) is not None]
    if not found:
        return None
    leaf, error = next(((f, e) for f, e in found if isinstance(e, ConfigError)), found[0])
    if leaf is not error:  # the driver's error it stands for: its traceback, once, in the log
        log.warning("the database session ended during the start", exc_info=leaf)
    return error


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _accord_leaf(exc: BaseException) -> AccordError | None:
    if isinstance(exc, AccordError):
        return exc
    if (
        isinstance(exc, db.DB_SESSION_ENDED)
        and not isinstance(exc, asyncpg.ProtocolViolationError)
        and not observe.is_serving()
    ):
        return ConnectionLost(service="postgresql", error=type(exc).__name__)
    return None


def process_name(args: argparse.Namespace) -> str:
    """What this process's PostgreSQL connections are named: the command, and the workflow
    class it serves (``accord worker report``, ``accord consume report_projection``)."""
    workflow = getattr(args, "workflow", None)
    return f"accord {args.command}" + (f" {workflow}" if isinstance(workflow, str) else "")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = _settings()
        logs.configure(settings.log_format, settings.log_level)
        db.name_connections(process_name(args))
        code: int = args.handler(args, settings)
    except BaseException as exc:
        error = _accord_error(exc)
        if error is None:
            raise
        print(f"accord: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_TEMPFAIL if temporary(error) else EXIT_REFUSED
    return code


def temporary(error: AccordError) -> bool:
    """Whether running the command again later may succeed: a service that failed, or an
    error a service's failure caused (its cause chain), or a journal write that failed."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ServiceUnavailable | JournalBroken):
            return True
        cause = cause.__cause__
    return False


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
