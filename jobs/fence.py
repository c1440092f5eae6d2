"""The fence: the one check every write-back of a lease passes, on a locked job row.

Invariant: a write-back commits only if, at that moment and on the locked row, the job is
still ``running`` under this exact lease (tenant, operation, generation, owner, attempt id,
the tenant's current authority epoch, authority not frozen, lease unexpired by the database
clock). The check and the lock are one SQL function (``jobs.fence``), so a plain SELECT
followed by an UPDATE (a lost update under READ COMMITTED) cannot creep in. The publish
transitions, which fence again in their own statement, are jobs.publish.
"""

from __future__ import annotations

from accord.jobs import sql
from accord.jobs.errors import FENCE_REASONS, FenceLost
from accord.jobs.models import Lease
from accord.schemas.db import Tx, require_transaction


def fence_lost(lease: Lease, reason: str) -> FenceLost:
    """The FenceLost error for ``lease`` failing on ``reason`` (the first mismatching field)."""
    if reason not in FENCE_REASONS:
        raise AssertionError(f"unexpected fence status {reason!r}")
    return FenceLost(
        failed_check=reason,
        job_id=lease.job_id,
        operation_id=lease.operation_id,
        expected_generation=lease.generation,
        attempt_id=str(lease.attempt_id),
    )


async def locked(tx: Tx, lease: Lease) -> None:
    """Runs in the caller's transaction; never commits. Locks the job row until the caller's
    transaction ends and raises FenceLost (naming the field) unless ``lease`` still holds it.
    """
    require_transaction(tx)
    reason = await tx.fetchval(sql.FENCE, *lease.fence_args())
    if reason is not None:
        raise fence_lost(lease, reason)


async def record_result(tx: Tx, lease: Lease, object_key: str, content_digest: str) -> None:
    """Runs in the caller's transaction (a publish callback); never commits. Fences again and
    writes the ``jobs.results`` manifest row that makes ``object_key`` authoritative for the
    lease's job; raises FenceLost (nothing written) unless ``lease`` still holds it."""
    require_transaction(tx)
    reason = await tx.fetchval(sql.RECORD_RESULT, *lease.fence_args(), object_key, content_digest)
    if reason is not None:
        raise fence_lost(lease, reason)
