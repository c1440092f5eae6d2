"""Fixtures of the trace tests: the demo's provider simulator, in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.demo.provider import ProviderServer


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[ProviderServer]:
    server = ProviderServer(str(tmp_path / "provider.sqlite3"))
    server.start()
    yield server
    server.stop()
