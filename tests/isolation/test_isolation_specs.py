"""PostgreSQL's own isolationtester runs every spec in this directory against a freshly
migrated database (plus helpers.sql) and the output must equal expected/<name>.out.

The specs call the jobs module's SQL functions (jobs/schema.sql), the statements the store
runs. To regenerate an expected file after a deliberate change, run with
ACCORD_ISOLATION_BLESS=1 and review the diff before committing it.
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import anyio
import asyncpg
import pytest

from tests.support import unavailable

HERE = Path(__file__).resolve().parent
SPECS = sorted(HERE.glob("*.spec"))
DEFAULT_BINARY = Path("/usr/lib/postgresql/15/lib/pgxs/src/test/isolation/isolationtester")
BLESS = os.environ.get("ACCORD_ISOLATION_BLESS", "") not in ("", "0")


def find_isolationtester() -> Path | None:
    """The isolationtester binary: $ISOLATIONTESTER, the PostgreSQL 15 path, PATH, or the
    pgxs tree of any installed PostgreSQL (the client/server dev packages ship it)."""
    for candidate in (os.environ.get("ISOLATIONTESTER"), DEFAULT_BINARY):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    on_path = shutil.which("isolationtester")
    if on_path:
        return Path(on_path)
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/lib/pgxs/src/test/isolation/isolationtester")
    )
    return found[-1] if found else None


def libpq_conninfo(dsn: str) -> str:
    """A key=value conninfo for libpq from a postgresql:// URL."""
    parts = urlsplit(dsn)
    pairs = {
        "dbname": parts.path.lstrip("/"),
        "host": parts.hostname or "127.0.0.1",
        "port": str(parts.port or 5432),
        "user": unquote(parts.username or "postgres"),
    }
    if parts.password:
        pairs["password"] = unquote(parts.password)
    return " ".join(f"{key}='{value}'" for key, value in pairs.items())


def test_every_spec_has_expected_output() -> None:
    assert SPECS, "no isolation specs found"
    names = {spec.stem for spec in SPECS}
    assert names >= {
        "claim_vs_claim",
        "publish_vs_reclaim",
        "publish_vs_cancel",
        "renew_vs_reclaim",
        "finish_effect_vs_claim",
        "rescue_vs_completion",
        "resume_vs_claim",
        "prune_vs_submit",
        "prune_vs_completion",
        "prune_vs_claim",
        "prune_vs_note_trace",
    }
    if not BLESS:
        missing = [s.stem for s in SPECS if not (HERE / "expected" / f"{s.stem}.out").is_file()]
        assert missing == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
async def test_isolation_spec(pg_dsn: str, spec: Path) -> None:
    binary = find_isolationtester()
    if binary is None:
        unavailable("isolationtester not found; install the PostgreSQL server dev package")
        return
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(await anyio.Path(HERE / "helpers.sql").read_text(encoding="utf-8"))
    finally:
        await conn.close()
    with anyio.fail_after(110):
        done = await anyio.run_process(
            [str(binary), libpq_conninfo(pg_dsn)],
            input=await anyio.Path(spec).read_bytes(),
            check=False,
        )
    output = done.stdout.decode()
    assert done.returncode == 0, output + done.stderr.decode()
    expected_path = anyio.Path(HERE / "expected" / f"{spec.stem}.out")
    if BLESS:
        await expected_path.write_text(output, encoding="utf-8")
    expected = await expected_path.read_text(encoding="utf-8")
    diff = "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            output.splitlines(keepends=True),
            fromfile=f"expected/{spec.stem}.out",
            tofile="actual",
        )
    )
    assert output == expected, diff
