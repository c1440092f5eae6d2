"""`accord relay`: run the outbox relay until SIGTERM or SIGINT; list and release held rows.

    accord relay                       run the relay
    accord relay held [--tenant T] [--limit N] [--json]
    accord relay release-held --tenant T --event-id ID [--event-id ID ...] --who W --evidence E
    accord relay discard-held --tenant T --event-id ID [--event-id ID ...] --who W --evidence E

`accord relay` refuses to start on a schema older than the code, declares the application's
topology (idempotent), then runs one :class:`accord.relay.Relay` as the PostgreSQL role
ACCORD_RELAY_ROLE (``accord_relay``: its outbox columns only; empty: the DSN's own user).
SIGTERM lets the current batch finish and settle, then exits 0; a crashed loop exits
non-zero so the supervisor restarts it.

`held` lists the rows the relay gave up on (outbox id, tenant, event id, type, the reason it
holds them, attempts, enqueued at; never the body). `release-held` makes named held rows
publishable again once their cause is gone (a queue now binds the type), as the repair role
(ACCORD_REPAIR_ROLE), all or nothing, with one relay.release_audit row per row released in the
same transaction; a row that is not held refuses the whole release. `discard-held` removes
named held rows for good (a row that will never be published: a body over the broker's limit,
a type nothing binds, a row past the consumers' replay window whose content was enqueued
again), the same way: repair role, all or nothing, one relay.release_audit row each (action
``discard``), a row that is not held refusing the whole discard.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import uuid
from collections.abc import Sequence

import aio_pika
import aiormq
import anyio

from accord import runtime
from accord.app import App
from accord.commands import args
from accord.commands.common import check_retention, optional_app, prefix, require_app
from accord.commands.repair import repair_connection
from accord.consumers import inbox
from accord.ops import checks
from accord.ops.health import Check
from accord.relay import ExchangeMissing, Relay, RelayConfig, outbox
from accord.relay.publisher import Declare, amqp_publisher
from accord.schemas import broker, migrate, topology
from accord.schemas.db import connect
from accord.schemas.errors import ConfigError, ConnectionLost, ServiceUnavailable
from accord.schemas.settings import Settings

log = logging.getLogger("accord.relay")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "relay",
        help="run the outbox relay; list or release held rows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Optional: plain `accord relay` runs the relay (supervisors and tests start it so).
    ops = parser.add_subparsers(dest="relay_op", required=False, metavar="[OPERATION]")
    held = ops.add_parser(
        "held",
        help="list held outbox rows and why they are held (never the body)",
        description="Held outbox rows, oldest first: outbox id, tenant, event id, type, the"
        " reason the relay holds them, attempts and when they were enqueued (never the body).",
    )
    held.add_argument("--tenant", type=args.text, help="only this tenant's rows")
    held.add_argument(
        "--limit", type=args.count(), default=100, help="at most this many (%(default)s)"
    )
    held.add_argument("--json", action="store_true", help="print JSON for scripts")
    held.set_defaults(handler=handle_held)
    release = ops.add_parser(
        "release-held",
        help="make held rows publishable again (repair role, audited)",
        description="Make the named held rows of one tenant publishable again, as the repair"
        " role, all or nothing, with one relay.release_audit row each in the same transaction."
        " Refused (nothing changes) when a named row is missing or not held.",
    )
    _named_held_rows(release, "releasing", "a reference to why it is safe (the new binding)")
    release.set_defaults(handler=handle_release)
    discard = ops.add_parser(
        "discard-held",
        help="remove held rows for good (repair role, audited)",
        description="Remove the named held rows of one tenant for good (their body is not"
        " kept), as the repair role, all or nothing, with one relay.release_audit row each"
        " (action discard) in the same transaction: for a row that will never be published."
        " Refused (nothing changes) when a named row is missing or not held.",
    )
    _named_held_rows(
        discard, "discarding", "a reference to why it is given up (the event enqueued again, say)"
    )
    discard.set_defaults(handler=handle_discard)
    parser.set_defaults(handler=handle)


def _named_held_rows(parser: argparse.ArgumentParser, doing: str, evidence: str) -> None:
    """The arguments of a repair of named held rows: tenant, event ids, who and evidence."""
    parser.add_argument(
        "--tenant", type=args.text, required=True, help="the tenant whose rows these are"
    )
    parser.add_argument(
        "--event-id",
        dest="event_ids",
        action="append",
        required=True,
        type=uuid.UUID,
        metavar="ID",
        help="the event id of a held row (`accord relay held`); repeat for more",
    )
    parser.add_argument("--who", type=args.text, required=True, help=f"the person or tool {doing}")
    parser.add_argument("--evidence", type=args.text, required=True, help=evidence)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = require_app(args, settings)
    check_retention(settings)  # the relay prunes the release audit (audit_retention_s)
    if 0 < settings.relay_max_message_bytes < app.max_payload_bytes:
        raise ConfigError(
            "ACCORD_RELAY_MAX_MESSAGE_BYTES is below the payload its producers may enqueue"
            " (App max_payload_bytes): such events would commit, then be held as oversize"
            " for good",
            relay_max_message_bytes=settings.relay_max_message_bytes,
            max_payload_bytes=app.max_payload_bytes,
        )
    relays: list[Relay] = []  # the one this process runs, once made (its readiness reads it)
    with runtime.metrics(settings, checks=readiness_checks(settings, app, relays)):
        return int(runtime.run(_main, settings, app, relays, service=True))


def readiness_checks(settings: Settings, app: App, relays: Sequence[Relay] = ()) -> list[Check]:
    """`/readyz` of a relay: its database (the application's schema current too), the
    exchange it publishes to (a relay without it publishes nothing), and its publishing
    session not blocked by the broker (a memory or disk alarm)."""
    return [
        checks.postgresql(settings.pg_dsn, app.migration_chains()),
        checks.rabbitmq(settings.amqp_url, exchange=app.topology(prefix(app, settings)).exchange),
        checks.unblocked(lambda: any(relay.blocked for relay in relays)),
    ]


def handle_held(args: argparse.Namespace, settings: Settings) -> int:
    app = optional_app(args, settings)
    chains = app.migration_chains() if app is not None else ()
    return int(runtime.run(_held, args, settings.pg_dsn, chains))


def handle_release(args: argparse.Namespace, settings: Settings) -> int:
    return int(runtime.run(_release, args, settings))


def handle_discard(args: argparse.Namespace, settings: Settings) -> int:
    return int(runtime.run(_discard, args, settings))


async def _held(args: argparse.Namespace, dsn: str, chains: tuple[migrate.Chain, ...]) -> int:
    conn = await connect(dsn)
    try:
        await migrate.require_current(conn, chains)
        rows = await outbox.held_rows(conn, tenant=args.tenant, limit=args.limit)
    finally:
        await conn.close()
    if args.json:
        data = [
            {"outbox_id": r.outbox_id, "tenant": r.tenant, "event_id": str(r.event_id),
             "operation_id": r.operation_id, "type": f"{r.type}.v{r.version}",
             "reason": r.reason, "attempts": r.attempts,
             "enqueued_at": r.enqueued_at.isoformat()}
            for r in rows
        ]  # fmt: skip
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    for r in rows:
        print(
            f"outbox={r.outbox_id} tenant={r.tenant} event_id={r.event_id}"
            f" type={r.type}.v{r.version} reason={r.reason or 'unspecified'}"
            f" attempts={r.attempts} enqueued_at={r.enqueued_at.isoformat()}"
        )
    print(f"held: {len(rows)} rows" + (" (--limit reached)" if len(rows) == args.limit else ""))
    return 0


async def _release(args: argparse.Namespace, settings: Settings) -> int:
    conn = await repair_connection(settings)
    try:
        async with conn.transaction():
            floor = await inbox.admit_floor(conn, settings.inbox_replay_window_s)
            done = await outbox.release_held(
                conn, args.tenant, args.event_ids, who=args.who, evidence=args.evidence,
                admit_from=floor,
            )  # fmt: skip
    finally:
        await conn.close()
    for r in done:
        print(
            f"released outbox={r.outbox_id} tenant={args.tenant} event_id={r.event_id}"
            f" audit={r.audit_id}"
        )
    return 0


async def _discard(args: argparse.Namespace, settings: Settings) -> int:
    conn = await repair_connection(settings)
    try:
        async with conn.transaction():
            done = await outbox.discard_held(
                conn, args.tenant, args.event_ids, who=args.who, evidence=args.evidence
            )
    finally:
        await conn.close()
    for r in done:
        print(
            f"discarded outbox={r.outbox_id} tenant={args.tenant} event_id={r.event_id}"
            f" audit={r.audit_id}"
        )
    return 0


def relay_config(settings: Settings, app: App) -> RelayConfig:
    """The relay's arguments, from settings (the only place they meet)."""
    return RelayConfig(
        pg_dsn=settings.pg_dsn,
        amqp_url=settings.amqp_url,
        exchange=app.topology(prefix(app, settings)).exchange,
        batch=settings.relay_batch,
        in_flight=settings.relay_in_flight,
        publish_timeout_s=settings.relay_publish_timeout_s,
        lease_s=settings.relay_lease_s,
        poll_s=settings.relay_poll_s,
        linger_s=settings.relay_linger_s,
        awake_s=settings.relay_awake_s,
        retention_s=settings.relay_retention_s,
        audit_retention_s=settings.audit_retention_s,
        prune_batch=settings.relay_prune_batch,
        prune_every_s=settings.relay_prune_every_s,
        unroutable_attempts=settings.relay_unroutable_attempts,
        max_message_bytes=settings.relay_max_message_bytes,
        # least privilege by default: the relay principal (relay/schema.sql) (empty: the DSN's
        # own user)
        pg_role=settings.relay_role or None,
    )


# How long the relay's start waits for the broker to connect, and to declare the topology.
START_TIMEOUT_S = 10.0

# What a broker connection lost under a call raises: the connection's own error (an
# AMQPConnectionError, a reset: ConnectionError), or, on a channel whose connection closed,
# ChannelInvalidStateError.
_BROKER_LOST = (ConnectionError, aiormq.exceptions.ChannelInvalidStateError)


async def _prepare(settings: Settings, app: App) -> None:
    await migrate.require_current_at(settings.pg_dsn, app.migration_chains())
    try:
        amqp = await broker.connect(settings.amqp_url, timeout=START_TIMEOUT_S)
    except OSError as exc:
        raise ServiceUnavailable(service="rabbitmq", detail=type(exc).__name__) from exc
    names = app.topology(prefix(app, settings))
    try:
        # A broker that stops answering without closing the connection would otherwise
        # hold the start until the heartbeats give up.
        with anyio.fail_after(START_TIMEOUT_S):
            channel = await amqp.channel()
            await topology.declare(channel, names, passive=not settings.topology_declare)
    except TimeoutError:
        raise ServiceUnavailable(
            service="rabbitmq",
            detail=f"no answer to the topology's declaration within {START_TIMEOUT_S:g} s",
        ) from None
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise ConfigError(
            "the broker lacks the application's topology: declare it once"
            " (ACCORD_TOPOLOGY_DECLARE=true, or deploy/rabbitmq/definitions.json)",
            exchange=names.exchange,
            detail=str(exc)[:200],
        ) from None
    except topology.MISMATCH as exc:
        raise topology.mismatch(exc, exchange=names.exchange) from None
    except _BROKER_LOST as exc:
        # Nothing in a start reconnects: one line and exit 75, and the supervisor starts the
        # relay again (the driver's error logged first).
        log.warning("the broker connection ended during the start", exc_info=exc)
        raise ConnectionLost(service="rabbitmq", error=type(exc).__name__) from None
    finally:  # bounded, and quiet when the connection is already gone
        with anyio.move_on_after(START_TIMEOUT_S / 2), contextlib.suppress(*_BROKER_LOST):
            await amqp.close()


def _declarer(names: topology.Topology) -> Declare:
    """Each publisher session declares the topology as the start did (idempotent): one that
    was deleted under the running relay (the exchange, its bindings) is back at the next
    session, not after a restart. An exchange deleted during the declaration is waited for
    (ExchangeMissing), a broker lost or silent during it retried (ServiceUnavailable); a
    declaration the broker refuses is the start's error, and ends the relay as it would."""

    async def declare(channel: aio_pika.abc.AbstractChannel) -> None:
        try:
            with anyio.fail_after(START_TIMEOUT_S):
                await topology.declare(channel, names)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:  # one of MISMATCH: first
            raise ExchangeMissing(exchange=names.exchange, detail=str(exc)[:200]) from None
        except topology.MISMATCH as exc:
            raise topology.mismatch(exc, exchange=names.exchange) from None
        except (TimeoutError, aiormq.exceptions.AMQPConnectionError, *_BROKER_LOST) as exc:
            detail = f"the topology's declaration: {type(exc).__name__}"
            raise ServiceUnavailable(service="rabbitmq", detail=detail) from exc

    return declare


async def _main(settings: Settings, app: App, relays: list[Relay] | None = None) -> int:
    config = relay_config(settings, app)
    await _prepare(settings, app)
    declare = _declarer(app.topology(prefix(app, settings))) if settings.topology_declare else None
    relay = Relay(
        config,
        publisher=lambda: amqp_publisher(config.amqp_url, config.exchange, declare=declare),
    )
    if relays is not None:
        relays.append(relay)
    async with anyio.create_task_group() as tg:

        async def announce() -> None:
            await relay.publishing.wait()  # a broker session and a database link
            runtime.ready(log, "relay ready: exchange=%s", config.exchange)

        tg.start_soon(announce)
        tg.start_soon(runtime.stop_on_signals, relay, "relay")
        await relay.run()
        tg.cancel_scope.cancel()
    stats = relay.stats
    log.info(
        "relay stopped: published=%d held=%d claims=%d cycles=%d awake_promises=%d",
        stats.published,
        stats.held,
        stats.claims,
        stats.cycles,
        stats.promises,
    )
    return 0
