"""Topology as data on the real broker: idempotent declare, passive check, quorum + limit."""

from __future__ import annotations

import aio_pika
import aiormq
import pytest

from accord.demo import demo_topology
from accord.schemas.topology import declare
from tests.conftest import BrokerNames


async def test_declare_twice_then_passive_check(amqp_url: str, broker_names: BrokerNames) -> None:
    topo = demo_topology(broker_names.prefix, delivery_limit=7)
    exchanges, queues = topo.names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    conn = await aio_pika.connect(amqp_url)
    try:
        channel = await conn.channel()
        # control: before declaring, the passive check fails (nothing exists yet)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await declare(channel, topo, passive=True)
        channel = await conn.channel()
        first = await declare(channel, topo)
        second = await declare(channel, topo)  # idempotent: same arguments, no error
        assert set(first) == set(second) == {"report", "report_projection"}
        checked = await declare(channel, topo, passive=True)
        assert checked["report"].name == topo.queue("report")
        # A message routed by type reaches the workflow queue.
        events = await channel.get_exchange(topo.exchange)
        await events.publish(aio_pika.Message(b"{}"), routing_key="report.accepted.v1")
        got = await checked["report"].get(no_ack=True, fail=False, timeout=5)
        assert got is not None and got.body == b"{}"
    finally:
        await conn.close()


async def test_queue_is_quorum_with_the_delivery_limit(
    amqp_url: str, broker_names: BrokerNames
) -> None:
    topo = demo_topology(broker_names.prefix, delivery_limit=7)
    exchanges, queues = topo.names()
    broker_names.exchanges.extend(exchanges)
    broker_names.queues.extend(queues)
    conn = await aio_pika.connect(amqp_url)
    try:
        channel = await conn.channel()
        await declare(channel, topo)
        wf = topo.workflow("report")
        assert topo.queue_arguments(wf)["x-queue-type"] == "quorum"
        assert topo.queue_arguments(wf)["x-delivery-limit"] == 7
        # The broker agrees: redeclaring as a classic queue or with another limit is refused.
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await channel.declare_queue(topo.queue("report"), durable=True)
        channel = await conn.channel()
        args = dict(topo.queue_arguments(wf), **{"x-delivery-limit": 8})
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await channel.declare_queue(topo.queue("report"), durable=True, arguments=args)
        channel = await conn.channel()
        same = await channel.declare_queue(
            topo.queue("report"), durable=True, arguments=topo.queue_arguments(wf)
        )  # control: the exact arguments are accepted
        assert same.name == topo.queue("report")
    finally:
        await conn.close()
