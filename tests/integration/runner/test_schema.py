"""The worker's and the demo's SQL agree with the migrated schema."""

from __future__ import annotations

import re
from types import ModuleType

import asyncpg
import pytest

from accord.demo import SubmissionState
from accord.demo import sql as demo_sql
from accord.jobs.runner import sql as runner_sql


def statements(*modules: ModuleType) -> list[tuple[str, str]]:
    return [
        (f"{module.__name__}.{name}", value)
        for module in modules
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str)
    ]


STATEMENTS = statements(runner_sql, demo_sql)


@pytest.mark.parametrize(("name", "statement"), STATEMENTS, ids=[n for n, _ in STATEMENTS])
async def test_every_statement_prepares(pg: asyncpg.Connection, name: str, statement: str) -> None:
    await pg.prepare(statement)


async def test_submission_state_enum_mirrors_the_check(pg: asyncpg.Connection) -> None:
    definition = await pg.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1",
        "submissions_state_check",
    )
    assert set(re.findall(r"'([a-z_]+)'::text", definition)) == {s.value for s in SubmissionState}
