"""Traces that leave the real `accord` processes, as an OTLP receiver decodes them.

Each scenario runs `python -m accord relay|consume|worker|reconcile --app accord.demo:app`
configured only by OTEL_* variables, a producer process that calls
``accord.telemetry.configure()``, and asserts the span graph the receiver got: one trace per
operation, the retries and redeliveries as linked spans, an error only where the outcome is
terminal.
"""

from __future__ import annotations

from pathlib import Path

import aio_pika
import asyncpg
import pytest

from accord.demo.provider import Fault, ProviderServer
from accord.schemas import telemetry as t
from tests.conftest import BrokerNames
from tests.integration.telemetry import support
from tests.integration.telemetry.receiver import Received, Span, otlp_receiver

pytestmark = pytest.mark.timeout(180)
ERROR = 2


def _links_to(span: Span, target: Span) -> bool:
    return any(lk.span_id == target.span_id and lk.trace_id == target.trace_id for lk in span.links)


def _one_create(received: Received) -> Span:
    creates = received.named("create report.accepted")
    assert len(creates) == 1, creates
    assert creates[0].service == "producer"
    return creates[0]


async def _job_state(dsn: str, op: str) -> str | None:
    conn = await asyncpg.connect(dsn)
    try:
        state: str | None = await conn.fetchval(
            "SELECT state FROM jobs.jobs WHERE operation_id = $1", op
        )
        return state
    finally:
        await conn.close()


async def test_an_event_delivered_twice_is_two_process_spans_linked_to_one_create(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames, tmp_path: Path, provider: ProviderServer
) -> None:
    with otlp_receiver() as (endpoint, received):
        env = support.otel_env(endpoint, pg_dsn, amqp_url, broker_names, tmp_path, provider.url)
        await support.register(env)
        async with (
            support.process(env, "relay", "relay"),
            support.process(env, "consumer", "consume", "--workflow", "report"),
            support.process(env, "worker", "worker", "--workflow", "report", "--poll-s", "0.2"),
        ):
            await support.produce(env, "acme", "dup-1")
            await support.until(lambda: received.named("process "), 30)
            # Publish the same row again (as a relay does after a lost confirm): a redelivery.
            conn = await asyncpg.connect(pg_dsn)
            try:
                await conn.execute(
                    "UPDATE relay.outbox SET state = 'pending', lease_expires_at = NULL,"
                    " published_at = NULL WHERE type = 'report.accepted'"
                )
            finally:
                await conn.close()
            await support.until(lambda: len(received.named("process ")) >= 2, what="redelivery")
            await support.until(lambda: received.named("effect "), what="the job's effect")
            await support.until(lambda: _job_state_done(received), what="the published job")
    create = _one_create(received)
    processes = [s for s in received.named("process ") if s.service == "consumer"]
    assert len(processes) == 2
    assert all(_links_to(p, create) for p in processes)
    assert [p.attributes[t.ATTR_INBOX_OUTCOME] for p in processes] == ["new", "duplicate"]
    assert all(p.status_code != ERROR for p in processes)
    publishes = [p for p in received.named("publish ") if _links_to(p, create)]
    assert len(publishes) == 2
    # the job: its attempt is a child of the process span that submitted it, in its trace
    (attempt,) = received.named("attempt ")
    assert attempt.trace_id == processes[0].trace_id
    assert attempt.parent_span_id == processes[0].span_id
    assert attempt.attributes[t.ATTR_JOB_ATTEMPT] == 1
    assert attempt.attributes[t.ATTR_JOB_ENDING] == "published"
    (effect,) = received.named("effect ")
    assert effect.parent_span_id == attempt.span_id
    assert effect.attributes[t.ATTR_EFFECT_OUTCOME] == "succeeded"
    assert effect.attributes[t.ATTR_IDEMPOTENCY_KEY]
    # the fenced publish, and the event it enqueued, are the attempt's children
    (publish,) = [s for s in received.named("publish report") if s.service == "worker"]
    assert publish.parent_span_id == attempt.span_id
    (published_event,) = received.named("create report.published")
    assert published_event.parent_span_id == publish.span_id


def _job_state_done(received: Received) -> bool:
    return any(
        s.attributes.get(t.ATTR_JOB_ENDING) == "published" for s in received.named("attempt ")
    )


async def test_a_publish_retried_is_two_publish_attempts_linked_with_the_first_reason(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames, tmp_path: Path, provider: ProviderServer
) -> None:
    queue, exchange = f"{broker_names.prefix}.wf.report", f"{broker_names.prefix}.events"
    with otlp_receiver() as (endpoint, received):
        env = support.otel_env(endpoint, pg_dsn, amqp_url, broker_names, tmp_path, provider.url)
        # Unroutable retries, not a hold: the binding comes back after the first failed
        # attempt's span arrives (exported every 0.2 s), which three attempts 0.2 s and 0.4 s
        # apart could outrun on a slow machine (the row would be held, never published).
        env["ACCORD_RELAY_UNROUTABLE_ATTEMPTS"] = "50"
        async with support.process(env, "relay", "relay"):
            # control first: a routable event is published at its first attempt
            await support.produce(env, "acme", "routable")
            first = await support.until(lambda: received.named("publish "), 30)
            assert first[0].attributes[t.ATTR_PUBLISH_ATTEMPT] == 1
            assert first[0].attributes[t.ATTR_RELAY_OUTCOME] == "published"
            assert t.ATTR_PREVIOUS_REASON not in first[0].attributes
            # the relay declared the topology; take the binding away: the next is unroutable
            connection = await aio_pika.connect(amqp_url)
            try:
                channel = await connection.channel()
                q = await channel.get_queue(queue, ensure=False)
                await q.unbind(exchange, "report.accepted.v1")
                await support.produce(env, "acme", "retried")
                await support.until(lambda: _publishes_of(received, "report:retried"), 30)
                await q.bind(exchange, "report.accepted.v1")
            finally:
                await connection.close()
            await support.until(lambda: _published_of(received, "report:retried"), 30)
    (create,) = [
        c
        for c in received.named("create ")
        if c.attributes[t.ATTR_OPERATION_ID] == "report:retried"
    ]
    attempts = _publishes_of(received, "report:retried")
    failed, published = attempts[0], attempts[-1]
    assert all(_links_to(p, create) for p in attempts)
    assert failed.attributes[t.ATTR_PUBLISH_ATTEMPT] == 1
    assert failed.attributes[t.ATTR_RELAY_REASON] == "unroutable"
    assert failed.attributes[t.ATTR_RELAY_OUTCOME] == "retry"
    assert failed.status_code != ERROR  # a retry fixed it: not an error
    assert [p.attributes[t.ATTR_PUBLISH_ATTEMPT] for p in attempts] == list(
        range(1, len(attempts) + 1)
    )
    assert published.attributes[t.ATTR_PREVIOUS_REASON] == "unroutable"
    assert published.attributes[t.ATTR_RELAY_OUTCOME] == "published"
    assert [p.attributes[t.ATTR_RELAY_OUTCOME] for p in attempts[:-1]] == ["retry"] * (
        len(attempts) - 1
    )


def _published_of(received: Received, operation_id: str) -> bool:
    return any(
        p.attributes.get(t.ATTR_RELAY_OUTCOME) == "published"
        for p in _publishes_of(received, operation_id)
    )


def _publishes_of(received: Received, operation_id: str) -> list[Span]:
    creates = [
        c for c in received.named("create ") if c.attributes[t.ATTR_OPERATION_ID] == operation_id
    ]
    return [p for p in received.named("publish ") if any(_links_to(p, c) for c in creates)]


async def test_a_job_rescued_after_its_worker_died_is_a_second_attempt_saying_why(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames, tmp_path: Path, provider: ProviderServer
) -> None:
    worker = ["worker", "--workflow", "report", "--poll-s", "0.2", "--lease-s", "2"]
    with otlp_receiver() as (endpoint, received):
        env = support.otel_env(endpoint, pg_dsn, amqp_url, broker_names, tmp_path, provider.url)
        await support.register(env)
        slow = {**env, "ACCORD_DEMO_DRAFT_S": "30"}
        async with (
            support.process(env, "relay", "relay"),
            support.process(env, "consumer", "consume", "--workflow", "report"),
        ):
            async with support.process(
                slow, "worker-1", *worker, "--journal", str(tmp_path / "w1.journal"),
                "--rescue-every-s", "60",
            ) as doomed:  # fmt: skip
                await support.produce(env, "acme", "rescued")
                await support.until(lambda: _running(pg_dsn), 30)
                state = await _job_state(pg_dsn, "report:rescued")
                assert state == "running"
                doomed.kill()  # SIGKILL: its open attempt span never leaves the process
                await doomed.wait()
            async with support.process(
                env, "worker-2", *worker, "--journal", str(tmp_path / "w2.journal"),
                "--rescue-every-s", "0.5",
            ):  # fmt: skip
                await support.until(lambda: _published(received), 60)
    (process,) = [s for s in received.named("process ") if s.service == "consumer"]
    attempts = [s for s in received.named("attempt ") if s.service == "worker-2"]
    (second,) = attempts
    assert not [s for s in received.named("attempt ") if s.service == "worker-1"]
    assert second.trace_id == process.trace_id and second.parent_span_id == process.span_id
    assert _links_to(second, process)
    # and to attempt 1, whose context worker-1 kept at its start (its span died with it)
    (before,) = [
        lk for lk in second.links if lk.attributes.get("accord.link") == "previous_attempt"
    ]
    assert before.trace_id == process.trace_id and before.span_id != second.span_id
    assert second.attributes[t.ATTR_JOB_ATTEMPT] == 2
    assert second.attributes[t.ATTR_GENERATION] >= 3  # claim, rescue, claim
    assert second.attributes[t.ATTR_JOB_PREVIOUS_REASON] == "lease_expired"
    assert (t.EVENT_RESCUED, {t.ATTR_JOB_REASON: "lease_expired"}) in second.events
    assert second.attributes[t.ATTR_JOB_ENDING] == "published"
    assert second.status_code != ERROR


def _running(dsn: str) -> bool:
    import asyncio

    async def probe() -> bool:
        # Running, and its attempt's context kept (the worker notes it just after the
        # claim): killed before that, attempt 2 would have nothing to link to.
        conn = await asyncpg.connect(dsn)
        try:
            return bool(
                await conn.fetchval(
                    "SELECT state = 'running' AND attempt_trace IS NOT NULL FROM jobs.jobs"
                    " WHERE operation_id = 'report:rescued'"
                )
            )
        finally:
            await conn.close()

    # a synchronous probe for support.until, on its own loop in a thread
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, probe()).result()


def _published(received: Received) -> bool:
    return any(
        s.attributes.get(t.ATTR_JOB_ENDING) == "published" for s in received.named("attempt ")
    )


async def test_a_lost_provider_reply_is_unknown_until_reconcile_resolves_it_in_the_trace(
    pg_dsn: str, amqp_url: str, broker_names: BrokerNames, tmp_path: Path, provider: ProviderServer
) -> None:
    with otlp_receiver() as (endpoint, received):
        env = support.otel_env(endpoint, pg_dsn, amqp_url, broker_names, tmp_path, provider.url)
        await support.register(env)
        provider.set_fault(Fault.DROP_AFTER_ACCEPT, times=1)
        async with (
            support.process(env, "relay", "relay"),
            support.process(env, "consumer", "consume", "--workflow", "report"),
            support.process(env, "worker", "worker", "--workflow", "report", "--poll-s", "0.2"),
        ):
            await support.produce(env, "acme", "lost")
            await support.until(lambda: received.named("effect "), 30)
            await support.until(lambda: received.named("attempt "), 30)
            out = await support.run_once(env, "reconcile", "reconcile", "--settle-s", "0")
            assert "resolved=1 resumed=1" in out
            await support.until(lambda: received.named("reconcile "), 30)
            await support.until(lambda: _published(received), 60)
    (process,) = [s for s in received.named("process ") if s.service == "consumer"]
    first, second = received.named("attempt ")
    (effect, *_) = received.named("effect ")
    (resolution,) = received.named("reconcile ")
    # the lost reply: the effect is unknown and the attempt's job with it: terminal, an error
    assert effect.parent_span_id == first.span_id
    assert effect.attributes[t.ATTR_EFFECT_OUTCOME] == "unknown" and effect.status_code == ERROR
    assert first.attributes[t.ATTR_JOB_STATE] == "unknown" and first.status_code == ERROR
    # reconcile's resolution: in the operation's trace, linked, naming the very effect
    assert resolution.service == "reconcile"
    # in the operation's trace, linked to the very effect span it resolves
    assert resolution.trace_id == process.trace_id and _links_to(resolution, effect)
    assert resolution.attributes[t.ATTR_EFFECT_KEY] == effect.attributes[t.ATTR_EFFECT_KEY]
    assert resolution.attributes[t.ATTR_EFFECT_SEQ] == effect.attributes[t.ATTR_EFFECT_SEQ]
    key = effect.attributes[t.ATTR_IDEMPOTENCY_KEY]
    assert resolution.attributes[t.ATTR_IDEMPOTENCY_KEY] == key
    assert resolution.attributes[t.ATTR_EFFECT_OUTCOME] == "succeeded"
    # the resumed run links to the attempt before it, reuses the receipt and publishes
    assert _links_to(second, first) and _links_to(second, process)
    assert second.attributes[t.ATTR_JOB_ATTEMPT] == 2
    assert second.attributes[t.ATTR_JOB_ENDING] == "published" and second.status_code != ERROR
