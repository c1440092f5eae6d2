"""`accord relay held` and `accord relay release-held` on a row the relay really held.

A type no queue binds is held as unroutable by a running relay; the real commands list it
and release it (audited, as the repair role); once a queue binds the type a relay publishes
it, once. The control: releasing a row that is not held is refused, changes nothing and
writes no audit row; a release naming a held and a not-held row releases neither.
`accord relay discard-held` removes a held row for good, audited, the same way (0061).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import aio_pika
import anyio
import asyncpg
import pytest
from pydantic import BaseModel, ConfigDict

from accord.demo.catalog import demo_catalog
from accord.relay import DiscardRefused, Relay, ReleaseRefused, outbox
from accord.schemas.events import Catalog, Event, EventType
from accord.schemas.topology import Topology
from tests.conftest import BrokerNames
from tests.integration.relay import helpers
from tests.support import enqueue

TENANT = "acme"


class AuditNotedV1(BaseModel):
    model_config = ConfigDict(frozen=True)
    note: str


def catalog_with_unbound_type() -> Catalog:
    catalog = demo_catalog()
    catalog.register(EventType("audit.noted", 1, AuditNotedV1))
    return catalog


def accord(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "accord", *args],
        env={**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": dsn},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def unbound(n: int) -> Event:
    return Event(
        tenant=TENANT, operation_id=f"audit:{n}", type="audit.noted", version=1,
        payload={"note": "SECRET-body-never-printed"},
    )  # fmt: skip


async def hold_with_a_relay(dsn: str, amqp_url: str, topo: Topology, events: list[Event]) -> None:
    """Enqueue ``events`` (no queue binds their type) and one routable event behind them; run
    a relay until the routable one is published and the others are held as unroutable."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            for event in events:
                await enqueue(conn, event, catalog=catalog_with_unbound_type())
            await enqueue(conn, helpers.make_event(0, tenant=TENANT))
    finally:
        await conn.close()
    relay = Relay(helpers.config(dsn, amqp_url, topo, unroutable_attempts=2))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.wait_until_settled(dsn, expect_published=1, within_s=30)
        relay.stop()
    assert relay.stats.held == len(events)


async def audit_rows(pg: asyncpg.Connection) -> int:
    return int(await pg.fetchval("SELECT count(*) FROM relay.release_audit"))


@pytest.mark.timeout(120)
async def test_release_held_makes_a_held_row_publishable_and_audits_it(
    pg_dsn: str, pg: asyncpg.Connection, amqp_url: str, broker_names: BrokerNames
) -> None:
    topo = await helpers.declare_demo(amqp_url, broker_names)
    held, other = unbound(1), unbound(2)
    await hold_with_a_relay(pg_dsn, amqp_url, topo, [held, other])

    # `accord relay held` lists both, with the reason and attempts, never the body.
    listed = accord(pg_dsn, "relay", "held")
    assert listed.returncode == 0, listed.stderr
    for event in (held, other):
        assert f"event_id={event.event_id} type=audit.noted.v1 reason=unroutable" in listed.stdout
    assert "attempts=2" in listed.stdout and "held: 2 rows" in listed.stdout
    assert "SECRET" not in listed.stdout
    as_json = json.loads(accord(pg_dsn, "relay", "held", "--json").stdout)
    assert {r["event_id"] for r in as_json} == {str(held.event_id), str(other.event_id)}
    assert all(r["reason"] == "unroutable" and r["tenant"] == TENANT for r in as_json)

    # A queue now binds the type; release one row with the real command (repair role).
    amqp = await aio_pika.connect(amqp_url)
    channel = await amqp.channel()
    queue = await channel.declare_queue(broker_names.queue("audit"), durable=True)
    await queue.bind(topo.exchange, routing_key="audit.noted.v1")
    released = accord(
        pg_dsn, "relay", "release-held", "--tenant", TENANT, "--event-id", str(held.event_id),
        "--who", "ops-anna", "--evidence", "ticket-42: audit queue bound",
    )  # fmt: skip
    assert released.returncode == 0, released.stderr
    assert "released outbox=" in released.stdout and str(held.event_id) in released.stdout
    row = await pg.fetchrow("SELECT * FROM relay.outbox WHERE event_id = $1", held.event_id)
    assert row["state"] == "pending" and row["last_reason"] == "unroutable"
    audit = await outbox.release_audit(pg, TENANT, held.event_id)
    assert len(audit) == 1
    assert (audit[0].outbox_id, audit[0].held_reason, audit[0].attempts) == (
        row["id"],
        "unroutable",
        2,
    )
    assert (audit[0].who, audit[0].evidence) == ("ops-anna", "ticket-42: audit queue bound")
    assert (audit[0].db_user, audit[0].db_role) == ("postgres", "accord_repair")

    # A relay publishes it, once; the row not released stays held.
    relay = Relay(helpers.config(pg_dsn, amqp_url, topo))
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.run)
        await helpers.wait_until_settled(pg_dsn, expect_published=2, within_s=30)
        relay.stop()
    counts = await helpers.drain(amqp_url, queue.name)
    assert counts == {str(held.event_id): 1}
    await amqp.close()
    state = "SELECT state FROM relay.outbox WHERE event_id = $1"
    assert await pg.fetchval(state, held.event_id) == "published"
    assert await pg.fetchval(state, other.event_id) == "held"

    # Control: a row that is not held (published now) is refused, with the held one beside
    # it too: nothing changes and no audit row is written.
    for ids in ([held.event_id], [other.event_id, held.event_id]):
        refused = accord(
            pg_dsn, "relay", "release-held", "--tenant", TENANT,
            *[a for i in ids for a in ("--event-id", str(i))],
            "--who", "ops-anna", "--evidence", "again",
        )  # fmt: skip
        assert refused.returncode == 2, refused.stdout
        assert refused.stderr.startswith("accord: ReleaseRefused:"), refused.stderr
        assert "not_held" in refused.stderr and str(held.event_id) in refused.stderr
    assert await audit_rows(pg) == 1
    assert await pg.fetchval(state, other.event_id) == "held"


async def test_release_refusals_and_the_append_only_audit(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    ids = []
    async with pg.transaction():
        for n in (1, 2):
            event = unbound(n)
            await enqueue(pg, event, catalog=catalog_with_unbound_type())
            ids.append(event.event_id)
    await pg.execute(
        "UPDATE relay.outbox SET state = 'held', last_reason = 'oversize' WHERE event_id = $1",
        ids[0],
    )
    repair = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_repair"})
    try:
        # The allowed case first: the held row is released by the repair role.
        async with repair.transaction():
            done = await outbox.release_held(repair, TENANT, ids[:1], who="w", evidence="e")
        assert [r.event_id for r in done] == ids[:1]
        # A pending row, a row of another tenant, no principal: refused, nothing written.
        for tenant, chosen, who in ((TENANT, ids, "w"), ("other", ids[:1], "w"), (TENANT, ids, "")):
            with pytest.raises(ReleaseRefused) as caught:
                async with repair.transaction():
                    await outbox.release_held(repair, tenant, chosen, who=who, evidence="e")
            assert caught.value.reason == "release_refused"
        # The relay principal cannot release at all; the audit cannot be changed.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await pg.execute(
                "SET ROLE accord_relay; SELECT relay.release_held('acme', '{}', 'w', 'e')"
            )
    finally:
        await repair.close()
    await pg.execute("RESET ROLE")
    assert await audit_rows(pg) == 1
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
        await pg.execute("UPDATE relay.release_audit SET who = 'someone else'")
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="append-only"):
        await pg.execute("DELETE FROM relay.release_audit")


async def test_a_row_held_past_its_consumers_replay_window_is_refused_not_poisoned(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """Migration 0056. A held row's ce-time is its enqueue time; released once its consumers'
    replay window had passed, it was published and poisoned too_old at its first delivery,
    the release audited as if it had worked. `accord relay release-held` reads the oldest
    enqueue time the consumers still admit (the strictest of ACCORD_INBOX_REPLAY_WINDOW_S
    and each consumer's declared window, less a tenth of it for the publish) and refuses a
    row enqueued before, all or nothing, saying what to do. Control: a row held within the
    window is released; then a consumer declaring a stricter window (10 minutes) makes the
    same age refused."""
    events = [unbound(n) for n in (1, 2, 3)]
    async with pg.transaction():
        for event in events:
            await enqueue(pg, event, catalog=catalog_with_unbound_type())
    aged = dict(zip((e.event_id for e in events), (7200, 3300, 1800), strict=True))
    for event_id, age_s in aged.items():  # test-only: held, and enqueued that long ago
        await pg.execute(
            "UPDATE relay.outbox SET state = 'held', last_reason = 'unroutable',"
            " enqueued_at = now() - make_interval(secs => $2) WHERE event_id = $1",
            event_id,
            float(age_s),
        )
    past, at_the_edge, within = (e.event_id for e in events)

    def release(*ids: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "accord", "relay", "release-held", "--tenant", TENANT,
             *[a for i in ids for a in ("--event-id", str(i))], "--who", "ops", "--evidence", "e"],
            env={**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": pg_dsn,
                 "ACCORD_INBOX_REPLAY_WINDOW_S": "3600"},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    for ids in ([past], [at_the_edge], [past, within]):
        refused = release(*ids)
        assert refused.returncode == 2, refused.stdout
        assert refused.stderr.startswith("accord: ReleaseRefused:"), refused.stderr
        assert "past_replay_window" in refused.stderr and "as a new event" in refused.stderr
    state = "SELECT state FROM relay.outbox WHERE event_id = $1"
    assert [await pg.fetchval(state, i) for i in aged] == ["held"] * 3  # nothing changed
    assert await audit_rows(pg) == 0
    released = release(within)  # control
    assert released.returncode == 0, released.stderr
    assert await pg.fetchval(state, within) == "pending" and await audit_rows(pg) == 1
    # A consumer that declared a ten-minute window refuses what is older: so does a release.
    await pg.execute("SELECT consumers.declare_window('report', 600, 60)")
    await pg.execute(
        "UPDATE relay.outbox SET state = 'held', enqueued_at = now() - interval '30 minutes'"
        " WHERE event_id = $1",
        within,
    )
    stricter = release(within)
    assert stricter.returncode == 2 and "past_replay_window" in stricter.stderr, stricter.stderr
    assert "same operation id" in stricter.stderr
    # The API without a floor (a caller that knows of none) checks nothing, as before.
    repair = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_repair"})
    try:
        async with repair.transaction():
            done = await outbox.release_held(repair, TENANT, [past], who="w", evidence="e")
        assert [r.event_id for r in done] == [past]
    finally:
        await repair.close()


async def test_discard_held_removes_a_held_row_for_good_and_audits_it(
    pg_dsn: str, pg: asyncpg.Connection
) -> None:
    """Migration 0061. A row held for good (a type nothing binds again, say, or one past its
    consumers' replay window whose content was enqueued again) stayed in the outbox and the
    held figures for ever.
    `accord relay discard-held` removes it, as the repair role, with an audit row (action
    discard), and the release audit's pruner may take that row once it is old. Controls: a
    pending row beside it refuses the whole discard (nothing removed, no audit), the relay
    principal cannot discard, and a discard needs --who and --evidence."""
    held, pending = unbound(1), unbound(2)
    async with pg.transaction():
        for event in (held, pending):
            await enqueue(pg, event, catalog=catalog_with_unbound_type())
    await pg.execute(
        "UPDATE relay.outbox SET state = 'held', last_reason = 'unroutable', attempts = 2"
        " WHERE event_id = $1",
        held.event_id,
    )

    def discard(*ids: object, who: str = "ops-anna") -> subprocess.CompletedProcess[str]:
        return accord(
            pg_dsn, "relay", "discard-held", "--tenant", TENANT,
            *[a for i in ids for a in ("--event-id", str(i))],
            "--who", who, "--evidence", "ticket-7: enqueued again as a new event",
        )  # fmt: skip

    refused = discard(held.event_id, pending.event_id)  # control: a pending row beside it
    assert refused.returncode == 2 and refused.stderr.startswith("accord: DiscardRefused:")
    assert "not_held" in refused.stderr and str(pending.event_id) in refused.stderr
    assert await audit_rows(pg) == 0
    assert await pg.fetchval("SELECT count(*) FROM relay.outbox WHERE tenant = $1", TENANT) == 2
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await pg.execute("SET ROLE accord_relay; SELECT relay.discard_held('acme', '{}', 'w', 'e')")
    await pg.execute("RESET ROLE")
    repair = await asyncpg.connect(pg_dsn, server_settings={"role": "accord_repair"})
    try:
        with pytest.raises(DiscardRefused) as caught:
            async with repair.transaction():
                await outbox.discard_held(repair, TENANT, [held.event_id], who="", evidence="e")
        assert caught.value.fields["missing"] == "principal"
    finally:
        await repair.close()

    done = discard(held.event_id)
    assert done.returncode == 0, done.stderr
    assert "discarded outbox=" in done.stdout and str(held.event_id) in done.stdout
    state = "SELECT state FROM relay.outbox WHERE event_id = $1"
    assert await pg.fetchval(state, held.event_id) is None  # gone
    assert await pg.fetchval(state, pending.event_id) == "pending"  # untouched
    (audit,) = await outbox.release_audit(pg, TENANT, held.event_id)
    assert (audit.action, audit.held_reason, audit.attempts) == ("discard", "unroutable", 2)
    assert (audit.operation_id, audit.type, audit.version) == (held.operation_id, "audit.noted", 1)
    assert audit.digest is not None and audit.enqueued_at is not None  # what the event was
    assert (audit.who, audit.db_role) == ("ops-anna", "accord_repair")
    assert "held: 0 rows" in accord(pg_dsn, "relay", "held").stdout
    # Its outbox row gone, the audit row is resolved: the pruner takes it past the retention.
    await pg.execute(
        "SET session_replication_role = replica;"
        " UPDATE relay.release_audit SET at = at - interval '400 days';"
        " SET session_replication_role = origin"
    )
    async with pg.transaction():
        assert await outbox.prune_release_audit(pg, 86400.0, 100) == 1
    assert await audit_rows(pg) == 0
