"""`accord consume --workflow NAME`: run the consumer of one of the application's workflow
classes until SIGTERM. Tenants: ``--tenant``, else ACCORD_CONSUMER_TENANTS, else the tenants
the class declares; none at all refuses to start. Runs as the PostgreSQL role
ACCORD_CONSUMER_ROLE (``accord_consumer``: the inbox, deliveries, poison and jobs.submit, plus
what the application grants it for its handlers; empty: the DSN's own user)."""

from __future__ import annotations

import argparse
import logging

import anyio

from accord import runtime
from accord.app import App
from accord.commands import args
from accord.commands.common import check_retention, prefix, require_app, served_tenants
from accord.consumers import ConsumerRuntime, RuntimeConfig
from accord.ops import checks
from accord.ops.health import Check
from accord.schemas import migrate
from accord.schemas.errors import ConfigError
from accord.schemas.settings import Settings

log = logging.getLogger("accord.consumer")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "consume", help="run the consumer of one workflow class", description=__doc__
    )
    parser.add_argument("--workflow", required=True, help="the application's consumer class")
    parser.add_argument(
        "--tenant",
        type=args.text,
        action="append",
        default=None,
        help="a tenant this consumer serves (repeatable; '*' for every tenant); "
        "default: ACCORD_CONSUMER_TENANTS",
    )
    parser.set_defaults(handler=handle)


def config_from(args: argparse.Namespace, settings: Settings, app: App) -> RuntimeConfig:
    """The runtime config: explicit tenants from --tenant, ACCORD_CONSUMER_TENANTS or the
    class's declaration. Raises SettingsInvalid for a retention shorter than the replay
    horizon."""
    check_retention(settings)
    declared = app.consumer_class(args.workflow)
    if not tuple(declared.handlers):  # its queue bound to nothing: ready, and idle for ever
        raise ConfigError(
            "the consumer class handles no event type: is the module of its handlers imported"
            " by the application's?",
            workflow=args.workflow,
        )
    tenants = served_tenants(args.tenant, settings, declared.tenants)
    if not tenants:
        raise ConfigError(
            "a consumer serves explicit tenants: pass --tenant (or '*' for every tenant)"
        )
    if settings.consumer_max_body_bytes < app.max_payload_bytes:
        raise ConfigError(
            "ACCORD_CONSUMER_MAX_BODY_BYTES is below the payload its producers may enqueue"
            " (App max_payload_bytes): such events would be poisoned unread as too_large",
            consumer_max_body_bytes=settings.consumer_max_body_bytes,
            max_payload_bytes=app.max_payload_bytes,
        )
    return RuntimeConfig(
        workflow=args.workflow,
        tenants=frozenset(tenants),
        replay_window_s=settings.inbox_replay_window_s,
        prefetch=settings.consumer_prefetch,
        batch_max=settings.consumer_batch,
        batch_linger_s=settings.consumer_batch_linger_s,
        concurrency=settings.consumer_concurrency,
        max_body_bytes=settings.consumer_max_body_bytes,
        declare=settings.topology_declare,
        poison_retention_s=settings.poison_retention_s,
        projection=declared.reset is not None,
        retry_backoff_s=settings.consumer_retry_backoff_s,
    )


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = require_app(args, settings)
    config = config_from(args, settings, app)
    with runtime.metrics(settings, checks=readiness_checks(settings, config, app)):
        return int(runtime.run(_main, settings, config, app, service=True))


def readiness_checks(settings: Settings, config: RuntimeConfig, app: App) -> list[Check]:
    """`/readyz` of a consumer: its database (schema current) and its class's queue."""
    queue = app.topology(prefix(app, settings)).queue(config.workflow)
    return [
        checks.postgresql(settings.pg_dsn, app.migration_chains()),
        checks.rabbitmq(settings.amqp_url, queue=queue),
    ]


def runtime_from(settings: Settings, config: RuntimeConfig, app: App) -> ConsumerRuntime:
    """The consumer runtime of ``config``'s class, from settings (the only place they meet)."""
    return ConsumerRuntime(
        config=config,
        amqp_url=settings.amqp_url,
        pg_dsn=settings.pg_dsn,
        topology=app.topology(prefix(app, settings)),
        catalog=app.catalog,
        handlers=app.consumer_class(config.workflow).handlers,
        # least privilege by default: the consumer principal (consumers/schema.sql) plus what the
        # application grants it (empty: the DSN's own user)
        pg_role=settings.consumer_role or None,
    )


async def _main(settings: Settings, config: RuntimeConfig, app: App) -> int:
    consumer = runtime_from(settings, config, app)
    # refuse a schema older than the code (accord's and the application's)
    await migrate.require_current_at(settings.pg_dsn, app.migration_chains())
    async with anyio.create_task_group() as tg:

        async def announce() -> None:
            await consumer.consuming.wait()
            runtime.ready(
                log,
                "consumer ready: workflow=%s queue=%s",
                config.workflow,
                consumer.topology.queue(config.workflow),
            )

        tg.start_soon(announce)
        tg.start_soon(runtime.stop_on_signals, consumer, "consumer")
        await consumer.run()
        tg.cancel_scope.cancel()
    return 0
