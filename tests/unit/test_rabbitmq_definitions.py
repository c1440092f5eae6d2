"""deploy/rabbitmq/definitions.json grants each process what the broker checks for what it
does, and nothing outside its application's names.

What each process does is recorded from the code itself: ``topology.declare`` runs against a
recording channel, the relay publishes to the events exchange, a consumer consumes its
class's queue. What the broker checks for each operation is RabbitMQ's access-control table
(https://www.rabbitmq.com/docs/access-control): exchange.declare and queue.declare need
configure on the resource (passive declares need nothing); a queue declared with
``x-dead-letter-exchange`` also needs write on that exchange and read on the queue;
queue.bind needs write on the queue and read on the exchange; basic.publish needs write on
the exchange; basic.consume/get need read on the queue; ack, nack and reject need nothing
(dead-lettering is the broker's own). A permission is an unanchored regular expression
matched against the resource name (Erlang ``re:run``: Python's ``re.search`` for these).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from accord.demo import app as demo_app
from accord.schemas.topology import Topology, declare
from examples.invoicing.app import app as invoicing_app

DEFINITIONS = Path(__file__).resolve().parents[2] / "deploy" / "rabbitmq" / "definitions.json"
PREFIX = "demo"  # the prefix the file is written for: the demo application's default
RELAY, CONSUMER = "accord-relay", "accord-consumer"

Need = tuple[str, str]  # (configure | write | read, resource name)


@dataclass
class _Exchange:
    name: str


@dataclass
class _Queue:
    name: str
    needs: set[Need]

    async def bind(self, exchange: _Exchange, routing_key: str) -> None:
        self.needs |= {("write", self.name), ("read", exchange.name)}


@dataclass
class _RecordingChannel:
    """Records the permission checks of what ``topology.declare`` asks of the broker."""

    needs: set[Need] = field(default_factory=set)

    async def declare_exchange(self, name: str, *_: Any, passive: bool = False, **__: Any) -> Any:
        if not passive:
            self.needs.add(("configure", name))
        return _Exchange(name)

    async def declare_queue(
        self, name: str, *, passive: bool = False, arguments: Any = None, **_: Any
    ) -> Any:
        if not passive:
            self.needs.add(("configure", name))
            dlx = (arguments or {}).get("x-dead-letter-exchange")
            if dlx:
                self.needs |= {("write", dlx), ("read", name)}
        return _Queue(name, self.needs)


def declare_needs(topo: Topology, *, passive: bool = False) -> set[Need]:
    channel = _RecordingChannel()
    anyio.run(lambda: declare(channel, topo, passive=passive))  # type: ignore[arg-type]
    return channel.needs


def relay_needs(topo: Topology, *, passive: bool = False) -> set[Need]:
    """`accord relay`: declares the application's topology at start, then publishes."""
    return declare_needs(topo, passive=passive) | {("write", topo.exchange)}


def consumer_needs(topo: Topology, workflow: str, *, passive: bool = False) -> set[Need]:
    """`accord consume --workflow W`: declares the whole topology, then consumes W's queue."""
    return declare_needs(topo, passive=passive) | {("read", topo.queue(workflow))}


def definitions() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DEFINITIONS.read_text(encoding="utf-8"))
    return loaded


def permissions(user: str, prefix: str = PREFIX) -> dict[str, str]:
    """The user's three patterns, rewritten for another prefix as docs/authority.md says."""
    [found] = [p for p in definitions()["permissions"] if p["user"] == user]
    return {
        kind: found[kind].replace(f"^{PREFIX}\\.", f"^{re.escape(prefix)}\\.")
        for kind in ("configure", "write", "read")
    }


def grants(perms: dict[str, str], need: Need) -> bool:
    kind, name = need
    return re.search(perms[kind], name) is not None


def all_names(topo: Topology) -> list[str]:
    exchanges, queues = topo.names()
    return [*exchanges, *queues]


TOPOLOGIES = [
    pytest.param(demo_app.topology(PREFIX), id="demo"),
    pytest.param(invoicing_app.topology("invoicing"), id="invoicing"),
    pytest.param(demo_app.topology("t0a1b2c3d4"), id="test-prefix"),
]


def test_the_file_holds_one_vhost_two_users_and_no_secret() -> None:
    found = definitions()
    [vhost] = found["vhosts"]
    assert {p["vhost"] for p in found["permissions"]} == {vhost["name"]}
    users = {u["name"]: u for u in found["users"]}
    assert set(users) == {RELAY, CONSUMER} == {p["user"] for p in found["permissions"]}
    for user in users.values():
        # no password in the repository (the operator sets one), no management tags
        assert user["password_hash"] == "" and user["tags"] in ([], "")
    for p in found["permissions"]:
        for kind in ("configure", "write", "read"):
            assert p[kind].startswith("^") and p[kind].endswith("$"), (p["user"], kind)


@pytest.mark.parametrize("topo", TOPOLOGIES)
def test_the_relay_may_declare_the_topology_and_publish_events(topo: Topology) -> None:
    perms = permissions(RELAY, topo.prefix)
    needed = relay_needs(topo)
    assert ("write", topo.exchange) in needed
    assert [n for n in sorted(needed) if not grants(perms, n)] == []


@pytest.mark.parametrize("topo", TOPOLOGIES)
def test_each_consumer_may_declare_the_topology_and_consume_its_queue(topo: Topology) -> None:
    perms = permissions(CONSUMER, topo.prefix)
    for wf in topo.workflows:
        needed = consumer_needs(topo, wf.workflow)
        assert [n for n in sorted(needed) if not grants(perms, n)] == [], wf.workflow


@pytest.mark.parametrize("topo", TOPOLOGIES)
def test_a_consumer_cannot_publish_events(topo: Topology) -> None:
    """Control above: it may write the dead-letter exchange and the queues (the declaration
    needs it); here: never the events exchange."""
    perms = permissions(CONSUMER, topo.prefix)
    assert grants(perms, ("write", topo.dead_letter_exchange))
    assert not grants(perms, ("write", topo.exchange))


@pytest.mark.parametrize("user", [RELAY, CONSUMER])
def test_nothing_outside_the_applications_names(user: str) -> None:
    perms = permissions(user)
    topo = demo_app.topology(PREFIX)
    # control: every name of the topology is granted for configure
    assert all(grants(perms, ("configure", n)) for n in all_names(topo))
    others = [
        "",  # the default exchange, as a client names it
        "amq.default",
        "amq.topic",
        "amq.direct",
        "demox.events",
        "other.demo.events",
        "demo.events.extra",
        "demo.dlx2",
        "demo.wf.",
        "demo.other",
        *all_names(demo_app.topology("demo2")),
        *all_names(invoicing_app.topology("invoicing")),
    ]
    for kind in ("configure", "write", "read"):
        assert [n for n in others if grants(perms, (kind, n))] == [], kind


@pytest.mark.parametrize("topo", TOPOLOGIES)
def test_once_declared_the_narrow_patterns_suffice(topo: Topology) -> None:
    """The narrower patterns docs/authority.md gives for a topology declared by the operator
    and only checked passively: the relay writes the events exchange and nothing else, a
    consumer reads its own queue and nothing else."""
    p = re.escape(topo.prefix)
    relay = {"configure": "^$", "write": f"^{p}\\.events$", "read": "^$"}
    assert all(grants(relay, n) for n in relay_needs(topo, passive=True))
    for wf in topo.workflows:
        name = re.escape(topo.queue(wf.workflow).removeprefix(f"{topo.prefix}.wf."))
        consumer = {"configure": "^$", "write": "^$", "read": f"^{p}\\.wf\\.{name}$"}
        assert all(grants(consumer, n) for n in consumer_needs(topo, wf.workflow, passive=True))
        others = [topo.queue(o.workflow) for o in topo.workflows if o is not wf]
        assert not any(grants(consumer, ("read", q)) for q in others)
        assert not grants(consumer, ("read", topo.poison_queue(wf.workflow)))
