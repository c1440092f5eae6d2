"""Broker topology as data (DESIGN.md §5), declared idempotently or checked passively.

One topic exchange for events; per workflow class one durable quorum queue bound by
versioned event type, with an explicit ``x-delivery-limit`` and a dead-letter exchange
that routes to the class's poison queue. Names derive from one prefix so a test or a
deployment owns its own namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aiormq

from accord.schemas.errors import ConfigError

DEFAULT_DELIVERY_LIMIT = 5

# What the broker answers a declaration it will never accept: a name declared otherwise
# (type, arguments), one missing from a passive check, or one this user may not declare.
# Not a lost connection: declaring again fails the same way for ever.
MISMATCH: tuple[type[Exception], ...] = (
    aiormq.exceptions.ChannelPreconditionFailed,
    aiormq.exceptions.ChannelNotFoundEntity,
    aiormq.exceptions.ChannelAccessRefused,
)


def mismatch(exc: Exception, **where: str) -> ConfigError:
    """The ConfigError for a declaration the broker will never accept (one of MISMATCH):
    ``where`` (the exchange or the queue) and the broker's own words."""
    return ConfigError(
        "the broker's topology differs from the code's, or this user may not declare it: see"
        " detail (a queue's arguments cannot change in place: delete it, or use another"
        " ACCORD_TOPOLOGY_PREFIX)",
        **where,
        error=type(exc).__name__,
        detail=str(exc)[:200],
    )


@dataclass(frozen=True, slots=True)
class WorkflowQueue:
    """One workflow class: its queue, the event types bound to it, its poison queue."""

    workflow: str
    event_types: tuple[str, ...]  # versioned types, e.g. ("order.placed.v1",)
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT
    #: The queue's name below the prefix, when it is not the class name.
    queue_name: str | None = None

    @property
    def name(self) -> str:
        return self.queue_name or self.workflow


@dataclass(frozen=True, slots=True)
class Topology:
    prefix: str
    workflows: tuple[WorkflowQueue, ...] = field(default_factory=tuple)

    @property
    def exchange(self) -> str:
        return f"{self.prefix}.events"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.prefix}.dlx"

    def _queue_name(self, workflow: str) -> str:
        found = next((wf for wf in self.workflows if wf.workflow == workflow), None)
        return workflow if found is None else found.name

    def queue(self, workflow: str) -> str:
        return f"{self.prefix}.wf.{self._queue_name(workflow)}"

    def poison_queue(self, workflow: str) -> str:
        return f"{self.prefix}.wf.{self._queue_name(workflow)}.poison"

    def workflow(self, name: str) -> WorkflowQueue:
        for wf in self.workflows:
            if wf.workflow == name:
                return wf
        raise KeyError(name)

    def queue_arguments(self, wf: WorkflowQueue) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": wf.delivery_limit,
            "x-dead-letter-exchange": self.dead_letter_exchange,
            "x-dead-letter-routing-key": wf.name,
        }

    def names(self) -> tuple[list[str], list[str]]:
        """(exchanges, queues) this topology declares — for cleanup and checks."""
        queues = [
            q
            for wf in self.workflows
            for q in (self.queue(wf.workflow), self.poison_queue(wf.workflow))
        ]
        return [self.exchange, self.dead_letter_exchange], queues


async def declare(
    channel: aio_pika.abc.AbstractChannel, topology: Topology, *, passive: bool = False
) -> Mapping[str, aio_pika.abc.AbstractQueue]:
    """Declare (or, with ``passive``, check) everything; safe to repeat. Returns queues by class."""
    events = await channel.declare_exchange(
        topology.exchange, aio_pika.ExchangeType.TOPIC, durable=True, passive=passive
    )
    dlx = await channel.declare_exchange(
        topology.dead_letter_exchange, aio_pika.ExchangeType.DIRECT, durable=True, passive=passive
    )
    queues: dict[str, aio_pika.abc.AbstractQueue] = {}
    for wf in topology.workflows:
        poison = await channel.declare_queue(
            topology.poison_queue(wf.workflow),
            durable=True,
            passive=passive,
            arguments=None if passive else {"x-queue-type": "quorum"},
        )
        queue = await channel.declare_queue(
            topology.queue(wf.workflow),
            durable=True,
            passive=passive,
            arguments=None if passive else topology.queue_arguments(wf),
        )
        if not passive:
            await poison.bind(dlx, routing_key=wf.name)
            for event_type in wf.event_types:
                await queue.bind(events, routing_key=event_type)
        queues[wf.workflow] = queue
    return queues
