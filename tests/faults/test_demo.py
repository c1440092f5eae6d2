"""`accord demo --faults` end to end: real processes, kills, lost replies, reconciliation.

The oracle is the demo's exit code and summary (read from the database) plus the provider's
own evidence: every accepted submission is published exactly once, with one provider request.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import anyio
import pytest

from accord.demo import demo_topology
from tests.conftest import BrokerNames

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
async def test_demo_with_faults_adds_up(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames, tmp_path: Path
) -> None:
    exchanges, queues = demo_topology(broker_names.prefix).names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    env = {
        **os.environ,
        "ACCORD_APP": "accord.demo:app",
        "ACCORD_PG_DSN": pg_dsn,
        "ACCORD_AMQP_URL": amqp_url,
        "ACCORD_TOPOLOGY_PREFIX": broker_names.prefix,
    }
    argv = [sys.executable, "-m", "accord", "demo", "--n", "14", "--faults"]
    done = await anyio.run_process(
        [*argv, "--workdir", str(tmp_path / "demo"), "--timeout-s", "150"],
        env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "fault: SIGKILL relay" in out and "fault: SIGKILL worker-" in out
    # before reconciliation two effects were unknown (the provider dropped their replies) ...
    assert "awaiting reconciliation" in out
    assert "reconcile: resolved=2 resumed=2" in out
    # ... after it, every accepted submission is published, and nothing rolled back leaked
    final = out.rsplit("== accord demo: summary ==", 1)[1]
    assert re.search(r"accepted submissions\s+14\b", final)
    assert re.search(r"reports published\s+14\b", final)
    assert re.search(r"read model \(projection\)\s+14 ", final)
    assert "traces left anywhere: 0" in final
    # the provider's own evidence: one accepted request per report, none repeated
    assert "provider evidence: 14 accepted requests" in out
