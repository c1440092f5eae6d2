"""The worker's periodic calls beside its claims, each a loop of its own until the worker stops:
the jobs module's rescue (rescue itself stays ``Store.rescue``), retention (one bounded batch
at a time, ``jobs.retention.prune``) and the journal's rotation (the live segment sealed once
it passes its bound, ``jobs.runner.recovery.rotate_journal``). Each polls; a lost database
costs a round, never the worker.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from accord import observe
from accord.jobs import retention
from accord.jobs.errors import PruneBlocked
from accord.jobs.runner import recovery
from accord.jobs.runner.config import WorkerConfig
from accord.jobs.runner.endings import WorkerStats
from accord.jobs.runner.journal import RunnerJournal
from accord.jobs.store import Store
from accord.schemas.backoff import Backoff, BackoffPolicy
from accord.schemas.db import DB_RETRY_LATER
from accord.schemas.errors import RetentionTooShort

log = logging.getLogger("accord.worker")


class Upkeep:
    """One worker's upkeep loops; each returns once ``stop`` is set (the worker's stop)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        store: Store,
        pool: Any,
        journal: RunnerJournal,
        stats: WorkerStats,
        stop: anyio.Event,
    ) -> None:
        self._config = config
        self._store = store
        self._pool = pool
        self._journal = journal
        self._stats = stats
        self._stop = stop

    async def _nap(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._stop.wait()

    async def rescue(self, every_s: float) -> None:
        """``Store.rescue`` every ``every_s``: jobs whose lease ran out (or whose epoch was
        rotated) go back to the queue, or to unknown when an effect forbids a rerun."""
        while not self._stop.is_set():
            observe.beat("worker.rescue", within_s=every_s)
            try:
                report = await self._store.rescue(self._config.rescue_limit)
            except DB_RETRY_LATER as exc:
                log.warning("rescue failed (%s)", type(exc).__name__)
            else:
                for rescued in report.rescued:
                    self._stats.rescued[str(rescued.state)] += 1
                    observe.rescued(str(rescued.state))
                    log.info(
                        "rescued job=%s tenant=%s to %s (generation %s)",
                        rescued.job_id,
                        rescued.tenant,
                        rescued.state,
                        rescued.generation,
                    )
            await self._nap(every_s)

    async def prune(self, every_s: float) -> None:
        """Retention: one short transaction per bounded batch (jobs.retention.prune); while
        they come back full (a backlog) the next follows after a pause as long as the batch
        took, so retention takes at most half of this loop's time, else a nap of ``every_s``.
        A batch another schema's foreign key refuses (PruneBlocked), or a retention shorter
        than a consumer's declared replay horizon (RetentionTooShort), is logged and tried
        again after a growing wait, capped at an hour: retention stops there, the jobs never
        do."""
        cfg = self._config
        blocked = Backoff(BackoffPolicy(base_s=every_s, cap_s=max(every_s, 3600.0)))
        while not self._stop.is_set():
            wait = every_s
            started = anyio.current_time()
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    pruned = await retention.prune(
                        conn,
                        retention_s=cfg.prune_retention_s,
                        audit_retention_s=cfg.prune_audit_retention_s,
                        limit=cfg.prune_batch,
                    )
            except (PruneBlocked, RetentionTooShort) as exc:
                wait = blocked.next()
                log.error("retention blocked, retrying in %.0f s: %s", wait, exc)
            except DB_RETRY_LATER as exc:
                log.warning("prune failed (%s)", type(exc).__name__)
            else:
                blocked.reset()
                if pruned.rows:
                    log.info(
                        "pruned jobs=%d effects=%d results=%d audit=%d tombstones=%d",
                        pruned.jobs,
                        pruned.effects,
                        pruned.results,
                        pruned.audit,
                        pruned.tombstones,
                    )
                if pruned.full(cfg.prune_batch):
                    wait = min(every_s, anyio.current_time() - started)
            observe.beat("worker.prune", within_s=wait)
            await self._nap(wait)

    async def rotate(self) -> None:
        """Seal the journal's live segment whenever it passes its bound (polling), carrying
        forward the effects the database has not recorded; a failed try waits and retries."""
        while not self._stop.is_set():
            wait = self._config.poll_s
            if self._journal.rotation_due:
                try:
                    await recovery.rotate_journal(self._pool, self._journal)
                except DB_RETRY_LATER as exc:  # OSError too: a write before the switch
                    # The live segment is whole and still written; only its sealing waits.
                    wait = max(wait, 5.0)
                    log.warning("journal rotation failed (%s), retrying", type(exc).__name__)
            observe.beat("worker.journal", within_s=wait)
            await self._nap(wait)
