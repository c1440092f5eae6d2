"""Bad input at start: each is one line naming the problem, exit status 2, nothing started.

The real `accord` command, for each long-running process kind: an ``--app`` that does not
import or names no application, a handler for a type missing from the catalog, two classes
binding one queue, an effect key no provider owns, two providers owning one key; and an
application migration changed
after it was applied. Control: the same commands with a good application get past loading.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)

BAD = "tests.integration.badapps"
COMMANDS = (["relay"], ["consume", "--workflow", "orders"], ["worker", "--workflow", "orders"])
CASES = [
    ("no_such_module_here:app", "AppNotFound", "the --app module does not import"),
    ("tests.integration.badapp_broken:app", "AppNotFound", "RuntimeError"),
    (f"{BAD}:nothing_here", "AppNotFound", "the --app attribute is not an accord.App"),
    (f"{BAD}:not_an_app", "AppNotFound", "found='int'"),
    (BAD, "AppNotFound", "--app takes module:attribute"),
    (f"{BAD}:missing_type", "AppInvalid", "a handler takes an event type the catalog does not"),
    (f"{BAD}:one_queue", "AppInvalid", "two consumer classes bind one queue"),
    (f"{BAD}:unowned_key", "AppInvalid", "an effect key no provider owns"),
    (f"{BAD}:shared_key", "AppInvalid", "two providers own overlapping effect keys"),
]


def accord(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_")}
    return subprocess.run(
        [sys.executable, "-m", "accord", *args],
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str], error: str, text: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"accord: {error}: "), lines[0]
    assert text in lines[0], lines[0]


@pytest.mark.parametrize(("spec", "error", "text"), CASES)
def test_a_bad_application_stops_every_process_with_one_line(
    spec: str, error: str, text: str, pg_dsn: str
) -> None:
    for command in COMMANDS:
        one_line(accord(*command, "--app", spec, ACCORD_PG_DSN=pg_dsn), error, text)
    # ACCORD_APP is read the same way as --app
    one_line(accord("relay", ACCORD_APP=spec, ACCORD_PG_DSN=pg_dsn), error, text)


def test_a_command_that_needs_an_application_says_so(pg_dsn: str) -> None:
    for command in (*COMMANDS, ["reconcile"], ["replay", "--workflow", "p", "--since", "1h"]):
        one_line(accord(*command, ACCORD_PG_DSN=pg_dsn), "AppNotFound", "needs an application")


def test_an_invalid_setting_is_one_line_not_a_traceback() -> None:
    done = accord("status", ACCORD_RELAY_BATCH="many")
    one_line(done, "SettingsInvalid", "ACCORD_RELAY_BATCH")


def test_an_application_migration_changed_after_it_was_applied(
    empty_pg_dsn: str, tmp_path: Path
) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    applied = migrations / "0001_orders.sql"
    applied.write_text("CREATE SCHEMA orders;\nCREATE TABLE orders.placed (id text PRIMARY KEY);\n")
    env = {"ACCORD_PG_DSN": empty_pg_dsn, "BADAPP_MIGRATIONS": str(migrations)}
    spec = f"{BAD}:migrating"
    done = accord("migrate", "--app", spec, **env)
    assert done.returncode == 0, done.stderr  # control: a good application migrates
    assert "('migrating', 1)" in done.stdout
    assert accord("migrate", "--check", "--app", spec, **env).returncode == 0
    applied.write_text(applied.read_text() + "-- changed after it was applied\n")
    for command in (["migrate"], ["status"], *COMMANDS):
        one_line(accord(*command, "--app", spec, **env), "MigrationTampered", "migrating")
