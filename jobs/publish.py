"""The fenced publish transitions and how their refusals read.

A publish ends a lease's work: ``jobs.succeed`` (one lease) or ``jobs.succeed_many`` (a batch)
re-check the whole fence on the locked row *in the same statement* that marks the job
succeeded, and refuse with the first failing field (a FenceLost) or ``unresolved_effect`` (an
EffectsUnresolved: an effect is pending or unknown). The fence checks themselves live in
jobs.fence; the transaction around a callback is Store.publish's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accord.jobs import fence, sql
from accord.jobs.errors import EffectsUnresolved, JobsError
from accord.jobs.models import Lease

#: A publish's result object: its key and content digest, for its jobs.results manifest row.
Result = tuple[str, str]


@dataclass(frozen=True, slots=True)
class BatchPublished:
    """The outcome of a batch publish: the leases published and the refused with why."""

    published: tuple[Lease, ...]
    refused: tuple[tuple[Lease, JobsError], ...]


def refusal(lease: Lease, status: str) -> JobsError:
    """The publish refusal named by ``status`` (a fence reason or ``unresolved_effect``)."""
    if status == "unresolved_effect":
        return EffectsUnresolved(job_id=lease.job_id, operation_id=lease.operation_id)
    return fence.fence_lost(lease, status)


async def _succeed(
    conn: Any, lease: Lease, result: Result | None = None, *, clean: bool = False
) -> str | None:
    if result is None:
        query = sql.SUCCEED_CLEAN if clean else sql.SUCCEED
        status: str | None = await conn.fetchval(query, *lease.fence_args())
    else:
        query = sql.SUCCEED_WITH_RESULT_CLEAN if clean else sql.SUCCEED_WITH_RESULT
        status = await conn.fetchval(query, *lease.fence_args(), *result)
    return status


async def one(
    conn: Any, lease: Lease, result: Result | None = None, *, clean: bool = False
) -> None:
    """``jobs.succeed`` on ``conn`` (inside the caller's transaction, or as its own): marks the
    job succeeded or raises the refusal, FenceLost or EffectsUnresolved. Raised inside a
    transaction, it rolls back whatever the transaction wrote before it. With ``result``
    (object key, content digest), the same statement writes the job's ``jobs.results``
    manifest row once the transition passed (``jobs.succeed_with_result``). With ``clean``,
    the same statement then resets the session state a callback may have left
    (``jobs.clean_session``): for a connection that goes on serving jobs unreset."""
    status = await _succeed(conn, lease, result, clean=clean)
    if status is not None:
        raise refusal(lease, status)


async def batch(conn: Any, leases: list[Lease]) -> BatchPublished:
    """``jobs.succeed_many`` on ``conn`` (one statement, its own transaction): each lease
    passes the whole fence on its own row or is refused alone. A refused lease is published
    once more on its own, which names the refusal exactly as a publish of it alone would (and
    publishes it, if it passes the whole fence by now)."""
    if not leases:
        return BatchPublished((), ())
    columns = list(zip(*(lease.fence_args() for lease in leases), strict=True))
    done = {row["job_id"] for row in await conn.fetch(sql.SUCCEED_MANY, *columns)}
    refused: list[tuple[Lease, JobsError]] = []
    for lease in leases:
        if lease.job_id not in done:
            status = await _succeed(conn, lease)
            if status is None:
                done.add(lease.job_id)
            else:
                refused.append((lease, refusal(lease, status)))
    published = tuple(lease for lease in leases if lease.job_id in done)
    return BatchPublished(published, tuple(refused))
