"""Fixtures for the relay tests: this test's demo topology on the real broker."""

from __future__ import annotations

import pytest

from accord.schemas.topology import Topology
from tests.integration.relay import helpers


@pytest.fixture
async def topo(amqp_url: str, broker_names: object) -> Topology:
    return await helpers.declare_demo(amqp_url, broker_names)
