"""Fixtures for consumer tests: this test's topology (cleaned up after) and the effect table."""

from __future__ import annotations

import asyncpg
import pytest

from accord.schemas.topology import Topology
from tests.conftest import BrokerNames
from tests.integration.consumers.support import CREATE_EFFECTS, topology_for


def own(names: BrokerNames, topo: Topology) -> Topology:
    """Register a topology's exchanges and queues for deletion after the test."""
    exchanges, queues = topo.names()
    names.exchanges.extend(exchanges)
    names.queues.extend(queues)
    return topo


@pytest.fixture
def topo(broker_names: BrokerNames) -> Topology:
    return own(broker_names, topology_for(broker_names.prefix, delivery_limit=3))


@pytest.fixture
async def effects_pg(pg: asyncpg.Connection) -> asyncpg.Connection:
    await pg.execute(CREATE_EFFECTS)
    return pg
