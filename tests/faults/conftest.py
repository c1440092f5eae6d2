"""Fixtures for fault tests: a private RabbitMQ node to inject broker faults into."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.rabbit_node import RabbitNode, start_node


@pytest.fixture(scope="module")
def rabbit_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """One private node for the module (~5-10 s to start), stopped whatever happens. A test
    module that changes broker settings overrides ``amqp_url`` with its ``url``. Blocking
    calls (``eval``, ``ctl``) go through ``anyio.to_thread.run_sync`` in async tests."""
    node = start_node(tmp_path_factory.mktemp("rabbit"))
    try:
        yield node
    finally:
        node.stop()
