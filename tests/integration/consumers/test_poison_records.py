"""One poison record per decision (0057): a redelivered message the consumer already recorded
in the same life (its reject lost after the record's commit) is rejected again with no second
record and no second conflict delivery row; a new life (a fresh delivery, a copy `accord
dead-letters` moved back) and a message with no publish id are always recorded.

The batches go to ``BatchProcessor.process`` directly, as in test_refusals.py, so that one
message can be handed over again as a redelivery; the broker's side of the loss is
tests/integration/consumers/test_broker_faults.py.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import asyncpg

from accord.consumers import Handlers, PermanentFailure
from accord.schemas import wire
from accord.schemas.events import Event
from tests.integration.consumers.support import report
from tests.integration.consumers.test_refusals import Delivered, delivered, processor

DELIVERIES = "SELECT outcome, count(*) AS n FROM consumers.deliveries GROUP BY outcome"
RECORDS = (
    "SELECT reason, redelivered, move_id FROM consumers.poison WHERE operation_id = $1 ORDER BY id"
)


def noted_handlers() -> Handlers:
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def note(tx: Any, event: Event) -> None:
        if event.payload["subject"] == "refused":
            raise PermanentFailure("this report can never be applied")

    return handlers


def again(message: Delivered, tag: int, **headers: str) -> Delivered:
    """The same message handed over again: redelivered, or (with a move id) a moved copy."""
    return replace(
        message,
        delivery_tag=tag,
        redelivered=not headers,
        headers={**message.headers, **headers},
        settled=[],
    )


async def test_a_redelivered_conflict_is_rejected_with_no_second_record(
    pg: asyncpg.Connection,
) -> None:
    """A conflict (the same operation, a changed digest) decided, its reject lost, then
    redelivered: one poison record and one conflict delivery row. Control: the same
    conflicting message moved back by `accord dead-letters` (its move id) is a new
    decision, with its own record and conflict row, even when a redelivery brings it."""
    batch = processor(noted_handlers())
    first = report("conflicted", subject="quarterly")
    changed = first.model_copy(update={"payload": {**first.payload, "subject": "yearly"}})
    await batch.process(pg, [delivered(first, 1)])  # type: ignore[list-item]
    conflict = delivered(changed, 2)
    await batch.process(pg, [conflict])  # type: ignore[list-item]
    redelivery = again(conflict, 3)
    await batch.process(pg, [redelivery])  # type: ignore[list-item]

    assert (conflict.settled, redelivery.settled) == (["reject"], ["reject"])
    rows = await pg.fetch(RECORDS, "conflicted")
    assert [(r["reason"], r["redelivered"]) for r in rows] == [("conflict", False)]
    counts = {r["outcome"]: r["n"] for r in await pg.fetch(DELIVERIES)}
    assert counts == {"new": 1, "conflict": 1}

    # Control: a copy moved back, redelivered before its decision, is a life of its own.
    move_id = str(uuid.uuid4())
    moved = again(conflict, 4, **{wire.MOVE_ID: move_id})
    moved.redelivered = True
    await batch.process(pg, [moved])  # type: ignore[list-item]
    assert moved.settled == ["reject"]
    rows = await pg.fetch(RECORDS, "conflicted")
    assert [(r["redelivered"], r["move_id"]) for r in rows] == [(False, None), (True, move_id)]
    counts = {r["outcome"]: r["n"] for r in await pg.fetch(DELIVERIES)}
    assert counts == {"new": 1, "conflict": 2}


async def test_a_redelivered_message_without_a_publish_id_is_always_recorded(
    pg: asyncpg.Connection,
) -> None:
    """With no publish id there is no life to match (another producer's messages may share
    a body): each decision is recorded. Control: with its publish id the same redelivery
    finds its record."""
    batch = processor(noted_handlers())
    with_id = delivered(report("with-id", subject="refused"), 1)
    bare = delivered(report("bare", subject="refused"), 2)
    del bare.headers["publish-id"]
    await batch.process(pg, [with_id, bare])  # type: ignore[list-item]
    await batch.process(pg, [again(with_id, 3), again(bare, 4)])  # type: ignore[list-item]
    assert len(await pg.fetch(RECORDS, "with-id")) == 1
    assert [r["redelivered"] for r in await pg.fetch(RECORDS, "bare")] == [False, True]
