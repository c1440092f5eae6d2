"""How the consumer classifies failures: PostgreSQL's refusals by SQLSTATE class, typed
poison reasons, storable poison details, and the body bound's configuration (issue #16)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from accord.consumers import InboxConflict, PoisonReason, RuntimeConfig, TransientFailure
from accord.consumers.batch import _classify
from accord.consumers.errors import (
    DataException,
    IntegrityViolation,
    MessageTooLarge,
    PrivilegeMissing,
    StatementRefused,
)
from accord.consumers.poison import error_detail, reason_for, storable, summarize_headers
from accord.consumers.verdicts import database_refusal
from accord.schemas.errors import ConfigError, InvalidEvent, MalformedMessage, TenantConflict

pg = asyncpg.exceptions


@pytest.mark.parametrize(
    ("error", "kind", "reason"),
    [
        (pg.UntranslatableCharacterError, DataException, "data_exception"),  # 22P05
        (pg.CharacterNotInRepertoireError, DataException, "data_exception"),  # 22021: NUL
        (pg.InvalidTextRepresentationError, DataException, "data_exception"),  # 22P02
        (pg.StringDataRightTruncationError, DataException, "data_exception"),  # 22001
        (pg.CheckViolationError, IntegrityViolation, "integrity_violation"),  # 23514
        (pg.NotNullViolationError, IntegrityViolation, "integrity_violation"),  # 23502
        (pg.ForeignKeyViolationError, IntegrityViolation, "integrity_violation"),  # 23503
        (pg.UniqueViolationError, IntegrityViolation, "integrity_violation"),  # 23505
        (pg.PostgresSyntaxError, StatementRefused, "statement_refused"),  # 42601
        (pg.UndefinedColumnError, StatementRefused, "statement_refused"),  # 42703
    ],
)
def test_refusals_of_the_content_are_permanent_with_the_sqlstate(
    error: type[asyncpg.PostgresError], kind: type[Exception], reason: str
) -> None:
    refused = database_refusal(error("refused"))
    assert isinstance(refused, kind)
    assert refused.fields["sqlstate"] == error.sqlstate
    assert reason_for(refused) == PoisonReason(reason)
    detail = error_detail(refused)
    assert detail["sqlstate"] == error.sqlstate and detail["error"] == kind.__name__
    assert "refused" not in json.dumps(detail)  # names and codes, never the message text


class _Open:
    def is_closed(self) -> bool:
        return False


def test_a_missing_grant_stops_the_consumer_instead_of_poisoning() -> None:
    """42501 says the consumer's role lacks a grant, whatever the message: it is no content
    refusal (control: 42601 is) and the classification stops the consumer with the table."""
    assert database_refusal(pg.InsufficientPrivilegeError("denied")) is None
    assert isinstance(database_refusal(pg.PostgresSyntaxError("x")), StatementRefused)
    denied = pg.InsufficientPrivilegeError("permission denied for table orders")
    with pytest.raises(PrivilegeMissing) as info:
        _classify(_Open(), None, denied)  # type: ignore[arg-type]
    assert "permission denied for table orders" in str(info.value)


@pytest.mark.parametrize(
    "error",
    [
        pg.SerializationError("x"),  # 40001
        pg.DeadlockDetectedError("x"),  # 40P01
        pg.ConnectionFailureError("x"),  # 08006
        pg.ConnectionDoesNotExistError("x"),  # 08003
        pg.QueryCanceledError("x"),  # 57014: statement_timeout
        pg.AdminShutdownError("x"),  # 57P01
        pg.InFailedSQLTransactionError("x"),  # 25P02
        pg.OutOfMemoryError("x"),  # 53200
        asyncpg.InterfaceError("x"),
        TimeoutError(),
        OSError(),
        TransientFailure("later"),
        InboxConflict(),  # accord's own permanent errors keep their own classification
        RuntimeError("a handler's bug"),
    ],
)
def test_everything_else_is_not_a_refusal(error: BaseException) -> None:
    assert database_refusal(error) is None


def test_the_refusal_keeps_names_of_the_schema_objects() -> None:
    error = pg.CheckViolationError("new row violates check constraint")
    error.constraint_name, error.table_name, error.schema_name = "notes_doc", "notes", "app"
    refused = database_refusal(error)
    assert refused is not None
    assert refused.fields == {
        "sqlstate": "23514",
        "postgres_error": "CheckViolationError",
        "schema": "app",
        "table": "notes",
        "constraint": "notes_doc",
    }
    assert refused.__cause__ is error


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (TenantConflict(tenant="a", key="tenant", payload_tenant="b"), "tenant_conflict"),
        (MessageTooLarge(bytes=2, limit=1), "too_large"),
        (InvalidEvent(detail="NUL character"), "invalid_event"),
        (MalformedMessage(problem="bad_header", header="authepoch"), "bad_header"),
    ],
)
def test_typed_reasons(error: Exception, reason: str) -> None:
    assert reason_for(error) == PoisonReason(reason)


def test_too_large_detail_names_the_size_and_the_limit() -> None:
    detail = error_detail(MessageTooLarge(bytes=300_000, limit=262_144))
    assert detail == {"error": "MessageTooLarge", "bytes": 300_000, "limit": 262_144}


@pytest.mark.parametrize("text", ["a\x00b", "\ud800", "x\udfff\x00", "ok", "é\U0001f600"], ids=repr)
def test_what_a_poison_record_keeps_is_storable(text: str) -> None:
    detail = error_detail(MalformedMessage(problem="duplicate_key", key=text, n=float("nan")))
    headers = summarize_headers(
        {"ce-id": text, text: "v", "ce-type": text.encode("utf-8", "surrogatepass")}
    )
    for document in (detail, headers):
        dumped = json.dumps(document, ensure_ascii=False)
        dumped.encode("utf-8")  # no lone surrogate left
        assert "\x00" not in dumped
    assert detail["n"] == "nan"
    assert storable("ok") == "ok" and storable("é") == "é"  # control: good text is kept
    assert storable("a\x00b") == "a\\x00b" and storable("\ud800") == "\\ud800"


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "1"])
def test_the_body_bound_must_be_a_positive_number_of_bytes(value: Any) -> None:
    assert RuntimeConfig(workflow="w", tenants=frozenset({"*"})).max_body_bytes == 256 * 1024
    assert RuntimeConfig(workflow="w", tenants=frozenset({"*"}), max_body_bytes=1).max_body_bytes
    with pytest.raises(ConfigError):
        RuntimeConfig(workflow="w", tenants=frozenset({"*"}), max_body_bytes=value)


@pytest.mark.parametrize("value", [-0.001, float("nan"), 30.0])
def test_a_batch_linger_is_a_short_non_negative_wait(value: float) -> None:
    tenants = frozenset({"*"})
    assert RuntimeConfig(workflow="w", tenants=tenants).batch_linger_s == 0.01
    assert RuntimeConfig(workflow="w", tenants=tenants, batch_linger_s=0).batch_linger_s == 0
    with pytest.raises(ConfigError):
        RuntimeConfig(workflow="w", tenants=tenants, batch_linger_s=value)
