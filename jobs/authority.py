"""Authority epochs against the ledger: changes written ledger-first, and restore detection.

Invariant it owns: **the ledger is never behind an epoch the database committed.** Every
change of a tenant's authority here (rotate, restrict, lift) runs in the caller's
transaction as: lock the tenant row (``jobs.authority_lock``) → append the ledger record and
wait for it to be durable → change the row. The caller commits. The crash windows are:

* ledger appended, database not committed (crash, rollback, refused): the ledger is *ahead*.
  The next check sees the database behind and treats it exactly like a restore (frozen,
  held, advanced by a repair principal). Safe and loud: a person looks.
* the reverse cannot happen on these paths. ``jobs.Store.rotate_epoch`` and ``freeze`` are
  ledger-less primitives; when :func:`check_restore` finds the database *ahead* of the ledger
  it appends an ``observed`` record, closing that gap from then on.

:func:`check_restore` compares each tenant's database epoch with the ledger's highest. A
database behind the ledger was restored (or lost a commit the ledger saw): the tenant is
frozen (no claim, no fence passes, so no effect begins and nothing publishes), its queued and
running work becomes ``held`` with generation + 1 (no old lease is valid again), and a
detection row is opened. Only a repair principal moves the epoch past the ledger again
(jobs.repair.advance_epoch). Processes run :func:`require_authority` at start and
:func:`authority_watch` in their task group.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import asyncpg

from accord import observe
from accord.jobs import repair_sql
from accord.jobs.errors import AuthorityRefused, LedgerUnavailable, RestoreDetected
from accord.jobs.ledger import Ledger, LedgerEntry, LedgerRecord, LedgerWhy
from accord.schemas.backoff import Reconnect
from accord.schemas.db import DB_CONNECTION_LOST, DB_RETRY_LATER, Tx, require_transaction

log = logging.getLogger("jobs.authority")


@dataclass(frozen=True, slots=True)
class TenantRestore:
    """An open restore detection: the tenant's database epoch is behind its ledger epoch."""

    restore_id: int
    tenant: str
    db_epoch: int
    ledger_epoch: int
    held_jobs: int
    newly_detected: bool

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> TenantRestore:
        return cls(
            restore_id=row["restore_id"],
            tenant=row["tenant"],
            db_epoch=row["db_epoch"],
            ledger_epoch=row["ledger_epoch"],
            held_jobs=row["held_jobs"],
            newly_detected=row["newly_detected"],
        )


async def _change(
    tx: Tx,
    ledger: Ledger,
    tenant: str,
    why: LedgerWhy,
    frozen: bool | None,
    who: str | None,
    evidence: str | None,
) -> int:
    require_transaction(tx)
    row = await tx.fetchrow(repair_sql.AUTHORITY_LOCK, tenant)
    # A database behind the ledger was restored (or lost a change the ledger saw), detected
    # or not yet: no change of any kind here, since one epoch more would bring it level with
    # the ledger and hide the restore from every later check. A repair principal resolves it.
    entry = (await ledger.read()).get(tenant)
    await require_ledger_holds(tx, ledger, tenant, entry)
    if row["open_restore"] or (entry is not None and entry.epoch > row["epoch"]):
        raise AuthorityRefused(reason="restore_unresolved", tenant=tenant)
    epoch = int(row["epoch"]) + 1
    frozen = bool(row["frozen"]) if frozen is None else frozen
    # Ledger first (durable), then the row: see the module docstring for the crash windows.
    record = LedgerRecord(
        tenant=tenant, epoch=epoch, frozen=frozen, why=why, who=who, evidence=evidence
    )
    await ledger.append(record)
    status = await tx.fetchval(repair_sql.AUTHORITY_SET, tenant, epoch, frozen)
    if status is not None:
        raise AuthorityRefused(reason=status, tenant=tenant, epoch=epoch)
    return epoch


async def rotate(tx: Tx, ledger: Ledger, tenant: str, *, who: str | None = None) -> int:
    """Runs in the caller's transaction; never commits. Advances the tenant's epoch by one,
    ledger first; once committed every lease under the old epoch fails its fence. Keeps the
    tenant's restriction as it is. Returns the new epoch. Raises AuthorityRefused
    (reason="restore_unresolved") while the database is behind the ledger or a detected
    restore is open, as restrict and lift do."""
    return await _change(tx, ledger, tenant, LedgerWhy.ROTATE, None, who, None)


async def restrict(
    tx: Tx, ledger: Ledger, tenant: str, *, who: str | None = None, evidence: str | None = None
) -> int:
    """Runs in the caller's transaction; never commits. Restricts the tenant: epoch + 1 and
    frozen, ledger first (so lifting it later cannot revive an old lease). Returns the epoch."""
    return await _change(tx, ledger, tenant, LedgerWhy.RESTRICT, True, who, evidence)


async def lift(
    tx: Tx, ledger: Ledger, tenant: str, *, who: str | None = None, evidence: str | None = None
) -> int:
    """Runs in the caller's transaction; never commits. Lifts a restriction (epoch + 1, not
    frozen). Raises AuthorityRefused(reason="restore_unresolved") while the database is behind
    the ledger or a detected restore is open: only a repair principal lifts those."""
    return await _change(tx, ledger, tenant, LedgerWhy.LIFT, False, who, evidence)


async def check_restore(pool: asyncpg.Pool, ledger: Ledger) -> list[TenantRestore]:
    """Compare every tenant's database epoch with the ledger. Each behind it is frozen, its
    queued, running and unknown work held (0060), and a detection opened (each in its own
    short transaction; idempotent). A database ahead of the ledger is recorded in the ledger
    as ``observed``. Returns the detections this pass made or refreshed. Raises
    LedgerUnavailable, also for a ledger that holds less of a tenant than an earlier check
    saw in it (0052: a missing file, a wrong path, an older copy), before anything is
    written to it.
    """
    entries, db = await _ledger_and_tenants(pool, ledger)
    restores: list[TenantRestore] = []
    async with pool.acquire() as conn:
        for tenant, entry in sorted(entries.items()):
            seen = db.get(tenant)
            if seen is not None and seen["epoch"] >= entry.epoch:
                continue
            # Re-checked under the tenant row lock: a change in flight (ledger written, row
            # not yet committed) holds that lock, so it is waited for, not mistaken.
            row = await conn.fetchrow(repair_sql.AUTHORITY_HOLD, tenant, entry.epoch, entry.frozen)
            if row is not None:
                restores.append(TenantRestore.from_record(row))
    for restore in restores:
        if restore.newly_detected:
            log.warning(
                "restore detected: tenant=%s db_epoch=%d ledger_epoch=%d held=%d",
                restore.tenant,
                restore.db_epoch,
                restore.ledger_epoch,
                restore.held_jobs,
            )
    observed = [
        LedgerRecord(tenant=t, epoch=row["epoch"], frozen=row["frozen"], why=LedgerWhy.OBSERVED)
        for t, row in sorted(db.items())
        if t not in entries or row["epoch"] > entries[t].epoch
    ]
    if observed:
        await ledger.append(*observed)
    held = {t: e.epoch for t, e in entries.items()} | {r.tenant: r.epoch for r in observed}
    raised = sorted(
        (t, epoch)
        for t, epoch in held.items()
        if t in db and (db[t]["ledger_epoch"] is None or epoch > db[t]["ledger_epoch"])
    )
    if raised:
        # Durable first: recorded from a frame a power cut could still tear, the record
        # would refuse the ledger for ever after.
        await ledger.sync()
        tenants, epochs = zip(*raised, strict=True)
        await pool.execute(repair_sql.LEDGER_SEEN, list(tenants), list(epochs))
    return restores


async def require_ledger_holds(
    tx: Tx, ledger: Ledger, tenant: str, entry: LedgerEntry | None
) -> None:
    """Raise LedgerUnavailable unless the ledger's ``entry`` for ``tenant`` holds what a check
    saw in it (0052): a change is never written to a ledger the check would refuse. Call
    with the tenant's row locked (jobs.authority_lock): no check records under it meanwhile."""
    seen = await tx.fetchval(repair_sql.LEDGER_EPOCH, tenant)
    if seen is not None and (entry is None or entry.epoch < seen):
        raise _behind(ledger, {tenant: seen})


def _behind(ledger: Ledger, behind: Mapping[str, int]) -> LedgerUnavailable:
    return LedgerUnavailable(
        detail="the ledger holds less of these tenants than a check found in it before:"
        " not this deployment's ledger (check ACCORD_LEDGER_PATH or ACCORD_LEDGER_PG_DSN),"
        " or it lost records (restore it); nothing trusted",
        tenants=sorted(behind),
        seen_epochs=[behind[t] for t in sorted(behind)],
        where=_where(ledger),
    )


async def _ledger_and_tenants(
    pool: asyncpg.Pool, ledger: Ledger
) -> tuple[dict[str, LedgerEntry], dict[str, asyncpg.Record]]:
    """The ledger's entries and the database's tenant rows, refusing (LedgerUnavailable) a
    ledger holding less of a tenant than a check saw in it before. Read again once first: a
    check that read the ledger just before another process appended and recorded what it
    appended is behind by that much, not a wrong ledger (appends are durable before the
    database records them)."""
    entries, db, behind = await _read_both(pool, ledger)
    if behind:
        entries, db, behind = await _read_both(pool, ledger)
    if behind:
        raise _behind(ledger, behind)
    return entries, db


async def _read_both(
    pool: asyncpg.Pool, ledger: Ledger
) -> tuple[dict[str, LedgerEntry], dict[str, asyncpg.Record], dict[str, int]]:
    entries = await ledger.read()
    async with pool.acquire() as conn:
        db = {row["tenant"]: row for row in await conn.fetch(repair_sql.TENANTS)}
    behind = {
        t: row["ledger_epoch"]
        for t, row in db.items()
        if row["ledger_epoch"] is not None
        and (t not in entries or entries[t].epoch < row["ledger_epoch"])
    }
    return entries, db, behind


def _where(ledger: Ledger) -> str:
    path = getattr(ledger, "path", None)
    return str(path.resolve()) if isinstance(path, Path) else type(ledger).__name__


async def open_restores(pool: asyncpg.Pool) -> list[TenantRestore]:
    """Read-only: every detected restore no repair principal has resolved yet."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(repair_sql.OPEN_RESTORES)
    return [TenantRestore.from_record(row) for row in rows]


async def require_authority(
    pool: asyncpg.Pool, ledger: Ledger, *, refuse_restored: bool = False
) -> list[TenantRestore]:
    """Start-up check for every process: runs :func:`check_restore` and returns the open
    detections (affected tenants stay frozen; the process may serve the others). Raises
    LedgerUnavailable when the ledger cannot be verified (refuse to start), and
    RestoreDetected when ``refuse_restored`` and any detection is open."""
    await check_restore(pool, ledger)
    restores = await open_restores(pool)
    if refuse_restored and restores:
        raise RestoreDetected(tenants=[r.tenant for r in restores])
    return restores


OnRestore = Callable[[list[TenantRestore]], Awaitable[None]]


class AuthorityGate:
    """Whether a worker may claim (DESIGN §8): shut until an authority check passes, and
    shut again by a lost database connection or a new one (the pool's ``init`` hook:
    ``connection_opened``), since the database may come back restored: nothing is claimed
    until a check that began after it has passed. The claim loops report their losses
    (``lost``) and claim only while it is open, on a connection opened before they looked;
    the authority watch reports its passes. It may be made outside an event loop (its
    readiness check, ``accord.ops.checks.authority``, reads it from a thread of its own)."""

    def __init__(self) -> None:
        self._open = False
        self._lost: anyio.Event | None = None  # made by a waiter, set by the next loss
        self._losses = 0

    def is_open(self) -> bool:
        return self._open

    def lost(self) -> None:
        """A connection to the database was lost: shut until the next check passes."""
        self._losses += 1
        self._open = False
        if self._lost is not None:
            pulse, self._lost = self._lost, None
            pulse.set()

    async def connection_opened(self, conn: Any) -> None:
        """The pool's ``init`` hook: a new connection may reach a server restarted, or
        restored, since the last check, without any call having failed (an idle connection
        replaced); or the pool merely grew. Either way: shut until the next check passes."""
        self.lost()

    def mark(self) -> int:
        """Taken before a check: ``passed(mark)`` opens only if no loss came since."""
        return self._losses

    def passed(self, mark: int) -> None:
        if mark == self._losses:
            self._open = True

    async def until_lost(self, since: int, timeout_s: float) -> None:
        """Return after ``timeout_s``, or once a loss came after ``since`` (a mark)."""
        with anyio.move_on_after(timeout_s):
            while self._losses == since:
                if self._lost is None:
                    self._lost = anyio.Event()
                await self._lost.wait()


async def authority_watch(
    pool: asyncpg.Pool,
    ledger: Ledger,
    interval_s: float,
    *,
    gate: AuthorityGate | None = None,
    on_restore: OnRestore | None = None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run :func:`check_restore` now and every ``interval_s`` seconds, for ever (start it in
    the process's task group with ``tg.start``: it reports started after the first pass, whose
    errors propagate). ``on_restore`` gets each pass's new detections; ``gate`` opens on each
    pass. A database connection lost under a later pass shuts the gate and is retried with
    the shared backoff; a loss another loop reports (``gate.lost``) brings the next pass
    forward. The ledger's errors propagate: a ledger that cannot be verified stops the
    process rather than letting it run unchecked."""
    gate = gate if gate is not None else AuthorityGate()
    since = gate.mark()
    restores = await _check(pool, ledger, "start")
    gate.passed(since)
    task_status.started()
    reconnect = Reconnect("authority watch", log)
    wait, failed = interval_s, False
    while True:
        fresh = [r for r in restores if r.newly_detected]
        if fresh and on_restore is not None:
            await on_restore(fresh)
        await gate.until_lost(since, wait)
        trigger = "connection" if gate.mark() != since else "retry" if failed else "interval"
        since = gate.mark()
        try:
            restores = await _check(pool, ledger, trigger)
        except LedgerUnavailable:
            raise
        except DB_RETRY_LATER as exc:
            gate.lost()  # whichever: no pass this time, so no claim until one passes
            since, restores, wait, failed = gate.mark(), [], reconnect.lost(exc), True
        else:
            reconnect.up()
            gate.passed(since)
            wait, failed = interval_s, False


async def _check(pool: asyncpg.Pool, ledger: Ledger, trigger: str) -> list[TenantRestore]:
    """One pass of the watch, counted (``accord_authority_checks``) by ``trigger``."""
    try:
        restores = await check_restore(pool, ledger)
    except LedgerUnavailable:
        observe.authority_checked(trigger, "ledger_unavailable")
        raise
    except DB_CONNECTION_LOST:
        observe.authority_checked(trigger, "connection_lost")
        raise
    except DB_RETRY_LATER:
        observe.authority_checked(trigger, "database_busy")
        raise
    observe.authority_checked(trigger, "passed")
    return restores
