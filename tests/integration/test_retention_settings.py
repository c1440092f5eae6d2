"""The replay horizon rule at the edge: `accord worker` and `accord consume` refuse (one line,
exit 2) a jobs or poison retention shorter than the replay horizon (inbox_replay_window_s plus
the inbox's prune margin) and an audit retention shorter than the jobs retention, before they
connect to anything."""

from __future__ import annotations

import pydantic
import pytest

from accord.commands.common import check_retention
from accord.consumers import RuntimeConfig
from accord.consumers.inbox import PRUNE_MARGIN_S, replay_horizon_s
from accord.demo.app import PROJECTION
from accord.errors import SettingsInvalid
from accord.relay import RelayConfig
from accord.schemas.db import MAX_PRUNE_BATCH
from accord.schemas.errors import ConfigError
from accord.schemas.settings import Settings
from tests.integration.test_actionable_errors import accord, one_line

WORKER = ("worker", "--workflow", "report")
CONSUME = ("consume", "--workflow", "report", "--tenant", "*")
# replay prunes its ledger by the audit retention: the same checks (before, none).
REPLAY = ("replay", "--workflow", PROJECTION, "--since", "1h")
WINDOW = "3600"


def test_the_defaults_and_the_shortest_allowed_retention_pass() -> None:
    check_retention(Settings())
    horizon = 3600 + PRUNE_MARGIN_S
    shortest = Settings(
        inbox_replay_window_s=3600,
        jobs_retention_s=horizon,
        poison_retention_s=horizon,
        audit_retention_s=horizon,
    )
    assert replay_horizon_s(shortest.inbox_replay_window_s) == horizon
    check_retention(shortest)
    with pytest.raises(SettingsInvalid, match="ACCORD_JOBS_RETENTION_S"):
        check_retention(shortest.model_copy(update={"jobs_retention_s": horizon - 1}))


@pytest.mark.parametrize("command", [WORKER, CONSUME, REPLAY], ids=["worker", "consume", "replay"])
def test_a_retention_shorter_than_the_replay_horizon_is_refused(command: tuple[str, ...]) -> None:
    for name in ("JOBS_RETENTION_S", "POISON_RETENTION_S"):
        done = accord(
            *command,
            ACCORD_INBOX_REPLAY_WINDOW_S=WINDOW,
            **{f"ACCORD_{name}": "3600"},
            timeout=30,
        )
        line = one_line(done, "SettingsInvalid", f"ACCORD_{name}=3600", "replay horizon")
        assert f"= {3600 + PRUNE_MARGIN_S:g} s" in line
    short_audit = accord(
        *command,
        ACCORD_INBOX_REPLAY_WINDOW_S=WINDOW,
        ACCORD_JOBS_RETENTION_S="7200",
        ACCORD_AUDIT_RETENTION_S="7000",
        timeout=30,
    )
    one_line(short_audit, "SettingsInvalid", "ACCORD_AUDIT_RETENTION_S=7000", "JOBS_RETENTION")


def test_a_prune_batch_larger_than_the_prune_functions_take_is_refused_at_configuration() -> None:
    relay = {"pg_dsn": "postgresql://x/y", "amqp_url": "amqp://x/", "exchange": "e"}
    consumer = {"workflow": "report", "tenants": frozenset({"acme"})}
    for size in (1, MAX_PRUNE_BATCH):  # control: the range the prune functions take
        assert RelayConfig(**relay, prune_batch=size).prune_batch == size
        assert RuntimeConfig(**consumer, prune_batch=size).prune_batch == size
        assert Settings(relay_prune_batch=size).relay_prune_batch == size
    # past it, the relay's and the consumer's first prune would stop them
    with pytest.raises(ConfigError, match="prune batch"):
        RelayConfig(**relay, prune_batch=MAX_PRUNE_BATCH + 1)
    with pytest.raises(ConfigError, match="prune batch"):
        RuntimeConfig(**consumer, prune_batch=MAX_PRUNE_BATCH + 1)
    with pytest.raises(pydantic.ValidationError, match="relay_prune_batch"):
        Settings(relay_prune_batch=MAX_PRUNE_BATCH + 1)
