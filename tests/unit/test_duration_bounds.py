"""Every duration a library boundary takes is checked there, as the settings check theirs:
a number of seconds from 0 (or above 0) to 100 years. A NaN, an infinity or 1e12 s passed a
bare ``>= 0`` and failed later, in the database, after the process had started (a worker's
prune loop stopped it; a relay's -1 day retention removed rows published a moment ago)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from accord.consumers import Consumer
from accord.consumers.runtime import RuntimeConfig
from accord.jobs import retention
from accord.jobs.runner.config import WorkerConfig
from accord.jobs.runner.objects import LocalDirStore, collect_garbage
from accord.relay import RelayConfig
from accord.schemas.errors import ConfigError
from accord.schemas.settings import MAX_DURATION_S, duration_ok
from tests.support import DEMO_CATALOG

UNUSABLE = [math.nan, math.inf, -math.inf, 1e12, -86_400.0]


def test_duration_ok_takes_zero_to_a_century_of_seconds() -> None:
    assert [duration_ok(v) for v in (0, 0.0, 1, 7 * 86_400.0, MAX_DURATION_S)] == [True] * 5
    assert [duration_ok(v) for v in UNUSABLE] == [False] * 5
    assert duration_ok(0.0, positive=True) is False
    assert [duration_ok(v) for v in (True, "60", None)] == [False] * 3


@pytest.mark.parametrize("value", UNUSABLE)
def test_a_consumer_s_replay_window_past_a_century_is_refused(value: float) -> None:
    Consumer("report", DEMO_CATALOG, 7 * 86_400.0)  # control
    with pytest.raises(ConfigError):
        Consumer("report", DEMO_CATALOG, value)


@pytest.mark.parametrize("value", UNUSABLE)
def test_the_worker_s_prune_retentions_are_checked_at_its_config(value: float) -> None:
    WorkerConfig(owner="w", prune_retention_s=86_400.0, prune_audit_retention_s=86_400.0)
    for fields in ({"prune_retention_s": value}, {"prune_audit_retention_s": value}):
        with pytest.raises(ConfigError):
            WorkerConfig(owner="w", **fields)
    with pytest.raises(ConfigError):
        retention.check(value, MAX_DURATION_S, 10)


@pytest.mark.parametrize("value", UNUSABLE)
def test_the_relay_s_retentions_are_checked_at_its_config(value: float) -> None:
    base: dict[str, Any] = {"pg_dsn": "postgresql://h/db", "amqp_url": "amqp://h/", "exchange": "x"}
    RelayConfig(**base, retention_s=0.0, audit_retention_s=MAX_DURATION_S)  # control
    for name in ("retention_s", "audit_retention_s"):
        with pytest.raises(ConfigError):
            RelayConfig(**base, **{name: value})


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e12])
def test_the_consumer_s_poison_retention_is_checked_at_its_config(value: float) -> None:
    RuntimeConfig(workflow="report", tenants=frozenset({"acme"}), poison_retention_s=30 * 86_400.0)
    with pytest.raises(ConfigError):
        RuntimeConfig(workflow="report", tenants=frozenset({"acme"}), poison_retention_s=value)


def test_gc_refuses_a_nan_age_and_keeps_a_young_object(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path)
    key = store.put(b"a result a publish is about to name")
    assert collect_garbage(store, set(), 3600.0) == []  # control: young, kept
    with pytest.raises(ValueError, match="older_than_s"):
        collect_garbage(store, set(), math.nan)
    assert store.exists(key)
