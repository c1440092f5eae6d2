"""What one worker process serves and how it runs: the handlers it registered and its settings,
built by the composition root (accord.commands.worker) or by an application's own code."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from accord.jobs import retention
from accord.jobs.runner.context import JobContext
from accord.schemas.errors import ConfigError
from accord.schemas.settings import duration_ok

#: A job handler: does the work of one claimed job through its context.
Handler = Callable[[JobContext], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Registered:
    """One workflow class this worker serves: its handler, the handler's timeout, and the
    effect keys (or prefixes ending in a dot) it may begin (None: not declared, any key)."""

    workflow: str
    handler: Handler
    timeout_s: float
    effects: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker process runs; built by the composition root."""

    owner: str  # the registered queue owner of the classes served
    concurrency: int = 4
    lease_s: float = 60.0
    claim_batch: int = 16
    poll_s: float = 1.0
    # Once every slot was taken, a freed slot waits up to this long before its claim, so that
    # the slots freeing meanwhile share that claim (0: claim at once). Never with one slot,
    # and never more than a tenth of how long an attempt takes (worker.LINGER_SHARE).
    claim_linger_s: float = 0.01
    rescue_every_s: float | None = 5.0  # None: this process does not host the rescue call
    rescue_limit: int = 100
    grace_s: float = 10.0
    record_timeout_s: float = 10.0
    # Retention (jobs.retention.prune, needs the worker's pool): None: this process does not
    # host the prune call. The composition root keeps the retention past the replay horizon.
    prune_every_s: float | None = None
    prune_batch: int = 200
    prune_retention_s: float = 14 * 24 * 3600.0
    prune_audit_retention_s: float = 90 * 24 * 3600.0

    def __post_init__(self) -> None:
        if min(self.concurrency, self.claim_batch, self.rescue_limit) < 1:
            raise ConfigError("worker sizes must be positive", concurrency=self.concurrency)
        for name, value, least in (("lease_s", self.lease_s, 0.0), ("poll_s", self.poll_s, 0.0)):
            if not (math.isfinite(value) and value > least):
                raise ConfigError(f"the worker's {name} must be a positive number", **{name: value})
        if not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise ConfigError("the worker's grace_s must be 0 or more", grace_s=self.grace_s)
        if not (math.isfinite(self.record_timeout_s) and self.record_timeout_s > 0):
            # it bounds every write-back's tries (jobs.runner.write_back): never unbounded
            raise ConfigError(
                "the worker's record_timeout_s must be a positive number",
                record_timeout_s=self.record_timeout_s,
            )
        if not 0 <= self.claim_linger_s < self.lease_s:
            raise ConfigError(
                "claim_linger_s must be at least 0 and shorter than the lease",
                claim_linger_s=self.claim_linger_s,
            )
        if self.rescue_every_s is not None and not 0 < self.rescue_every_s < math.inf:
            raise ConfigError("rescue_every_s must be positive or None")
        if self.prune_every_s is not None and not duration_ok(self.prune_every_s, positive=True):
            raise ConfigError("prune_every_s must be positive or None")
        # At the start, not the first prune: a value the database cannot take (now bounded by
        # retention.check) stopped the worker from its prune loop long after its start.
        retention.check(self.prune_retention_s, self.prune_audit_retention_s, self.prune_batch)
