"""The one retry policy for lost services: capped exponential backoff with equal jitter."""

from __future__ import annotations

import logging

from accord.schemas.backoff import Backoff, BackoffPolicy, Reconnect


def test_waits_double_within_their_jitter_up_to_the_cap_and_never_reach_zero() -> None:
    policy = BackoffPolicy(base_s=0.1, cap_s=2.0)
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.6), (6, 2.0), (40, 2.0)]:
        waits = [policy.delay(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (attempt, min(waits), max(waits))
        assert max(waits) - min(waits) > ceiling / 10  # jittered, not in step
    assert policy.delay(10**6) <= 2.0  # no float overflow on a long outage


def test_a_loop_starts_afresh_once_the_service_answers() -> None:
    backoff = Backoff(BackoffPolicy(base_s=1.0, cap_s=100.0))
    first, second, third = backoff.next(), backoff.next(), backoff.next()
    assert 0.5 <= first <= 1.0 and 1.0 <= second <= 2.0 and 2.0 <= third <= 4.0
    backoff.reset()
    assert 0.5 <= backoff.next() <= 1.0
    reconnect = Reconnect("relay", logging.getLogger("test.backoff"), BackoffPolicy(1.0, 100.0))
    assert 0.5 <= reconnect.lost(OSError()) <= 1.0
    assert 1.0 <= reconnect.lost("broker channel closed") <= 2.0
    reconnect.up()
    assert 0.5 <= reconnect.lost(OSError()) <= 1.0 and reconnect.losses == 3
