"""Flags and settings out of range: the real `accord` command refuses each at its start, one
line naming the flag or the variable, exit 2, nothing read or changed. Before, each got
through: a traceback after the process said it was ready (a retention of 1e300 s, a
prefetch of 70000, a lease of two days), a database error (a negative limit, a job id past
bigint), a libpq default (an empty DSN), or, for `reconcile --settle-s nan`, a provider's
"never seen" trusted at once (a request in flight resolved failed_before_dispatch, and sent
again)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import asyncpg
import pytest

from accord.jobs import reconcile
from accord.schemas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)


def accord(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    return subprocess.run(
        [sys.executable, "-m", "accord", *argv],
        env={**clean, "PYTHONPATH": str(ROOT), "ACCORD_APP": "accord.demo:app", **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def refused(done: subprocess.CompletedProcess[str], *names: str) -> None:
    """Exit 2, no traceback, the flag or variable named."""
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-1500:])
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    for name in names:
        assert name in done.stderr, (name, done.stderr[-800:])


FLAGS = [
    ("reconcile", "--settle-s", "nan"),
    ("reconcile", "--settle-s", "-100"),
    ("reconcile", "--escalate-after-s", "1e300"),
    ("reconcile", "--limit", "-1"),
    ("relay", "held", "--limit", "-1"),
    ("jobs", "list", "--limit", "0"),
    ("jobs", "show", "99999999999999999999"),
    ("repair", "release-hold", "--who", "a", "--evidence", "b", "--job", "99999999999999999999"),
    ("worker", "--workflow", "report", "--rescue-every-s", "nan"),
    ("worker", "--workflow", "report", "--poll-s", "inf"),
    ("worker", "--workflow", "report", "--lease-s", "200000"),
    ("metrics-serve", "--port", "70000"),
    ("register", "--workflow", "report", "--owner", ""),
    ("register", "--workflow", "report", "--owner", "w", "--who", " "),
    ("repair", "release-hold", "--job", "1", "--who", "a", "--evidence", ""),
    ("replay", "--workflow", "report_projection", "--since", "1h", "--batch", "-5"),
    ("replay", "--workflow", "report_projection", "--since", "1h", "--tenant", ""),
    # before year 1 once in UTC: asyncpg could not send it (an OverflowError's traceback)
    ("replay", "--workflow", "report_projection", "--since", "0001-01-01T00:30:00+01:00"),
    ("demo", "--n", "0"),
    # bytes the locale did not decode (Python's lone surrogates), or a NUL: no database text
    # takes them (before: asyncpg's encoding error, a traceback, exit 1)
    ("jobs", "list", "--tenant", "acme\udcff"),
    ("jobs", "list", "--workflow", "\udcffreport"),
    ("register", "--workflow", "report", "--owner", "w\udcff"),
    (
        "repair",
        "resolve-effect",
        "--job",
        "1",
        "--outcome",
        "succeeded",
        "--who",
        "a",
        "--evidence",
        "b",
        "--key",
        "k\udcff",
    ),
    ("worker", "--workflow", "report", "--owner", "\udcff"),
]


@pytest.mark.parametrize("argv", FLAGS, ids=[" ".join(f) for f in FLAGS])
def test_a_flag_out_of_range_is_a_usage_error(argv: tuple[str, ...], pg_dsn: str) -> None:
    done = accord(*argv, env={"ACCORD_PG_DSN": pg_dsn})
    refused(done, argv[-2] if argv[-2].startswith("--") else "argument ID")  # the bad one


SETTINGS = [
    ("relay", "ACCORD_RELAY_RETENTION_S", "1e300"),
    ("consume", "ACCORD_POISON_RETENTION_S", "1e300"),
    ("consume", "ACCORD_CONSUMER_PREFETCH", "70000"),
    ("consume", "ACCORD_CONSUMER_CONCURRENCY", "100000"),
    ("worker", "ACCORD_JOB_LEASE_S", "200000"),
    ("migrate", "ACCORD_PG_DSN", ""),
    ("relay", "ACCORD_AMQP_URL", ""),
    ("relay", "ACCORD_TOPOLOGY_PREFIX", "has space"),
    ("relay", "ACCORD_TOPOLOGY_PREFIX", "x" * 300),
    # a count past what its statement takes (it failed at the first claim, a traceback)
    ("relay", "ACCORD_RELAY_BATCH", "1e20"),
    ("relay", "ACCORD_RELAY_IN_FLIGHT", "100000000000000000000"),
    ("consume", "ACCORD_CONSUMER_MAX_BODY_BYTES", "1e12"),
    # below the application's payload limit: such events would commit, then be held for good
    ("relay", "ACCORD_RELAY_MAX_MESSAGE_BYTES", "1000"),
]


@pytest.mark.parametrize(
    ("command", "name", "value"), SETTINGS, ids=[f"{c} {n}" for c, n, _ in SETTINGS]
)
def test_a_setting_out_of_range_stops_the_start(
    command: str, name: str, value: str, pg_dsn: str
) -> None:
    argv = [command, "--workflow", "report"] if command in ("consume", "worker") else [command]
    done = accord(*argv, env={"ACCORD_PG_DSN": pg_dsn, name: value})
    refused(done, name)


def test_an_empty_repair_role_is_the_dsn_s_own_user(pg_dsn: str) -> None:
    """As the other roles: empty means the DSN's user (before, `SET role ''`: a traceback)."""
    done = accord("repair", "audit", "--tenant", "x", env={
        "ACCORD_PG_DSN": pg_dsn, "ACCORD_REPAIR_ROLE": "",
    })  # fmt: skip
    assert done.returncode == 0, done.stderr[-1500:]


def test_gc_objects_refuses_a_directory_that_is_not_there(pg_dsn: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    done = accord("gc-objects", "--dir", str(missing), env={"ACCORD_PG_DSN": pg_dsn})
    refused(done, str(missing), "not a directory")
    made = tmp_path / "objects"
    made.mkdir()  # control: an empty store is collected (nothing to delete)
    done = accord("gc-objects", "--dir", str(made), env={"ACCORD_PG_DSN": pg_dsn})
    assert done.returncode == 0, done.stderr[-1500:]


def app_with_migrations(tmp_path: Path, name: str, migrations: Path, pg_dsn: str) -> dict[str, str]:
    """An application module ``name`` (its migration chain in ``migrations``) written under
    ``tmp_path``; the environment that runs `accord` for it."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        from pydantic import BaseModel
        from accord import App, Catalog, EventType

        class Placed(BaseModel):
            order_id: str

        app = App({name!r}, catalog=Catalog([EventType("order.placed", 1, Placed)]),
                  migrations=Path({str(migrations)!r}))
    """))  # fmt: skip
    return {"ACCORD_PG_DSN": pg_dsn, "PYTHONPATH": f"{tmp_path}:{ROOT}"}


def test_a_migration_whose_sql_fails_is_named(pg_dsn: str, tmp_path: Path) -> None:
    """Before: a PostgresSyntaxError traceback naming neither the file nor the application."""
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_typo.sql").write_text("CREATE TABLE typo_t (id int;\n")
    env = app_with_migrations(tmp_path, "badmig", migrations, pg_dsn)
    done = accord("migrate", "--app", "badmig:app", env=env)
    refused(done, "MigrationFailed", "badmig 0001_typo", "42601")


def test_a_migration_file_that_commits_itself_is_refused_before_anything_applies(
    pg_dsn: str, tmp_path: Path
) -> None:
    """A file written for psql (BEGIN; ...; COMMIT;) in a chain accord applies one file per
    transaction: its COMMIT would commit what came before it alone, and an error after it
    left the file half applied with no ledger row (every later migrate then failed on what
    did commit). Refused naming the file and the statement, before any file of the run is
    applied (control: without the COMMIT the chain applies)."""
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_table.sql").write_text("CREATE TABLE commits_t (id int);\n")
    second = migrations / "0002_commits.sql"
    second.write_text("ALTER TABLE commits_t ADD x int;\nCOMMIT;\nCREATE INDEX ON commits_t (x);\n")
    env = app_with_migrations(tmp_path, "commitmig", migrations, pg_dsn)
    done = accord("migrate", "--app", "commitmig:app", env=env)
    refused(done, "MigrationFailed", "commitmig 0002_commits", "COMMIT")

    async def table() -> object:
        conn = await asyncpg.connect(pg_dsn)
        try:
            return await conn.fetchval("SELECT to_regclass('public.commits_t')")
        finally:
            await conn.close()

    assert anyio.run(table) is None  # not even the first file
    second.write_text("ALTER TABLE commits_t ADD x int;\nCREATE INDEX ON commits_t (x);\n")
    done = accord("migrate", "--app", "commitmig:app", env=env)
    assert done.returncode == 0, done.stderr  # control
    assert anyio.run(table) is not None


async def test_reconcile_refuses_a_settle_that_would_trust_never_seen_at_once(
    pg: asyncpg.Connection,
) -> None:
    """The library's own boundary (the CLI's flags above are one caller)."""
    for bad in ({"settle_s": float("nan")}, {"settle_s": -1.0}, {"escalate_after_s": 1e300}):
        with pytest.raises(ConfigError):
            await reconcile.reconcile(pg, None, who="t", **{"escalate_after_s": 3600.0, **bad})
    report = await reconcile.reconcile(pg, None, who="t", escalate_after_s=3600.0)  # control
    assert report.resolved == ()
