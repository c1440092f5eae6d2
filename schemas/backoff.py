"""The one retry policy for lost services: capped exponential backoff with jitter.

Every loop that reconnects (the relay's publish and LISTEN loops, the consumer's session,
the worker's claim and rescue loops) waits ``Backoff.next()`` after a transient failure and
calls ``reset()`` once the service answers again. The delay doubles from ``base_s`` up to
``cap_s``; each wait is drawn uniformly from its upper half ("equal jitter"), so a fleet of
processes that lost the same server does not come back in step, and no wait is ever zero.
Permanent refusals (ServiceRefused) are never retried: they stop the process.
"""

from __future__ import annotations

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
