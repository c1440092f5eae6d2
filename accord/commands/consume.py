"""`accord consume --workflow NAME`: run the consumer of one workflow class until SIGTERM."""

from __future__ import annotations

import argparse
import logging

from accord import runtime, workflows
from consumers import ConsumerRuntime, RuntimeConfig
from schemas import migrate
from schemas.catalog import default_catalog
from schemas.errors import ConfigError
from schemas.settings import Settings
from schemas.topology import demo_topology


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("consume", help="run the consumer of one workflow class")
    parser.add_argument("--workflow", required=True, help="the workflow class, e.g. report")
    parser.add_argument(
        "--tenant",
        action="append",
        default=None,
        help="a tenant this consumer serves (repeatable; '*' for every tenant); "
        "default: ACCORD_CONSUMER_TENANTS",
    )
    parser.set_defaults(handler=handle)


def config_from(args: argparse.Namespace, settings: Settings) -> RuntimeConfig:
    """The runtime config: explicit tenants from --tenant or ACCORD_CONSUMER_TENANTS."""
    tenants = args.tenant or [t.strip() for t in settings.consumer_tenants.split(",")]
    tenants = [t for t in tenants if t]
    if not tenants:
        raise ConfigError(
            "a consumer serves explicit tenants: pass --tenant (or '*' for every tenant)"
        )
    return RuntimeConfig(
        workflow=args.workflow,
        tenants=frozenset(tenants),
        replay_window_s=settings.inbox_replay_window_s,
        prefetch=settings.consumer_prefetch,
        batch_max=settings.consumer_batch,
        concurrency=settings.consumer_concurrency,
    )


def handle(args: argparse.Namespace, settings: Settings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = config_from(args, settings)
    with runtime.metrics(settings):
        return int(runtime.run(_main, settings, config))


async def _main(settings: Settings, config: RuntimeConfig) -> int:
    catalog = default_catalog()
    consumer = ConsumerRuntime(
        config=config,
        amqp_url=settings.amqp_url,
        pg_dsn=settings.pg_dsn,
        topology=demo_topology(settings.topology_prefix),
        catalog=catalog,
        handlers=workflows.handlers_for(config.workflow, catalog),
    )
    await migrate.require_current_at(settings.pg_dsn)  # refuse a schema older than the code
    await consumer.run(handle_signals=True)
    return 0
