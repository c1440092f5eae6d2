"""The consumer runtime on real RabbitMQ and PostgreSQL: commit, then ack; poison; retries."""

from __future__ import annotations

import functools
import itertools
import json
import math
import uuid
from dataclasses import replace
from typing import Any

import aio_pika
import anyio
import asyncpg
import pytest

from accord.consumers import ConsumerRuntime, Handlers, PoisonReason, TransientFailure
from accord.demo.app import submit_report
from accord.schemas import wire
from accord.schemas.errors import ConfigError
from accord.schemas.events import Event
from accord.schemas.topology import Topology
from tests.integration.consumers.support import (
    CATALOG,
    CREATE_EFFECTS,
    INSERT_EFFECT,
    amqp_message,
    counts,
    declare_topology,
    drain_queue,
    effect_handlers,
    publish,
    publish_events,
    queue_depth,
    report,
    running,
    runtime_for,
    wire_message,
)
from tests.support import scaled, wait_for

pytestmark = pytest.mark.timeout(120)


async def _delivered(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM consumers.deliveries") >= n)


async def _poisoned(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM consumers.poison") >= n)


async def test_one_event_delivered_many_times_has_one_effect(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    copies = scaled(1000, 10_000)
    event = report()
    msg = wire_message(event)
    await declare_topology(amqp_url, topo)
    await publish(amqp_url, topo, ((event.ce_type, amqp_message(msg)) for _ in range(copies)))
    async with running(runtime_for(amqp_url, pg_dsn, topo)) as runtime:
        await wait_for(lambda: _delivered(effects_pg, copies))
    assert await effects_pg.fetchval("SELECT count(*) FROM public.effects") == 1
    assert await counts(effects_pg) == {"new": 1, "duplicate": copies - 1}
    assert runtime.stats.new == 1 and runtime.stats.duplicate == copies - 1
    assert await queue_depth(amqp_url, topo.queue("report")) == 0


async def test_changed_digest_is_poisoned_and_dead_lettered(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    first = report("op-7", subject="first meaning")
    changed = report("op-7", subject="another meaning")
    async with running(runtime_for(amqp_url, pg_dsn, topo)):
        await publish_events(amqp_url, topo, [first])  # control: applied
        await wait_for(lambda: _delivered(effects_pg, 1))
        await publish_events(amqp_url, topo, [changed])
        await wait_for(lambda: _poisoned(effects_pg, 1))
    effects = await effects_pg.fetch("SELECT event_id FROM public.effects")
    assert [r["event_id"] for r in effects] == [first.event_id]
    row = await effects_pg.fetchrow("SELECT * FROM consumers.poison")
    assert row["reason"] == PoisonReason.CONFLICT
    assert row["event_id"] == str(changed.event_id) and row["operation_id"] == "op-7"
    detail = json.loads(row["detail"])
    assert detail["stored_digest"] != detail["incoming_digest"]
    assert await counts(effects_pg) == {"new": 1, "conflict": 1}
    dead = await drain_queue(amqp_url, topo.poison_queue("report"))
    assert [m.message_id for m in dead] == [str(changed.event_id)]


async def test_always_transient_handler_is_dead_lettered_after_the_limit(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    seen: list[int] = []
    handlers = effect_handlers()
    failing = Handlers("report")

    @failing.on("report.accepted", 1)
    async def always_fails(tx: Any, event: Event) -> None:
        await tx.execute("SELECT 1")
        seen.append(1)
        raise TransientFailure("downstream unavailable")

    good, bad = report(), report()
    async with running(runtime_for(amqp_url, pg_dsn, topo, handlers)) as ok:
        await publish_events(amqp_url, topo, [good])  # control: the same message succeeds
        await wait_for(lambda: _delivered(effects_pg, 1))
    assert ok.stats.new == 1
    async with running(runtime_for(amqp_url, pg_dsn, topo, failing)) as runtime:
        await publish_events(amqp_url, topo, [bad])
        await wait_for(lambda: _poisoned(effects_pg, 1))
    limit = topo.workflow("report").delivery_limit
    assert len(seen) == limit + 1  # first delivery plus `limit` redeliveries
    assert runtime.stats.retried == limit
    row = await effects_pg.fetchrow("SELECT * FROM consumers.poison")
    assert row["reason"] == PoisonReason.RETRIES_EXHAUSTED
    assert row["delivery_count"] == limit and row["redelivered"] is True
    assert await effects_pg.fetchval("SELECT count(*) FROM public.effects") == 1
    assert (
        await effects_pg.fetchval(
            "SELECT count(*) FROM consumers.inbox WHERE operation_id = $1", bad.operation_id
        )
        == 0
    )
    dead = await drain_queue(amqp_url, topo.poison_queue("report"))
    assert [m.message_id for m in dead] == [str(bad.event_id)]


async def test_a_transient_failure_is_requeued_after_a_growing_backoff(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    """A handler that fails transiently three times (a lock another transaction holds, say),
    then succeeds: each requeue waits retry_backoff_s at the first delivery, doubling with each
    delivery counted, so its retries span 0.2 + 0.4 + 0.8 s rather than a millisecond, and
    it is applied once, within its delivery limit. Control: with no backoff the same retries
    come back at once."""
    spans: dict[float, list[float]] = {}
    for backoff in (0.2, 0.0):
        seen: list[float] = []
        handlers = Handlers("report")

        @handlers.on("report.accepted", 1)
        async def fails_thrice(tx: Any, event: Event, seen: list[float] = seen) -> None:
            seen.append(anyio.current_time())
            if len(seen) <= 3:
                raise TransientFailure("the row is locked")
            await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

        runtime = runtime_for(amqp_url, pg_dsn, topo, handlers, retry_backoff_s=backoff)
        applied = functools.partial(_delivered, effects_pg, len(spans) + 1)
        async with running(runtime):
            await publish_events(amqp_url, topo, [report()])
            await wait_for(applied)
        assert len(seen) == 4 and runtime.stats.retried == 3 and runtime.stats.new == 1
        spans[backoff] = [b - a for a, b in itertools.pairwise(seen)]
    waits = list(zip(spans[0.2], (0.2, 0.4, 0.8), strict=True))
    assert all(gap >= 0.95 * wait for gap, wait in waits), spans
    assert all(gap < 2 * wait + 1.0 for gap, wait in waits), spans  # not a longer wait
    assert await effects_pg.fetchval("SELECT count(*) FROM public.effects") == 2
    assert sum(spans[0.0]) < sum(spans[0.2]) / 2, spans  # control: at once
    assert await effects_pg.fetchval("SELECT count(*) FROM consumers.poison") == 0


async def test_a_batch_with_a_retry_acks_what_it_applied_before_the_wait(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    """One batch: a message applied, then one that fails transiently, then another applied.
    The first is acked before the retry's backoff (a lane stopped meanwhile would not give it
    back), the retried one is requeued after it, the last acked after the requeue (a
    cumulative ack never covers a delivery still unsettled): all applied once, the retried
    one on its next delivery."""
    first, flaky, last = report(), report(), report()
    handlers = Handlers("report")
    runtimes: list[ConsumerRuntime] = []

    @handlers.on("report.accepted", 1)
    async def write(tx: Any, event: Event) -> None:
        # fails until it was requeued once (the batch's savepoint pass included)
        if event.event_id == flaky.event_id and not runtimes[0].stats.retried:
            raise TransientFailure("the row is locked")
        await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

    await declare_topology(amqp_url, topo)
    await publish_events(amqp_url, topo, [first, flaky, last])
    runtime = runtime_for(
        amqp_url, pg_dsn, topo, handlers, retry_backoff_s=2.0, batch_max=3, concurrency=1,
        batch_linger_s=0.5,
    )  # fmt: skip
    runtimes.append(runtime)
    async with running(runtime):

        async def waiting() -> bool:  # in the retry's wait: the first acked, the last not yet
            return runtime.stats.retried == 0 and runtime.stats.new == 1

        async def all_applied() -> bool:
            return runtime.stats.new == 3

        await wait_for(waiting, within=10, every=0.01)
        await wait_for(all_applied, within=20)
    assert runtime.stats.retried == 1
    assert await effects_pg.fetchval("SELECT count(*) FROM public.effects") == 3
    assert await effects_pg.fetchval("SELECT count(*) FROM consumers.poison") == 0


def _bad_messages() -> list[tuple[PoisonReason, str, aio_pika.Message]]:
    """(expected reason, routing key, message) for each kind of bad input."""
    cases: list[tuple[PoisonReason, str, aio_pika.Message]] = []

    def variant(reason: PoisonReason, body: bytes | None = None, **headers: Any) -> None:
        msg = wire_message(report())
        new_headers = {**msg.headers, **headers}
        for name in [k for k, v in new_headers.items() if v is None]:
            del new_headers[name]
        cases.append(
            (
                reason,
                msg.routing_key,
                aio_pika.Message(
                    body if body is not None else msg.body,
                    headers=new_headers,
                    message_id=msg.message_id,
                    content_type=msg.content_type,
                ),
            )
        )

    variant(PoisonReason.MALFORMED_JSON, b'{"report_id": "r-1", "subject": ')
    variant(PoisonReason.MISSING_HEADER, **{"ce-tenantid": None, "ce-operationid": None})
    variant(PoisonReason.UNKNOWN_VERSION, **{"ce-type": "report.accepted.v9"})
    variant(PoisonReason.TENANT_MISMATCH, **{"ce-tenantid": "globex"})
    variant(
        PoisonReason.NON_FINITE_NUMBER, b'{"report_id": "r-1", "subject": "s", "priority": NaN}'
    )
    variant(PoisonReason.DUPLICATE_KEY, b'{"report_id": "r-1", "report_id": "r-2", "subject": "s"}')
    variant(PoisonReason.INVALID_EVENT, b'{"report_id": "r-1"}')
    variant(PoisonReason.DIGEST_MISMATCH, **{"ce-opdigest": "0" * 64})
    variant(PoisonReason.BAD_HEADER, **{"ce-authepoch": "minus one"})
    return cases


async def test_bad_inputs_get_typed_poison_reasons_and_the_consumer_keeps_running(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    cases = _bad_messages()
    # routing: the unknown version must still reach this queue, so bind it for the test
    wrong_version = Topology(
        topo.prefix,
        (replace(topo.workflows[0], event_types=("report.accepted.v1", "report.accepted.v9")),),
    )
    before, after = report(), report()
    runtime = runtime_for(amqp_url, pg_dsn, wrong_version)
    async with running(runtime):
        await publish_events(amqp_url, topo, [before])  # control
        await wait_for(lambda: _delivered(effects_pg, 1))
        for _, routing_key, message in cases:
            await publish(amqp_url, topo, [(routing_key, message)])
        await wait_for(lambda: _poisoned(effects_pg, len(cases)))
        await publish_events(amqp_url, topo, [after])  # still consuming
        await wait_for(lambda: _delivered(effects_pg, 2))
    rows = {r["message_id"]: r for r in await effects_pg.fetch("SELECT * FROM consumers.poison")}
    assert len(rows) == len(cases)
    for reason, _, message in cases:  # two workers: records may be in any order
        row = rows[message.message_id]
        assert row["reason"] == reason
        assert row["body_size"] == len(message.body)
        assert message.body.decode(errors="replace") not in json.dumps(dict(row), default=str)
    assert runtime.sessions == 1  # never restarted
    assert await effects_pg.fetchval("SELECT count(*) FROM public.effects") == 2
    dead = await drain_queue(amqp_url, topo.poison_queue("report"))
    assert len(dead) == len(cases)
    assert math.isfinite(runtime.stats.poisoned) and runtime.stats.poisoned == len(cases)


async def test_a_topology_that_differs_from_the_brokers_is_a_config_error(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    await declare_topology(amqp_url, topo)
    same = runtime_for(amqp_url, pg_dsn, topo)
    async with running(same):  # control: the declared topology matches
        pass
    other = Topology(topo.prefix, (replace(topo.workflows[0], delivery_limit=9),))
    with pytest.raises(ConfigError):
        await runtime_for(amqp_url, pg_dsn, other).run()


# -- issue #16: permanent failures are poisoned at once, each with its own typed reason ----

NOTES = """
CREATE TABLE public.notes (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id text NOT NULL,
    doc          jsonb NOT NULL CONSTRAINT notes_doc_object CHECK (jsonb_typeof(doc) = 'object')
)
"""
BODY_LIMIT = 4096


def noting_handlers(calls: list[str]) -> Handlers:
    """The demo's report handler (it submits the report job, whose payload PostgreSQL stores
    as jsonb), after an application step of its own: it keeps a JSON document the event
    carries as text (``document``) in a jsonb column with a CHECK."""
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def note_then_submit(tx: Any, event: Event) -> None:
        calls.append(event.operation_id)
        document = event.payload.get("document")
        if document is not None:
            await tx.execute(
                "INSERT INTO public.notes (operation_id, doc) VALUES ($1, $2::jsonb)",
                event.operation_id,
                document,
            )
        await submit_report(tx, event)

    return handlers


def _raw(event: Event, **headers: str) -> tuple[str, aio_pika.Message]:
    """``event`` as accord's producer sends it, with ``headers`` changed, and its body's JSON
    built without accord's checks (as any other producer may)."""
    body = json.dumps(event.payload).encode()
    msg = wire.to_amqp(event, body, digest=CATALOG.digest(event), publish_id=str(uuid.uuid4()))
    return msg.routing_key, aio_pika.Message(
        body,
        headers={**msg.headers, **headers},
        message_id=msg.message_id,
        content_type=msg.content_type,
    )


def _with(**payload: Any) -> Event:
    event = report()
    return event.model_copy(update={"payload": {**event.payload, **payload}})


def _epoch(epoch: int) -> Event:
    return report().model_copy(update={"authority_epoch": epoch})


async def test_refused_content_is_poisoned_at_once_and_the_consumer_keeps_going(
    amqp_url: str, pg_dsn: str, pg: asyncpg.Connection, topo: Topology
) -> None:
    """A value jsonb refuses, a row a CHECK refuses, a body naming another tenant, a
    non-ASCII digit in a numeric header and a body over the consumer's bound: each is
    poisoned on its first delivery (never retried) with its own typed reason, while its
    control (the same message without the flaw) is applied in the same batch, and a valid
    message after them all is processed by the same running consumer."""
    await pg.execute(NOTES)
    calls: list[str] = []
    # name: (expected reason, the bad event, its headers changed, the control event)
    cases: dict[str, tuple[PoisonReason, Event, dict[str, str], Event]] = {
        # The payload's own text holds NUL (JSON's \u0000), which jsonb refuses (22P05):
        # refused by the value check before any handler, so it never reaches jsonb.
        "nul-in-payload": (
            PoisonReason.INVALID_EVENT,
            _with(subject="a\x00b"),
            {},
            _with(subject="ab"),
        ),
        # Text the handler casts to jsonb: PostgreSQL refuses it (22P05), poisoned at once.
        "jsonb-refuses": (
            PoisonReason.DATA_EXCEPTION,
            _with(document='{"note": "\\u0000"}'),
            {},
            _with(document='{"note": "fine"}'),
        ),
        "check-refuses": (  # 23514: notes_doc_object
            PoisonReason.INTEGRITY_VIOLATION,
            _with(document="[1]"),
            {},
            _with(document='{"note": "also fine"}'),
        ),
        "tenant-conflict": (
            PoisonReason.TENANT_CONFLICT,
            _with(tenant="globex"),
            {},
            _with(tenant="acme"),
        ),
        "non-ascii-digit": (  # ARABIC-INDIC DIGIT ONE: str.isdigit() says True
            PoisonReason.BAD_HEADER,
            _epoch(1),
            {"ce-authepoch": "\u0661"},
            _epoch(1),
        ),
        "over-the-bound": (
            PoisonReason.TOO_LARGE,
            _with(padding="x" * BODY_LIMIT),
            {},
            _with(padding="x" * (BODY_LIMIT - 200)),
        ),
    }
    bad = {name: _raw(event, **headers)[1] for name, (_, event, headers, _) in cases.items()}
    controls = [control for *_, control in cases.values()]
    assert len(_raw(cases["over-the-bound"][3])[1].body) <= BODY_LIMIT  # the control fits
    # Bad and good interleaved, all queued before the consumer starts: one lane takes them
    # in large batches, so a refused statement rolls back only its own savepoint.
    messages = []
    for name, (*_, control) in cases.items():
        messages += [("report.accepted.v1", bad[name]), _raw(control)]
    await declare_topology(amqp_url, topo)
    await publish(amqp_url, topo, messages)
    runtime = runtime_for(
        amqp_url,
        pg_dsn,
        topo,
        noting_handlers(calls),
        concurrency=1,
        max_body_bytes=BODY_LIMIT,
    )
    after = report()
    async with running(runtime):
        await wait_for(lambda: _poisoned(pg, len(cases)))
        await wait_for(lambda: _jobs(pg, len(controls)))
        await publish_events(amqp_url, topo, [after])  # still consuming, same session
        await wait_for(lambda: _jobs(pg, len(controls) + 1))

    rows = {r["message_id"]: r for r in await pg.fetch("SELECT * FROM consumers.poison")}
    assert len(rows) == len(cases)
    detail: dict[str, Any] = {}
    for name, (reason, *_) in cases.items():
        row = rows[bad[name].message_id]
        assert (name, row["reason"]) == (name, reason)
        assert (name, row["delivery_count"], row["redelivered"]) == (name, 0, False)  # first
        detail[name] = json.loads(row["detail"])
    assert detail["nul-in-payload"]["field"] == "payload.subject"
    assert detail["jsonb-refuses"]["sqlstate"] == "22P05"
    assert detail["check-refuses"]["sqlstate"] == "23514"
    assert detail["check-refuses"]["constraint"] == "notes_doc_object"
    assert detail["tenant-conflict"]["payload_tenant"] == "globex"
    assert detail["non-ascii-digit"]["header"] == "authepoch"
    assert detail["over-the-bound"]["bytes"] == len(bad["over-the-bound"].body)
    assert detail["over-the-bound"]["limit"] == BODY_LIMIT
    assert runtime.stats.retried == 0 and runtime.stats.poisoned == len(cases)
    assert runtime.sessions == 1  # never restarted

    # The handler ran for the refused statements (PostgreSQL itself refused them), never
    # for the NUL payload (refused before any handler or any jsonb).
    assert cases["jsonb-refuses"][1].operation_id in calls
    assert cases["check-refuses"][1].operation_id in calls
    assert cases["nul-in-payload"][1].operation_id not in calls
    # Only the controls and the last message took effect: jobs, inbox rows, notes.
    jobs = {r["operation_id"] for r in await pg.fetch("SELECT operation_id FROM jobs.jobs")}
    assert jobs == {e.operation_id for e in controls} | {after.operation_id}
    inbox = await pg.fetch("SELECT operation_id FROM consumers.inbox")
    assert {r["operation_id"] for r in inbox} == jobs
    notes = await pg.fetch("SELECT operation_id, doc FROM public.notes ORDER BY id")
    assert {(r["operation_id"], r["doc"]) for r in notes} == {
        (cases["jsonb-refuses"][3].operation_id, '{"note": "fine"}'),
        (cases["check-refuses"][3].operation_id, '{"note": "also fine"}'),
    }
    dead = await drain_queue(amqp_url, topo.poison_queue("report"))
    assert sorted(str(m.message_id) for m in dead) == sorted(
        str(m.message_id) for m in bad.values()
    )
    assert await queue_depth(amqp_url, topo.queue("report")) == 0


KEYS = "CREATE TABLE public.keys (k text PRIMARY KEY)"


@pytest.mark.parametrize("taken", [False, True])
async def test_a_key_another_lane_took_meanwhile_is_not_a_refusal(
    amqp_url: str, pg_dsn: str, pg: asyncpg.Connection, topo: Topology, taken: bool
) -> None:
    """Two one-message batches on two lanes, each handler checking for a shared key and
    inserting it when missing: both check before either inserts, so one insert meets the
    other's committed key (23505). Before, a one-message batch judged that at once and
    poisoned a sound message integrity_violation, where in a batch of several the savepoint
    pass ran it again and it applied. Now the refusal is judged again on a fresh snapshot:
    both apply. Control (``taken``): a handler that inserts a key it never checks, already
    present, is still poisoned integrity_violation, on its first delivery."""
    await pg.execute(KEYS)
    if taken:
        await pg.execute("INSERT INTO public.keys (k) VALUES ('K')")
    checked = 0
    both = anyio.Event()
    handlers = Handlers("report")

    @handlers.on("report.accepted", 1)
    async def shared_key(tx: Any, event: Event) -> None:
        nonlocal checked
        if taken or not await tx.fetchval("SELECT true FROM public.keys WHERE k = 'K'"):
            checked += 1
            if checked >= 2:
                both.set()
            with anyio.move_on_after(5):
                await both.wait()  # both lanes checked before either inserts
            await tx.execute("INSERT INTO public.keys (k) VALUES ('K')")
        await tx.execute(INSERT_EFFECT, event.tenant, event.operation_id, event.event_id)

    await pg.execute(CREATE_EFFECTS)
    await declare_topology(amqp_url, topo)
    runtime = runtime_for(amqp_url, pg_dsn, topo, handlers, concurrency=2, batch_max=1)
    events = [report("first"), report("second")]
    async with running(runtime):
        await publish_events(amqp_url, topo, events)

        async def settled() -> bool:
            done = await pg.fetchval("SELECT count(*) FROM public.effects")
            return bool(done + await pg.fetchval("SELECT count(*) FROM consumers.poison") == 2)

        await wait_for(settled, within=30)
    poisoned = await pg.fetch("SELECT reason, redelivered FROM consumers.poison")
    if taken:
        assert [(r["reason"], r["redelivered"]) for r in poisoned] == [
            ("integrity_violation", False),
            ("integrity_violation", False),
        ]
    else:
        assert poisoned == []
        assert await pg.fetchval("SELECT count(*) FROM public.effects") == 2
        assert checked == 2  # the race happened: both checked before either inserted
    assert runtime.stats.retried == 0


async def _jobs(pg: asyncpg.Connection, n: int) -> bool:
    return bool(await pg.fetchval("SELECT count(*) FROM jobs.jobs") >= n)


async def test_a_lingering_batch_takes_what_arrives_meanwhile_into_one_transaction(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    """The control first: without a linger each delivery that finds the lane idle is a batch
    of its own, so events published 100 ms apart take a commit each. Lingering 1.5 s after a
    batch's first delivery, they share one transaction and one ack, and each has its effect."""
    await declare_topology(amqp_url, topo)
    count = 5
    for linger_s in (0.0, 1.5):
        events = [report() for _ in range(count)]
        runtime = runtime_for(amqp_url, pg_dsn, topo, concurrency=1, batch_linger_s=linger_s)
        async with running(runtime):
            for event in events:
                await publish_events(amqp_url, topo, [event])
                await anyio.sleep(0.1)
            await wait_for(functools.partial(_effects_of, effects_pg, events))
        assert runtime.stats.new == count
        if linger_s:
            assert runtime.stats.commits == 1, runtime.stats
        else:
            assert runtime.stats.commits > 1, runtime.stats
    assert await queue_depth(amqp_url, topo.queue("report")) == 0


async def _effects_of(pg: asyncpg.Connection, events: list[Event]) -> bool:
    ids = [e.event_id for e in events]
    found = await pg.fetchval("SELECT count(*) FROM public.effects WHERE event_id = ANY($1)", ids)
    return bool(found == len(ids))


async def test_a_batch_holding_the_whole_prefetch_window_stops_lingering(
    amqp_url: str, pg_dsn: str, effects_pg: asyncpg.Connection, topo: Topology
) -> None:
    """Four deliveries queued before the consumer starts. The control first: with room left
    in the prefetch window, the batch lingers its full 3 s. With a window of four, the batch
    holds every delivery the broker may send before its ack, so it goes at once."""
    await declare_topology(amqp_url, topo)
    linger_s = 3.0
    for prefetch in (64, 4):
        events = [report() for _ in range(4)]
        await publish_events(amqp_url, topo, events)
        runtime = runtime_for(
            amqp_url, pg_dsn, topo, concurrency=1, prefetch=prefetch, batch_linger_s=linger_s
        )
        async with running(runtime):
            started = anyio.current_time()
            await wait_for(functools.partial(_effects_of, effects_pg, events))
            elapsed = anyio.current_time() - started
        assert runtime.stats.commits == 1, runtime.stats
        if prefetch == 64:
            assert elapsed >= linger_s - 0.5, elapsed
        else:
            assert elapsed < linger_s - 1.0, elapsed
