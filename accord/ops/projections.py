"""Projections: read models rebuilt from events (an application declares them: App.projection).

A projection is a workflow class whose handlers only write projection tables. Its handlers
run twice in the system's life: live, inside the consumer runtime's transaction (after the
inbox reserved the operation), and on replay, under the ``accord_projection`` principal
(accord.ops.replay). They must therefore be deterministic in the event alone and idempotent
(an upsert where the later event wins), so the rebuilt projection equals the live one
whatever the delivery order or the number of redeliveries.
"""

from __future__ import annotations

from dataclasses import dataclass

from accord.consumers import Handlers
from accord.schemas.db import Tx


@dataclass(frozen=True, slots=True)
class Projection:
    """A projection's handlers and how to empty its tables before a rebuild."""

    workflow: str
    handlers: Handlers
    reset_statements: tuple[str, ...]
    #: The tenants its live consumer serves; none, or ``*``: every tenant.
    tenants: tuple[str, ...] = ()

    @property
    def event_types(self) -> list[str]:
        """The versioned event types the projection is built from."""
        return list(self.handlers)

    @property
    def tenant_filter(self) -> list[str]:
        """The tenants whose events a replay applies (as the live consumer admits them);
        empty: every tenant."""
        return [] if not self.tenants or "*" in self.tenants else sorted(self.tenants)

    async def reset(self, tx: Tx) -> None:
        """Runs in the caller's transaction (under the projection principal); never commits."""
        for statement in self.reset_statements:
            await tx.execute(statement)
