"""`accord relay` and `accord consume` connect as their least-privileged roles by default
(migration 0014), and as the DSN's own user when the setting is empty; the library classes
default to the DSN's own user (a library user opts in)."""

from __future__ import annotations

import argparse

import pytest

from accord.commands import consume, relay
from accord.consumers import ConsumerRuntime
from accord.demo import app as demo_app
from accord.demo.app import PROJECTION
from accord.relay import RelayConfig
from accord.schemas.settings import Settings


def test_the_settings_name_the_process_roles_by_default() -> None:
    assert Settings.model_fields["relay_role"].default == "accord_relay"
    assert Settings.model_fields["consumer_role"].default == "accord_consumer"


@pytest.mark.parametrize(("role", "expected"), [("accord_relay", "accord_relay"), ("", None)])
def test_accord_relay_connects_as_the_relay_role(role: str, expected: str | None) -> None:
    settings = Settings(relay_role=role)
    assert relay.relay_config(settings, demo_app).pg_role == expected


@pytest.mark.parametrize(("role", "expected"), [("accord_consumer", "accord_consumer"), ("", None)])
def test_accord_consume_connects_as_the_consumer_role(role: str, expected: str | None) -> None:
    settings = Settings(consumer_role=role)
    args = argparse.Namespace(workflow="report", tenant=["*"])
    config = consume.config_from(args, settings, demo_app)
    assert consume.runtime_from(settings, config, demo_app).pg_role == expected


def test_the_library_classes_connect_as_the_dsn_user_unless_told() -> None:
    assert RelayConfig(pg_dsn="postgresql://x/y", amqp_url="amqp://", exchange="e").pg_role is None
    assert ConsumerRuntime.__dataclass_fields__["pg_role"].default is None


def test_accord_consume_of_a_projection_takes_its_rebuild_guard() -> None:
    """A projection's consumer takes the rebuild guard in each transaction, so `accord
    replay --rebuild` can run beside it (control: a class that starts work does not)."""
    settings = Settings()
    for workflow, guard in ((PROJECTION, PROJECTION), ("report", None)):
        args = argparse.Namespace(workflow=workflow, tenant=["*"])
        config = consume.config_from(args, settings, demo_app)
        assert config.projection is (guard is not None)
        assert consume.runtime_from(settings, config, demo_app)._processor.guard == guard
