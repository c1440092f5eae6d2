"""An attempt's fenced write-backs (an effect's outcome, the publish, the give-up), tried
again while the database is busy or the connection lost (``DB_RETRY_LATER``), until it
answers or the caller's deadline ends the try (``record_timeout_s``, or the handler's own).

A write-back given up at its first lost connection left a finished effect ``pending`` (the
outcome the worker knew, for a provider lookup to find again) or a finished job to its
lease's rescue and a person's resume, while the lease was still good and the same fenced
statement would have passed a moment later. The fence makes a second try safe: it passes
only under the same lease, and a publish that committed before its answer was lost is
told by its job's row (``published_before``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import anyio
import asyncpg

from accord.jobs.models import JobState, JobView, Lease
from accord.jobs.store import Callback, Store
from accord.schemas.backoff import Backoff, BackoffPolicy
from accord.schemas.db import DB_CONNECTION_LOST, DB_RETRY_LATER, Tx

log = logging.getLogger("accord.worker")
T = TypeVar("T")

#: Quick at first (a backend terminated, a deadlock), at most a second apart after.
POLICY = BackoffPolicy(base_s=0.05, cap_s=1.0)


async def again(call: Callable[[], Awaitable[T]], *, what: str, lease: Lease) -> T:
    """``call()`` until it answers (or raises anything but DB_RETRY_LATER); the caller's
    cancel scope bounds the tries. Each try takes the connection the store gives it: a held
    one that failed was given back (``Store.hold``), so the next try has a fresh one."""
    backoff = Backoff(POLICY)
    while True:
        try:
            return await call()
        except DB_RETRY_LATER as exc:
            delay = backoff.next()
            log.warning(
                "%s not written, trying again in %.2fs: job=%s generation=%s (%s)",
                what,
                delay,
                lease.job_id,
                lease.generation,
                type(exc).__name__,
            )
            await anyio.sleep(delay)


async def again_unless_committed(
    call: Callable[[], Awaitable[object]],
    *,
    what: str,
    lease: Lease,
    committed: Callable[[Exception], Awaitable[bool]],
) -> None:
    """``again``, for a write whose lost answer may hide its commit: a try after a lost
    one that is refused asks ``committed(error)`` (the database's rows tell) and, if the
    earlier try committed, the write is done; any other refusal is raised."""
    tries = 0

    async def tried() -> object:
        nonlocal tries
        tries += 1
        try:
            return await call()
        except DB_RETRY_LATER:
            raise
        except Exception as exc:  # a refusal: raised unless an earlier try committed
            if tries > 1 and await committed(exc):
                log.info("%s committed before its answer was lost: job=%s", what, lease.job_id)
                return None
            raise

    await again(tried, what=what, lease=lease)


async def published_before(store: Store, lease: Lease) -> bool:
    """Whether the job succeeded at this lease's generation: only this attempt's publish
    makes it so (any other attempt runs at a later generation), so a try refused on the
    job's state after one whose answer was lost committed."""
    job = await _job(store, lease)
    return job.state is JobState.SUCCEEDED and job.generation == lease.generation


async def given_up_before(store: Store, lease: Lease, reason: str) -> JobState | None:
    """The state this attempt's give-up left the job in, when a try whose answer was lost
    committed it; else None. At this lease's generation only this attempt's ``fail`` ends
    the run and writes its reason (rescue, cancel and repair move the generation on)."""
    job = await _job(store, lease)
    if (
        job.generation == lease.generation
        and job.state is not JobState.RUNNING
        and job.last_error == reason
    ):
        return job.state
    return None


async def recorded_before(store: Store, lease: Lease, key: str, seq: int, state: str) -> bool:
    """Whether this attempt's record ``(key, seq)`` holds ``state``: a finish refused as
    not pending after one whose answer was lost committed."""
    job = await _job(store, lease)
    return any(
        e.effect_key == key and e.seq == seq and e.attempt_id == lease.attempt_id
        and str(e.state) == state
        for e in job.effects
    )  # fmt: skip


async def _job(store: Store, lease: Lease) -> JobView:
    return await again(lambda: store.job(lease.job_id), what="the job's row", lease=lease)


class CallbackError(Exception):
    """A publish callback's own client-side error (asyncpg's InterfaceError for a wrong
    argument, an OSError of its own I/O, ...) on a connection still open: the callback's
    fault, not a lost connection, so never tried again."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def own_errors(callback: Callback) -> Callback:
    """``callback``, its DB_RETRY_LATER errors told apart: a server's (a deadlock, a
    statement timeout: its transaction rolled back) or a lost connection's stay retryable;
    a client-side one on a connection still open is the callback's own (CallbackError)."""

    async def call(tx: Tx) -> None:
        try:
            await callback(tx)
        except DB_CONNECTION_LOST as exc:
            connection = cast(asyncpg.Connection, tx)  # the store's (or its pool's proxy)
            if isinstance(exc, asyncpg.PostgresError) or connection.is_closed():
                raise
            raise CallbackError(exc) from exc

    return call
