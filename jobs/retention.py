"""Retention of the jobs module: finished jobs leave, with everything that was theirs, only
when nothing may still need them.

Invariant it owns (jobs.prune, migration 0023): a job is removed only when it is succeeded,
failed or canceled, older than the retention, and has no effect record pending or unknown
(nor one resolved within the retention); then its operation key, effect records, traces,
escalations and result manifest go with it in the same statement. queued, running, held,
poison and unknown jobs are never removed. A redelivery racing the pruner either finds its
job (``jobs.submit`` holds it until its caller commits, and the pruner passes it by) or finds
no key and creates a new job; it is never handed a job that disappears under it.

The retention must be at least the replay horizon (the inbox's replay window plus its prune
margin), so that a redelivery that can still arrive finds its inbox row or its job. The
database holds it: each consumer declares its window at start (migration 0027), and
jobs.prune refuses a retention shorter than the longest declared horizon, whoever calls it
(``RetentionTooShort``); the composition root refuses such settings before anything starts
(``accord.commands.common.check_retention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from accord.jobs import sql
from accord.jobs.errors import PruneBlocked
from accord.schemas.db import MAX_PRUNE_BATCH, Tx, require_transaction, retention_refusal
from accord.schemas.errors import ConfigError
from accord.schemas.settings import duration_ok

#: The most jobs one batch may hold (jobs.prune refuses more): a batch is one short transaction.
MAX_BATCH = MAX_PRUNE_BATCH


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one batch removed, per table (operation keys, traces and escalations go with
    their jobs and are not counted apart; ``tombstones``: jobs.pruned_attempts rows one
    retention old, 0054)."""

    jobs: int = 0
    effects: int = 0
    results: int = 0
    audit: int = 0
    tombstones: int = 0

    @property
    def rows(self) -> int:
        return self.jobs + self.effects + self.results + self.audit + self.tombstones

    def full(self, limit: int) -> bool:
        """True when the batch was full: more may be waiting, run the next one at once."""
        return max(self.jobs, self.audit, self.tombstones) >= limit


def check(retention_s: float, audit_retention_s: float, limit: int) -> None:
    """Raise ConfigError unless the values can work (0 to 100 years, audit retention at least
    the jobs retention, 1 <= limit <= MAX_BATCH). Says nothing of the replay horizon."""
    if not duration_ok(retention_s):
        raise ConfigError(
            "the jobs retention must be a number of seconds >= 0, at most 100 years",
            retention_s=retention_s,
        )
    if not (duration_ok(audit_retention_s) and audit_retention_s >= retention_s):
        raise ConfigError(
            "the audit retention must be at least the jobs retention, at most 100 years",
            audit_retention_s=audit_retention_s,
            retention_s=retention_s,
        )
    if not 1 <= limit <= MAX_BATCH:
        raise ConfigError(f"a prune batch holds 1 to {MAX_BATCH} jobs", limit=limit)


async def prune(tx: Tx, *, retention_s: float, audit_retention_s: float, limit: int) -> Pruned:
    """Runs in the caller's transaction; never commits. jobs.prune checks the deferrable
    references to ``jobs.jobs`` before it returns, then sets them back to their declared mode
    (0039), so the caller's own deferred constraints stay deferred and several batches may
    share one transaction. Removes one bounded batch (at
    most ``limit`` jobs, oldest first, skipping rows other transactions hold) of finished,
    resolved jobs older than ``retention_s`` (and than the longest declared replay horizon
    plus the largest declared margin, the inbox's tolerance for a clock ahead, 0063) with
    everything that was theirs, and of repair audit rows older than ``audit_retention_s``
    whose job is gone. Callers loop, one short
    transaction per batch, while ``Pruned.full(limit)``.

    Raises ConfigError for values that cannot work (see ``check``), RetentionTooShort (a
    ConfigError, with ``horizon_s`` and ``consumer``) when ``retention_s`` is shorter than a
    consumer's declared replay horizon, and PruneBlocked (naming the constraint and its
    table) when another schema's foreign key forbids removing a job of the batch: in each
    case nothing is removed.
    """
    require_transaction(tx)
    check(retention_s, audit_retention_s, limit)
    try:
        with retention_refusal(retention_s):
            row = await tx.fetchrow(sql.PRUNE, float(retention_s), float(audit_retention_s), limit)
    except asyncpg.ForeignKeyViolationError as exc:
        raise PruneBlocked(
            constraint=exc.constraint_name, table=exc.table_name, schema=exc.schema_name
        ) from exc
    return Pruned(
        jobs=row["jobs_pruned"],
        effects=row["effects_pruned"],
        results=row["results_pruned"],
        audit=row["audit_pruned"],
        tombstones=row["tombstones_pruned"],
    )
