"""A process's PostgreSQL connections carry its name (application_name), unless the DSN or
the caller names them: what `accord worker report` sets, and what it never overrides."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest

from accord.cli import process_name
from accord.schemas import db

DSN = "postgresql://accord@127.0.0.1:5432/accord"


@pytest.fixture(autouse=True)
def _unnamed() -> Iterator[None]:
    yield
    db.name_connections(None)


def _settings(dsn: str, **kwargs: Any) -> dict[str, Any]:
    db._named(dsn, kwargs)
    settings: dict[str, Any] = kwargs.get("server_settings") or {}
    return settings


def test_a_named_process_names_its_connections_beside_the_role() -> None:
    assert _settings(DSN) == {}  # control: nothing named, nothing sent
    db.name_connections("accord worker report")
    assert _settings(DSN) == {"application_name": "accord worker report"}
    assert _settings(DSN, server_settings={"role": "accord_worker"}) == {
        "role": "accord_worker",
        "application_name": "accord worker report",
    }


def test_a_name_the_dsn_or_the_caller_gives_is_kept() -> None:
    db.name_connections("accord relay")
    assert _settings(f"{DSN}?application_name=billing-relay") == {}  # asyncpg sends the DSN's
    assert _settings(DSN, server_settings={"application_name": "mine"}) == {
        "application_name": "mine"
    }


def test_the_name_fits_postgresql_s_63_bytes_without_splitting_a_character() -> None:
    db.name_connections("accord consume " + "é" * 40)
    name = _settings(DSN)["application_name"]
    assert len(name.encode()) <= 63 and name.startswith("accord consume é")


def test_the_process_name_is_the_command_and_its_class() -> None:
    assert process_name(argparse.Namespace(command="worker", workflow="report")) == (
        "accord worker report"
    )
    assert process_name(argparse.Namespace(command="relay")) == "accord relay"
