"""Applications that must not start, one problem each (tests/integration/test_app_loading.py)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from accord import App, Catalog, Event, EventType, JobContext, Tx


class Placed(BaseModel):
    order_id: str


def _catalog() -> Catalog:
    return Catalog([EventType("order.placed", 1, Placed)])


async def _ignore(tx: Tx, event: Event) -> None:
    return None


async def _job(ctx: JobContext) -> None:
    return None


not_an_app = 42

missing_type = App("missing_type", catalog=_catalog())
missing_type.consumer("orders").on("order.shipped", 1)(_ignore)

one_queue = App("one_queue", catalog=_catalog())
one_queue.consumer("orders", queue="shared").on("order.placed", 1)(_ignore)
one_queue.consumer("audit", queue="shared").on("order.placed", 1)(_ignore)

unowned_key = App("unowned_key", catalog=_catalog())
unowned_key.consumer("orders").on("order.placed", 1)(_ignore)
unowned_key.provider("mailer", owns=("mail.",))
unowned_key.job("orders", owner="w", effects=("mail.send", "charge.card"))(_job)

shared_key = App("shared_key", catalog=_catalog())
shared_key.consumer("orders").on("order.placed", 1)(_ignore)
shared_key.provider("mailer", owns=("mail.",))
shared_key.provider("bulk_mailer", owns=("mail.bulk.",))
shared_key.job("orders", owner="w", effects=("mail.",))(_job)

#: A good application whose migrations live where BADAPP_MIGRATIONS says (the test changes
#: an applied file).
migrating = App(
    "migrating",
    catalog=_catalog(),
    migrations=Path(os.environ.get("BADAPP_MIGRATIONS", "/nonexistent")),
)
migrating.consumer("orders", tenants=("*",)).on("order.placed", 1)(_ignore)
migrating.job("orders", owner="w")(_job)
