"""Logging for every `accord` process, set up once by the CLI from settings.

Two formats (``ACCORD_LOG_FORMAT``): ``text`` (the default, one human line) and ``json``
(one JSON object per line: ``time``, ``level``, ``logger``, ``message``, ``trace_id`` and
``span_id`` inside a span, then the identifiers passed as ``extra={...}``). Logs go to
stderr; stdout stays the command's output. A long-running process announces once that it
serves with a record marked ``event=ready`` (:data:`READY`); that one record also goes to
stdout, where a supervisor (or a test) waits for it.

What a log line may carry: identifiers (tenant, operation_id, event_id, job_id,
generation) and typed reasons, never a payload. Extras named like content (``payload``,
``body``, ...) are dropped, and an exception is logged as its type and frames only: an
exception's message may quote the data that caused it.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import traceback
from datetime import UTC, datetime
from typing import Any, TextIO

import asyncpg
from opentelemetry import trace

from accord.schemas.errors import ServiceUnavailable

#: The ready line's marker (``accord.runtime.ready`` logs with it): the process serves (also
#: sent to stdout).
READY: dict[str, str] = {"event": "ready"}

# Extras that would carry content rather than identifiers: never written.
_CONTENT_KEYS = frozenset({"payload", "body", "data", "content", "prompt", "message_body"})
# The attributes every LogRecord has; whatever else a record carries came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName",
}  # fmt: skip
# "relay ready: ...", "worker ready ...": the ready lines written before READY existed.
_READY_TEXT = re.compile(r"^(?:[\w.-]+ )?ready\b")


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The identifiers a record was given with ``extra=``, content keys dropped."""
    return {
        k: v
        for k, v in vars(record).items()
        if k not in _STANDARD and k not in _CONTENT_KEYS and not k.startswith("_")
    }


def _trace_ids() -> dict[str, str]:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    trace_id, span_id = format(context.trace_id, "032x"), format(context.span_id, "016x")
    return {"trace_id": trace_id, "span_id": span_id}


def _exception(record: logging.LogRecord) -> str | None:
    """The exception's type and frames, without its message (which may quote data)."""
    if not record.exc_info or record.exc_info[0] is None:
        return None
    kind, _, tb = record.exc_info
    frames = "".join(traceback.format_tb(tb)) if tb is not None else ""
    return f"Traceback (most recent call last):\n{frames}{kind.__module__}.{kind.__qualname__}"


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_trace_ids(),
        }
        for key, value in extras(record).items():
            line.setdefault(key, _plain(value))
        error = _exception(record)
        if error is not None and record.exc_info and record.exc_info[0] is not None:
            line["exc_type"] = record.exc_info[0].__name__
            line["exc_frames"] = error
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``time LEVEL logger message key=value ...`` (the extras, then trace ids in a span)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        # Not super().format(): it would reuse a traceback another handler cached on the
        # record (``exc_text``), message included.
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        line = self.formatMessage(record)
        fields = {**extras(record), **_trace_ids()}
        if fields:
            line += " " + " ".join(f"{k}={_plain(v)}" for k, v in fields.items())
        error = _exception(record)
        return line if error is None else f"{line}\n{error}"


class _Ready(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "event", None) == "ready" or bool(
            _READY_TEXT.match(record.getMessage())
        )


_HANDLER_MARK = "_accord_handler"

#: asyncpg's pool, restoring its connection floor in the background after a lost connection.
_POOL_LOGGER = "asyncpg.pool"
_POOL_FLOOR = "Failed to restore the pool connection floor"


class _PoolFloor(logging.Filter):
    """asyncpg's pool logs a traceback (frames only here) each time it fails to reopen a lost
    connection, every few seconds for as long as the server is away: the fault the process's
    own loops already report in one line. A server's failure is kept as one line (accord's
    ServiceUnavailable with its own words: host:port, user, database; else the error's type);
    anything else (a defect in the pool's ``init``, say) keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.exc_info and str(record.msg).startswith(_POOL_FLOOR)):
            return True
        error = record.exc_info[1]
        if isinstance(error, ServiceUnavailable):
            what = f"{type(error).__name__}: {error}"
        elif isinstance(error, OSError | asyncpg.PostgresError):
            what = type(error).__name__
        else:
            return True
        record.msg = "postgresql: a lost pool connection not reopened yet (%s); retrying"
        record.args = (what,)
        record.exc_info = None
        return True


def configure(
    fmt: str = "text",
    level: str = "INFO",
    *,
    stderr: TextIO | None = None,
    stdout: TextIO | None = None,
) -> None:
    """Install accord's handlers on the root logger (once per process; a second call
    replaces the first's). Everything at ``level`` and above goes to stderr; ready records
    also to stdout. Later ``logging.basicConfig`` calls then change nothing. asyncpg's pool's
    retries of a lost connection are one line each, not a traceback (_PoolFloor)."""
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    logs = logging.StreamHandler(stderr if stderr is not None else sys.stderr)
    ready = logging.StreamHandler(stdout if stdout is not None else sys.stdout)
    ready.addFilter(_Ready())
    for handler in (logs, ready):
        handler.setFormatter(formatter)
        setattr(handler, _HANDLER_MARK, True)
        root.addHandler(handler)
    root.setLevel(level.upper())
    pool = logging.getLogger(_POOL_LOGGER)
    for old_filter in [f for f in pool.filters if isinstance(f, _PoolFloor)]:
        pool.removeFilter(old_filter)
    pool.addFilter(_PoolFloor())
