"""The one retry policy for lost services: capped exponential backoff with jitter.

Every loop that reconnects (the relay's publish, worker and LISTEN loops, the consumer's
session, the worker's claim loop) holds one :class:`Reconnect`: after a transient failure it
waits ``lost(exc)`` (which also logs the loss, one line), and calls ``up()`` once the service
answers again. The delay doubles from ``base_s`` up to
``cap_s``; each wait is drawn uniformly from its upper half ("equal jitter"), so a fleet of
processes that lost the same server does not come back in step, and no wait is ever zero.
Permanent refusals (ServiceRefused) are never retried: they stop the process.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    base_s: float = 0.1
    cap_s: float = 30.0

    def delay(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (1, 2, ...)."""
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(max(attempt, 1) - 1, 30))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


DEFAULT_POLICY = BackoffPolicy()


@dataclass(slots=True)
class Backoff:
    """One loop's retry state under a policy."""

    policy: BackoffPolicy = DEFAULT_POLICY
    attempt: int = field(default=0)

    def next(self) -> float:
        self.attempt += 1
        return self.policy.delay(self.attempt)

    def reset(self) -> None:
        self.attempt = 0


@dataclass(slots=True)
class Reconnect:
    """One loop's way back to a lost service: the shared backoff, and one log line per loss."""

    what: str
    log: logging.Logger
    policy: BackoffPolicy = DEFAULT_POLICY
    losses: int = 0
    _backoff: Backoff = field(init=False)

    def __post_init__(self) -> None:
        self._backoff = Backoff(self.policy)

    def up(self) -> None:
        """The service answered: the next loss starts the backoff afresh."""
        self._backoff.reset()

    def lost(self, cause: BaseException | str) -> float:
        """Count and log a loss; returns how long to wait before trying again."""
        self.losses += 1
        delay = self._backoff.next()
        why = cause if isinstance(cause, str) else type(cause).__name__
        self.log.warning("%s lost a service; retrying in %.2fs: %s", self.what, delay, why)
        return delay
