"""`/healthz` and `/readyz` for a long-running process, beside `/metrics` on its port.

``/healthz``: the process's loops are alive. Each service loop beats (accord.observe); the
answer is 200 while every loop beat within its promise plus the grace, else 503 naming
the stuck loops. A loop waiting for outside work (an idle consumer lane) is not stuck.
A process whose loops are slow because a dependency is down stays live (restarting it
would not help); that is what ``/readyz`` says.

``/readyz``: the process has started and its dependencies answer. Until the process says it
serves (``accord.observe.serving``, where it logs its ready line) it is 503 with ``startup:
starting``, whatever the checks say: a worker still recovering its journal or checking its
authority is not serving yet. A background thread runs the process's checks (PostgreSQL
reachable and its schema current, RabbitMQ reachable, the workflow class registered, ...)
every ``every_s`` with a deadline each, and caches the result, so a probe never waits on a
dependency. Its rounds share one event loop, so the checks keep their connections between
rounds (accord.ops.checks). 200 while the process serves and the last round passed, else 503
with the failing checks and their typed reasons (exception type names, never messages).

Both bodies are one line of JSON.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from accord.observe import LIVENESS, Liveness, is_serving
from accord.schemas.errors import AccordError

#: One named readiness check: returns when the dependency is fine, raises otherwise.
Check = tuple[str, Callable[[], Awaitable[None]]]
Response = tuple[str, list[tuple[str, str]], bytes]


def reason_of(exc: BaseException) -> str:
    """A typed reason for a failed check: accord's ``reason``, else the exception's type."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return reason_of(exc.exceptions[0])
    if isinstance(exc, AccordError):
        return f"{exc.reason}:{type(exc).__name__}"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return type(exc).__name__


@dataclass
class Readiness:
    """The process's readiness checks, run every ``every_s`` on a thread of their own, and
    whether the process has started (``started``: the process-wide flag by default)."""

    checks: Sequence[Check]
    every_s: float = 2.0
    timeout_s: float = 3.0
    started: Callable[[], bool] = is_serving
    _failing: dict[str, str] = field(default_factory=lambda: {"startup": "not_checked_yet"})
    # Rounds are numbered as they start; a round's result is kept unless one that started
    # later has already reported (two threads may run rounds: the loop's and a caller's).
    _started: int = 0
    _reported: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def failing(self) -> dict[str, str]:
        """The checks that failed in the last round, and ``startup`` until the process has
        started (empty: ready)."""
        with self._lock:
            failing = dict(self._failing)
        if not self.started():
            failing["startup"] = "starting"  # before the first round too
        return failing

    def check_once(self) -> dict[str, str]:
        """Run every check now (on an event loop of this call's own, whose connections it
        closes after); cache and return failures, unless a round that started after this one
        has already reported."""
        return anyio.run(self._once)

    async def _once(self) -> dict[str, str]:
        try:
            return await self._checked()
        finally:
            await self._release()

    async def _checked(self) -> dict[str, str]:
        with self._lock:
            self._started += 1
            number = self._started
        failing = await self._round()
        with self._lock:
            if number > self._reported:
                self._failing, self._reported = failing, number
        return failing

    async def _release(self) -> None:
        """Close what the checks keep for this event loop (accord.ops.checks.Kept)."""
        for _, check in self.checks:
            aclose = getattr(check, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _round(self) -> dict[str, str]:
        failing: dict[str, str] = {}
        for name, check in self.checks:
            try:
                with anyio.fail_after(self.timeout_s):
                    await check()
            except Exception as exc:  # noqa: BLE001 - every failure is a typed "not ready"
                failing[name] = reason_of(exc)
        return failing

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="accord-readiness", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        anyio.run(self._serve)

    async def _serve(self) -> None:
        # One event loop for every round of the thread: the checks keep their connections
        # from one round to the next, and close them when the thread stops.
        try:
            while not self._stop.is_set():
                await self._checked()
                await anyio.to_thread.run_sync(self._stop.wait, self.every_s)
        finally:
            await self._release()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s * (len(self.checks) + 1))


def _json(status: str, body: dict[str, Any]) -> Response:
    text = json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n"
    return status, [("Content-Type", "application/json")], text.encode()


def healthz(liveness: Liveness = LIVENESS) -> Response:
    stuck = liveness.stuck()
    if stuck:
        loops = {s.loop: round(s.overdue_s, 1) for s in stuck}
        return _json("503 Service Unavailable", {"status": "stuck", "overdue_s": loops})
    return _json("200 OK", {"status": "ok", "loops": liveness.loops()})


def readyz(readiness: Readiness | None) -> Response:
    failing = readiness.failing() if readiness is not None else {}
    if failing:
        return _json("503 Service Unavailable", {"status": "not_ready", "failing": failing})
    return _json("200 OK", {"status": "ready"})


def routes(
    metrics_app: Callable[..., Iterable[bytes]],
    readiness: Readiness | None,
    liveness: Liveness = LIVENESS,
) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: /healthz and /readyz here, everything else to the metrics app."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            status, headers, body = healthz(liveness)
        elif path == "/readyz":
            status, headers, body = readyz(readiness)
        else:
            return metrics_app(environ, start_response)
        start_response(status, headers)
        return [body]

    return app
