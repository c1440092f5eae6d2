"""Test databases cloned ahead of time, dropped behind.

Each test that takes ``pg_dsn`` gets its own database cloned from the migrated template. A
clone is a ``CREATE DATABASE ... TEMPLATE``: 0.3-0.5 s on this machine, bound by the WAL
flush of the copied catalog, about a fifth of the suite's time when the test paid for it in its
setup. A :class:`DatabaseSupply` runs those statements on threads of its own (three: a clone
is mostly the server's CPU, and the test beside it mostly waits): it keeps the next clones
ready while the current test runs, and drops each returned database after. On
tests/integration/jobs/test_schema.py and test_store.py (2026-12-03): 41-45 s when each test
cloned its own, 28-34 s with two threads, 21-25 s with three.

A database is handed out once and dropped after its test; nothing is reused.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

import asyncpg

from tests.support import unique


class DatabaseSupply:
    """Clones of ``template``, up to ``ahead`` of them ready, made by ``threads`` threads.

    ``take()`` blocks until a clone is ready and raises what the thread met (a refused
    CREATE DATABASE fails the test that wanted it, not the thread silently);
    ``give_back(name)`` queues the database for dropping; ``close()`` drops what is left.
    """

    def __init__(
        self, admin_dsn: str, template: str, *, prefix: str, ahead: int = 4, threads: int = 3
    ) -> None:
        self._admin_dsn = admin_dsn
        self._template = template
        self._prefix = prefix
        self._ahead = ahead
        self._ready: deque[str] = deque()
        self._used: deque[str] = deque()
        self._error: BaseException | None = None
        self._drop_errors: list[str] = []
        self._closing = False
        self._changed = threading.Condition()
        self._threads = [
            threading.Thread(target=self._run, name=f"test-databases-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def take(self) -> str:
        with self._changed:
            while not self._ready and self._error is None:
                self._changed.wait()
            if self._error is not None:
                raise RuntimeError(f"cloning a test database failed: {self._error}")
            name = self._ready.popleft()
            self._changed.notify_all()
            return name

    def give_back(self, name: str) -> None:
        with self._changed:
            self._used.append(name)
            self._changed.notify_all()

    def close(self) -> None:
        """Drop every database still here; raise if a drop failed during the run."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()
        if self._drop_errors:
            raise RuntimeError(f"dropping test databases failed: {self._drop_errors}")

    # -- the thread --------------------------------------------------------------------------

    def _next(self) -> tuple[str, list[str]] | None:
        """What to do next, waiting until there is something: a clone when none is ready
        (a test may be waiting), then the drops, then clones up to ``ahead``."""
        with self._changed:
            while True:
                if self._closing:
                    leftovers = [*self._ready, *self._used]
                    self._ready.clear()
                    self._used.clear()
                    return ("drop", leftovers) if leftovers else None
                if self._error is None and not self._ready:
                    return ("create", [unique(self._prefix)])
                if self._used:
                    return ("drop", [self._used.popleft()])
                if self._error is None and len(self._ready) < self._ahead:
                    return ("create", [unique(self._prefix)])
                self._changed.wait()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            admin = loop.run_until_complete(asyncpg.connect(self._admin_dsn))
        except BaseException as exc:  # noqa: BLE001 - reported to whoever takes a database
            self._failed(exc)
            loop.close()
            return
        try:
            while (step := self._next()) is not None:
                kind, names = step
                for name in names:
                    if kind == "create":
                        sql = f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"'
                    else:
                        sql = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
                    try:
                        loop.run_until_complete(admin.execute(sql))
                    except Exception as exc:  # noqa: BLE001 - reported by take() or close()
                        if kind == "create":
                            self._failed(exc)
                        else:
                            self._drop_errors.append(f"{name}: {exc}")
                        continue
                    if kind == "create":
                        with self._changed:
                            self._ready.append(name)
                            self._changed.notify_all()
        finally:
            loop.run_until_complete(admin.close())
            loop.close()

    def _failed(self, exc: BaseException) -> None:
        with self._changed:
            self._error = exc
            self._changed.notify_all()
