"""Registration: each workflow class is served by exactly one queue owner.

Invariant: ``jobs.workflows`` names one owner per class and only that owner's claims return
work (the claim reads the registration row FOR KEY SHARE). The owner changes only when the
class is drained (no queued, running, unknown or held work) or through an explicit transfer,
which keeps every job and effect record (their identities) and revokes the running leases so
that the old owner's workers can no longer write back; rescue returns that work to the queue.
"""

from __future__ import annotations

from typing import Any

from accord.jobs import sql
from accord.jobs.errors import WorkflowNotDrained, WorkflowNotRegistered, WorkflowOwnedElsewhere
from accord.jobs.models import Registration
from accord.schemas.db import Tx, require_transaction


async def registration(conn: Any, workflow: str) -> Registration | None:
    """Read-only: the workflow class's registration, if any."""
    row = await conn.fetchrow(sql.REGISTRATION, workflow)
    return None if row is None else Registration.from_record(row)


def check_owner(found: Registration | None, workflow: str, owner: str) -> Registration:
    """Raise unless ``owner`` is the registered queue owner of ``workflow``."""
    if found is None:
        raise WorkflowNotRegistered(workflow=workflow, owner=owner)
    if found.owner != owner:
        raise WorkflowOwnedElsewhere(workflow=workflow, owner=owner, registered_owner=found.owner)
    return found


async def require(conn: Any, workflow: str, owner: str) -> Registration:
    """Read-only: raise WorkflowNotRegistered / WorkflowOwnedElsewhere unless ``owner``
    serves ``workflow``. Workers and every other claimant call this before starting."""
    return check_owner(await registration(conn, workflow), workflow, owner)


async def open_work(tx: Tx, workflow: str) -> dict[str, int]:
    """Counts of the class's jobs that are not finished (queued, running, unknown, held)."""
    return {row["state"]: row["n"] for row in await tx.fetch(sql.OPEN_WORK, workflow)}


async def register(
    tx: Tx,
    workflow: str,
    owner: str,
    *,
    effects_enabled: bool | None,
    who: str = "jobs.registry",
) -> Registration:
    """Runs in the caller's transaction; never commits. Registers ``owner`` for ``workflow``
    (idempotent; sets the effects flag, or with None keeps a registered class's and leaves
    a new one's disabled) and writes a ``jobs.registration_audit`` row naming ``who`` and
    what the registration was before. Raises WorkflowNotDrained if another owner holds a
    class with open work: use ``transfer`` for that.
    """
    require_transaction(tx)
    before = await tx.fetchrow(sql.REGISTRATION_FOR_UPDATE, workflow)
    await tx.execute(sql.REGISTER, workflow, owner, bool(effects_enabled))
    current = Registration.from_record(await tx.fetchrow(sql.REGISTRATION_FOR_UPDATE, workflow))
    if effects_enabled is None:
        # Re-asserting the owner must not turn effects off under running work (its jobs
        # would park effects_disabled, each refused attempt spent): the flag of the row now
        # locked, a concurrent first registration's included.
        effects_enabled = current.effects_enabled
    if current.owner != owner:
        busy = await open_work(tx, workflow)
        if busy:
            raise WorkflowNotDrained(workflow=workflow, owner=current.owner, open=busy)
    await tx.execute(sql.UPDATE_REGISTRATION, workflow, owner, effects_enabled)
    await _audit(tx, "register", Registration(workflow, owner, effects_enabled), before, who)
    return Registration(workflow, owner, effects_enabled)


async def _audit(tx: Tx, action: str, now: Registration, before: Any | None, who: str) -> int:
    audit_id: int = await tx.fetchval(
        sql.AUDIT_REGISTRATION,
        action,
        now.workflow,
        now.owner,
        now.effects_enabled,
        None if before is None else before["owner"],
        None if before is None else before["effects_enabled"],
        who,
    )
    return audit_id


async def audit(conn: Any, workflow: str) -> list[dict[str, Any]]:
    """Read-only: the registration audit of ``workflow``, oldest first."""
    return [dict(row) for row in await conn.fetch(sql.REGISTRATION_AUDIT, workflow)]


async def transfer(
    tx: Tx,
    workflow: str,
    from_owner: str,
    to_owner: str,
    *,
    effects_enabled: bool | None,
    who: str = "jobs.registry",
) -> Registration:
    """Runs in the caller's transaction; never commits. Moves ``workflow`` from
    ``from_owner`` to ``to_owner`` with all its work: jobs keep their ids, operations,
    generations and effect records; running leases are revoked (their fence then fails with
    ``lease_expired``) and rescue requeues that work for the new owner. Waits for claims in
    flight. Raises WorkflowNotRegistered / WorkflowOwnedElsewhere if ``from_owner`` is not
    the current owner.
    """
    require_transaction(tx)
    row = await tx.fetchrow(sql.REGISTRATION_FOR_UPDATE, workflow)
    current = check_owner(
        None if row is None else Registration.from_record(row), workflow, from_owner
    )
    enabled = current.effects_enabled if effects_enabled is None else effects_enabled
    await tx.execute(sql.UPDATE_REGISTRATION, workflow, to_owner, enabled)
    await tx.execute(sql.REVOKE_LEASES, workflow)
    await _audit(tx, "transfer", Registration(workflow, to_owner, enabled), row, who)
    return Registration(workflow, to_owner, enabled)
