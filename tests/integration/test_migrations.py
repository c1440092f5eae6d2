"""The migrator on a real database: apply, no-op, tamper, check, ahead."""

from __future__ import annotations

import asyncpg
import pytest

from schemas import migrate
from schemas.errors import MigrationError, MigrationTampered, SchemaAhead, SchemaBehind


async def test_empty_database_migrates_then_second_run_is_noop(empty_pg_dsn: str) -> None:
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        assert (await migrate.check(conn)).pending  # control: a new database is behind
        applied = await migrate.migrate(conn)
        assert applied == [m.version for m in migrate.load_migrations()]
        assert await migrate.migrate(conn) == []
        assert (await migrate.check(conn)).current
        await migrate.require_current(conn)
        for schema in ("relay", "consumers", "jobs"):
            assert (
                await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema)
                == 1
            )
    finally:
        await conn.close()


async def test_tampered_applied_file_is_refused(pg: asyncpg.Connection) -> None:
    await migrate.require_current(pg)  # control: the untouched ledger passes
    await pg.execute("UPDATE schemas.migrations SET checksum = 'feed' WHERE version = 1")
    with pytest.raises(MigrationTampered) as info:
        await migrate.migrate(pg)
    assert info.value.fields["version"] == 1
    assert "changed after it was applied" in str(info.value)


async def test_check_detects_a_database_behind_the_code(pg: asyncpg.Connection) -> None:
    assert (await migrate.check(pg)).current  # control
    latest = migrate.load_migrations()[-1]
    await pg.execute("DELETE FROM schemas.migrations WHERE version = $1", latest.version)
    status = await migrate.check(pg)
    assert status.pending == (latest.version,)
    with pytest.raises(SchemaBehind):
        await migrate.require_current(pg)


async def test_database_ahead_of_code_is_refused(pg: asyncpg.Connection) -> None:
    await pg.execute(
        "INSERT INTO schemas.migrations (version, name, checksum) VALUES (9999, 'future', 'x')"
    )
    with pytest.raises(SchemaAhead):
        await migrate.check(pg)


async def test_concurrent_migrators_apply_each_file_once(empty_pg_dsn: str) -> None:
    import anyio

    conns = [await asyncpg.connect(empty_pg_dsn) for _ in range(3)]
    results: list[list[int]] = []
    try:

        async def run(conn: asyncpg.Connection) -> None:
            results.append(await migrate.migrate(conn))

        async with anyio.create_task_group() as tg:
            for conn in conns:
                tg.start_soon(run, conn)
        every = sorted(v for r in results for v in r)
        assert every == [m.version for m in migrate.load_migrations()]
    finally:
        for conn in conns:
            await conn.close()


async def test_a_pending_file_below_an_applied_one_is_refused(pg: asyncpg.Connection) -> None:
    versions = [m.version for m in migrate.load_migrations()]
    # control: only the newest missing is an ordinary "behind" (it would apply last anyway)
    await pg.execute("DELETE FROM schemas.migrations WHERE version = $1", versions[-1])
    assert (await migrate.check(pg)).pending == (versions[-1],)
    # forbidden: a gap below the newest applied version would apply out of order
    await pg.execute(
        "INSERT INTO schemas.migrations (version, name, checksum) SELECT $1, $2, $3",
        versions[-1], migrate.load_migrations()[-1].name, migrate.load_migrations()[-1].checksum,
    )  # fmt: skip
    await pg.execute("DELETE FROM schemas.migrations WHERE version = $1", versions[1])
    with pytest.raises(MigrationError) as info:
        await migrate.check(pg)
    assert info.value.fields["pending"] == [versions[1]]
