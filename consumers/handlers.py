"""Handlers per (event type, version) for one workflow class.

A handler runs inside the runtime's transaction, right after ``reserve`` said the
operation is new: ``await handler(tx, event)``. It writes its effect with ``tx`` and
never commits, never does external I/O (work that needs I/O is started through the jobs
module's idempotent submit). Raising ``PermanentFailure`` poisons the message; any other
exception is transient and the message is retried up to the queue's delivery limit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

from accord.consumers.errors import NoHandler
from accord.schemas.db import Tx
from accord.schemas.events import Event, check_versioned, versioned_type

Handler = Callable[[Tx, Event], Awaitable[None]]


class Handlers:
    """The handlers of one workflow class, keyed by (type, version)."""

    def __init__(self, workflow: str) -> None:
        self.workflow = workflow
        self._by_key: dict[tuple[str, int], Handler] = {}

    def register(self, type_: str, version: int, handler: Handler) -> None:
        """Raises ValueError for a type or version no event can carry (``"1"`` for 1, say:
        it would bind the queue and then match no delivery) or a second handler."""
        check_versioned(type_, version)
        key = (type_, version)
        if key in self._by_key:
            raise ValueError(f"{versioned_type(type_, version)} already has a handler")
        self._by_key[key] = handler

    def on(self, type_: str, version: int) -> Callable[[Handler], Handler]:
        """Decorator form of ``register``."""

        def decorate(handler: Handler) -> Handler:
            self.register(type_, version, handler)
            return handler

        return decorate

    def get(self, event: Event) -> Handler:
        """The handler for this event; NoHandler if this workflow class has none."""
        try:
            return self._by_key[(event.type, event.version)]
        except KeyError:
            raise NoHandler(
                workflow=self.workflow, event_type=versioned_type(event.type, event.version)
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(versioned_type(t, v) for t, v in self._by_key))
