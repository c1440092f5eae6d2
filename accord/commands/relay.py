"""`accord relay`: run the outbox relay until SIGTERM or SIGINT.

Refuses to start on a schema older than the code, declares the application's topology
(idempotent), then runs one :class:`accord.relay.Relay` as the PostgreSQL role
ACCORD_RELAY_ROLE (``accord_relay``: its outbox columns only; empty: the DSN's own user).
SIGTERM lets the current batch finish and settle, then exits 0; a crashed loop exits
non-zero so the supervisor restarts it.
"""

from __future__ import annotations

import argparse
import logging

import aiormq
import anyio

from accord import runtime
from accord.app import App
from accord.commands.common import prefix, require_app
from accord.relay import Relay, RelayConfig
from accord.schemas import broker, migrate, topology
from accord.schemas.errors import ConfigError, ServiceUnavailable
from accord.schemas.settings import Settings

log = logging.getLogger("accord.relay")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("relay", help="run the outbox relay", description=__doc__)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = require_app(args, settings)
    with runtime.metrics(settings):
        return int(runtime.run(_main, settings, app))


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
        retention_s=settings.relay_retention_s,
        prune_batch=settings.relay_prune_batch,
        prune_every_s=settings.relay_prune_every_s,
        unroutable_attempts=settings.relay_unroutable_attempts,
        max_message_bytes=settings.relay_max_message_bytes,
        # least privilege by default: the relay principal (relay/schema.sql) (empty: the DSN's
        # own user)
        pg_role=settings.relay_role or None,
    )


async def _prepare(settings: Settings, app: App) -> None:
    await migrate.require_current_at(settings.pg_dsn, app.migration_chains())
    try:
        amqp = await broker.connect(settings.amqp_url, timeout=10)
    except OSError as exc:
        raise ServiceUnavailable(service="rabbitmq", detail=type(exc).__name__) from exc
    names = app.topology(prefix(app, settings))
    try:
        channel = await amqp.channel()
        await topology.declare(channel, names, passive=not settings.topology_declare)
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise ConfigError(
            "the broker lacks the application's topology: declare it once"
            " (ACCORD_TOPOLOGY_DECLARE=true, or deploy/rabbitmq/definitions.json)",
            exchange=names.exchange,
            detail=str(exc)[:200],
        ) from None
    finally:
        await amqp.close()


async def _main(settings: Settings, app: App) -> int:
    config = relay_config(settings, app)
    await _prepare(settings, app)
    relay = Relay(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.stop_on_signals, relay, "relay")
        print(f"relay ready: exchange={config.exchange}", flush=True)
        await relay.run()
        tg.cancel_scope.cancel()
    log.info("relay stopped: published=%d held=%d", relay.stats.published, relay.stats.held)
    return 0
