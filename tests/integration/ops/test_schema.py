"""The ops module's statements against the migrated schema; typed reasons mirror the SQL; the
projection principal's privileges; `--since` parsing; `accord metrics-serve` as a process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime

import asyncpg
import pytest

from accord.ops import InvalidSince, WaitReason, parse_since, sql
from accord.ops.replay import PRINCIPAL, REASONS

STATEMENTS = sorted(
    (name, value) for name, value in vars(sql).items() if name.isupper() and isinstance(value, str)
)


@pytest.mark.parametrize(("name", "statement"), STATEMENTS, ids=[n for n, _ in STATEMENTS])
async def test_every_statement_prepares(pg: asyncpg.Connection, name: str, statement: str) -> None:
    async with pg.transaction():
        await pg.prepare(statement)


async def test_wait_reasons_mirror_the_jobs_waiting_view(pg: asyncpg.Connection) -> None:
    definition = await pg.fetchval("SELECT pg_get_viewdef('jobs.waiting'::regclass)")
    in_sql = set(re.findall(r"(?:THEN|ELSE) '([a-z_]+)'", definition))
    assert in_sql == {str(r) for r in WaitReason}
    assert all(r.category for r in WaitReason)


async def test_refusal_reason_mirrors_its_check(pg: asyncpg.Connection) -> None:
    definition = await pg.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conname = 'replay_refusals_reason_check'"
    )
    assert set(re.findall(r"'([a-z_]+)'", definition)) == REASONS


async def test_projection_principal_privileges(pg: asyncpg.Connection) -> None:
    async def allowed(privilege: str, table: str) -> bool:
        return bool(
            await pg.fetchval("SELECT has_table_privilege($1, $2, $3)", PRINCIPAL, table, privilege)
        )

    # Control: it may write its projection.
    assert await allowed("INSERT", "demo_projection.published_reports")
    assert await allowed("DELETE", "demo_projection.published_reports")
    for table in ("jobs.jobs", "jobs.effects", "jobs.tenants", "relay.outbox", "consumers.inbox",
                  "ops.replay_refusals"):  # fmt: skip
        for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"):
            assert not await allowed(privilege, table), (privilege, table)
    for schema in ("jobs", "relay", "consumers", "ops"):
        assert not await pg.fetchval(
            "SELECT has_schema_privilege($1, $2, 'USAGE')", PRINCIPAL, schema
        )
    assert not await pg.fetchval(
        "SELECT rolcanlogin OR rolsuper FROM pg_roles WHERE rolname = $1", PRINCIPAL
    )


def test_parse_since() -> None:
    assert parse_since("90s") == 90.0
    assert parse_since("15m") == 900.0
    assert parse_since("1h30m") == 5400.0
    assert parse_since("7d") == 7 * 86400.0
    assert parse_since("2026-01-02T03:04:05Z") == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_since("2026-01-02T03:04:05") == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    for bad in ("", "yesterday", "5 minutes", "1x", "-5m"):
        with pytest.raises(InvalidSince):
            parse_since(bad)


@pytest.mark.timeout(60)
def test_metrics_serve_command(pg_dsn: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "accord", "metrics-serve", "--port", "0"],
        env={**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": pg_dsn},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
            assert match, line
            url = f"http://127.0.0.1:{match[1]}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
            assert "accord_status_up 1.0" in text
            assert 'accord_jobs_by_state{state="queued"} 0.0' in text
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
