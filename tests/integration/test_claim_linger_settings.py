"""The claim linger at the edge: `WorkerConfig` refuses a negative linger or one as long as the
lease (ConfigError), and `accord worker` refuses a negative ACCORD_WORKER_CLAIM_LINGER_S in one
line (SettingsInvalid, exit 2) before it connects to anything. Each with its control."""

from __future__ import annotations

import pytest

from accord.jobs.runner import WorkerConfig
from accord.schemas.errors import ConfigError
from tests.integration.test_actionable_errors import accord, one_line


def test_worker_config_takes_a_linger_from_zero_to_below_the_lease() -> None:
    for linger_s in (0.0, 0.01, 59.9):  # control: accepted as given
        config = WorkerConfig(owner="o", lease_s=60.0, claim_linger_s=linger_s)
        assert config.claim_linger_s == linger_s
    for linger_s in (-0.01, 60.0, float("nan")):
        with pytest.raises(ConfigError, match="claim_linger_s"):
            WorkerConfig(owner="o", lease_s=60.0, claim_linger_s=linger_s)


def test_a_negative_claim_linger_setting_is_refused_in_one_line() -> None:
    done = accord("worker", "--workflow", "report", ACCORD_WORKER_CLAIM_LINGER_S="-1")
    one_line(done, "SettingsInvalid", "ACCORD_WORKER_CLAIM_LINGER_S")
