"""How a database lost during a process's start ends it: the pool's later connections map
their errors as ``connect`` does, and the CLI turns a session that ended before the process
serves into one line (ConnectionLost), but never a protocol violation (a bug) or a session
lost once the process serves (its loops reconnect; one that escaped is a bug too)."""

from __future__ import annotations

import threading

import asyncpg
import pytest

from accord import cli, observe
from accord.jobs.errors import JournalBroken, LedgerUnavailable
from accord.schemas.db import create_pool
from accord.schemas.errors import (
    BrokerAccessRefused,
    ConfigError,
    ConnectionLost,
    ServiceUnavailable,
)
from tests.support import free_port


async def test_a_connection_the_pool_opens_later_maps_its_errors() -> None:
    """min_size 0: the pool opens its first connection at the first acquire, as it reopens
    one that was lost. Refused there, it is ServiceUnavailable naming host:port, not the
    socket's ConnectionRefusedError."""
    pool = await create_pool(f"postgresql://u@127.0.0.1:{free_port()}/d", min_size=0)
    try:
        with pytest.raises(ServiceUnavailable) as info:
            await pool.acquire(timeout=10)
        assert info.value.fields["service"] == "postgresql"
        assert info.value.fields["at"].startswith("127.0.0.1:")
        assert isinstance(info.value.__cause__, OSError)
    finally:
        await pool.close()


def test_a_session_that_ended_during_the_start_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(observe, "_serving", threading.Event())  # this test's own state
    ended = asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")
    found = cli._accord_error(ExceptionGroup("start", [ended]))
    assert isinstance(found, ConnectionLost)
    assert found.fields == {"service": "postgresql", "error": "ConnectionDoesNotExistError"}
    # Not a lost session: a protocol violation is a bug, its traceback stands.
    assert cli._accord_error(asyncpg.ProtocolViolationError("unexpected message")) is None
    # Once the process serves, a session error that escaped its loops is a bug too.
    observe.serving()
    assert cli._accord_error(ended) is None


def test_a_refusal_in_a_group_is_named_before_what_it_caused() -> None:
    """A task group's failure holding a refusal (a ConfigError: the broker refused this user
    a queue) and the lost connection the refusal closed: the line names the refusal, which
    says what to do, whichever task failed first."""
    refused = BrokerAccessRefused("RabbitMQ refused this user the queue", queue="q")
    lost = ConnectionLost(service="rabbitmq")
    for group in (ExceptionGroup("run", [lost, refused]), ExceptionGroup("run", [refused, lost])):
        assert cli._accord_error(ExceptionGroup("outer", [group])) is refused
    assert cli._accord_error(ExceptionGroup("run", [lost])) is lost  # control: alone, itself


def test_a_group_of_ended_sessions_logs_one_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Three tasks lost the same database during the start: one line (ConnectionLost) and
    one warning with the driver's traceback, the chosen one's (before: one per task). A
    refusal in the group is named instead, and then no session warning is logged."""
    monkeypatch.setattr(observe, "_serving", threading.Event())  # this test's own state
    ended = [asyncpg.ConnectionDoesNotExistError(f"closed {i}") for i in range(3)]
    with caplog.at_level("WARNING", logger=cli.log.name):
        found = cli._accord_error(ExceptionGroup("start", [*ended]))
    assert isinstance(found, ConnectionLost)
    warnings = [r for r in caplog.records if "session ended" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is not None
    assert warnings[0].exc_info[1] is ended[0]
    caplog.clear()
    refused = BrokerAccessRefused("RabbitMQ refused this user the queue", queue="q")
    with caplog.at_level("WARNING", logger=cli.log.name):
        assert cli._accord_error(ExceptionGroup("start", [*ended, refused])) is refused
    assert not [r for r in caplog.records if "session ended" in r.getMessage()]


def test_a_failure_a_restart_may_cure_exits_75_a_refusal_2() -> None:
    """A supervisor restarts on 75 and stops on 2 (docs/operations.md, Exit status): a service
    that failed, an error it caused (the ledger's database down), a journal write that failed
    are 75; the same ledger error caused by the database's refusal, and a refusal, are 2."""
    down = ServiceUnavailable(service="postgresql", at="127.0.0.1:1")
    ledger_down = LedgerUnavailable("the ledger database did not answer")
    ledger_down.__cause__ = down
    ledger_refused = LedgerUnavailable("the ledger database refused")
    ledger_refused.__cause__ = asyncpg.InsufficientPrivilegeError("permission denied")
    cases = {
        down: True,
        ConnectionLost(service="rabbitmq"): True,
        ledger_down: True,
        JournalBroken("fsync failed"): True,
        ledger_refused: False,
        ConfigError("the configuration cannot work"): False,
    }
    assert {error: cli.temporary(error) for error in cases} == cases
