"""The jobs schema and its SQL agree with the code: enums, statements, indexes, guards."""

from __future__ import annotations

import re

import asyncpg
import pytest

from jobs import sql
from jobs.models import EffectState, JobState


async def check_values(pg: asyncpg.Connection, constraint: str) -> set[str]:
    definition = await pg.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1", constraint
    )
    assert definition is not None, constraint
    return set(re.findall(r"'([a-z_]+)'::text", definition))


async def test_job_state_enum_mirrors_the_check(pg: asyncpg.Connection) -> None:
    assert await check_values(pg, "jobs_state_check") == {s.value for s in JobState}


async def test_effect_state_enum_mirrors_the_check(pg: asyncpg.Connection) -> None:
    assert await check_values(pg, "effects_state_check") == {s.value for s in EffectState}


def statements() -> list[tuple[str, str]]:
    return [
        (name, value)
        for name, value in vars(sql).items()
        if name.isupper() and isinstance(value, str)
    ]


@pytest.mark.parametrize(("name", "statement"), statements(), ids=[n for n, _ in statements()])
async def test_every_statement_prepares(pg: asyncpg.Connection, name: str, statement: str) -> None:
    await pg.prepare(statement)


async def test_claim_uses_its_partial_index(pg: asyncpg.Connection) -> None:
    # Enough rows that the planner would not pick a sequential scan for a good reason.
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    await pg.execute(
        "INSERT INTO jobs.jobs (tenant, workflow, operation_id, digest, state, run_after)"
        " SELECT 'acme', 'w' || (i % 20), 'op' || i, 'd', 'succeeded', now()"
        " FROM generate_series(1, 20000) i"
    )
    await pg.execute("ANALYZE jobs.jobs")
    plan = "\n".join(
        row[0]
        for row in await pg.fetch(
            "EXPLAIN SELECT j.job_id FROM jobs.jobs j WHERE j.workflow = $1"
            " AND j.state = 'queued' AND j.run_after <= now() ORDER BY j.run_after, j.job_id"
            " LIMIT 10 FOR NO KEY UPDATE OF j SKIP LOCKED",
            "w1",
        )
    )
    assert "jobs_claimable_idx" in plan, plan
    rescue_plan = "\n".join(
        row[0]
        for row in await pg.fetch(
            "EXPLAIN SELECT job_id FROM jobs.jobs WHERE state = 'running'"
            " ORDER BY lease_expires_at LIMIT 10"
        )
    )
    assert "jobs_running_idx" in rescue_plan, rescue_plan


async def test_a_finished_effect_outcome_never_changes(pg: asyncpg.Connection) -> None:
    await pg.execute("INSERT INTO jobs.tenants (tenant) VALUES ('acme')")
    job_id = await pg.fetchval(
        "INSERT INTO jobs.jobs (tenant, workflow, operation_id, digest)"
        " VALUES ('acme', 'w', 'op', 'd') RETURNING job_id"
    )
    await pg.execute(
        "INSERT INTO jobs.effects (tenant, job_id, effect_key, seq, intent_digest, attempt_id,"
        " generation) VALUES ('acme', $1, 'k', 1, 'i', gen_random_uuid(), 1)",
        job_id,
    )
    # control: pending -> succeeded is the allowed transition
    await pg.execute("UPDATE jobs.effects SET state = 'succeeded' WHERE job_id = $1", job_id)
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never changes"):
        await pg.execute("UPDATE jobs.effects SET state = 'unknown' WHERE job_id = $1", job_id)
    with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="never deleted"):
        await pg.execute("DELETE FROM jobs.effects WHERE job_id = $1", job_id)
    assert await pg.fetchval("SELECT state FROM jobs.effects WHERE job_id = $1", job_id) == (
        "succeeded"
    )
