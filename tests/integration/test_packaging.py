"""The wheel lives beside an application: it claims one import name, ``accord``.

Built from this checkout, installed into a fresh virtual environment (its dependencies from
the package index, nothing from this checkout), next to an application that has its own
``schemas.py`` and ``jobs/`` package (the usual FastAPI layout): the application imports its
own modules and accord's, and the example application's end-to-end test runs its real
`accord` processes (relay, consumers, worker, reconcile) from that environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)

APP_SCHEMAS = '"""The application\'s own schemas module."""\nINVOICE_FIELDS = ("id", "email")\n'
APP_JOBS = (
    '"""The application\'s own jobs package."""\n\n\ndef nightly() -> str:\n    return "own"\n'
)
PROBE = """
import jobs, schemas, accord
from jobs import nightly
from accord import App
import accord.jobs, accord.schemas
assert nightly() == "own" and schemas.INVOICE_FIELDS == ("id", "email")
assert accord.jobs.Store and accord.schemas.migrate
print(accord.__file__, jobs.__file__, schemas.__file__, sep="\\n")
"""


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)])
    [built] = out.glob("accord-*.whl")
    return built


def test_the_wheel_claims_only_the_accord_import_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"accord"}
    # the design's folders, its migrations and its type marker are inside; bench and tests not
    for needed in ("accord/jobs/store.py", "accord/schemas/migrations/0001_foundation.sql",
                   "accord/demo/migrations/0001_report.sql", "accord/py.typed"):  # fmt: skip
        assert needed in names
    assert not [n for n in names if n.startswith(("bench/", "tests/", "examples/"))]
    assert any(n.endswith("licenses/LICENSE") for n in names)


def test_an_application_with_its_own_schemas_and_jobs_runs_the_example(
    wheel: Path, tmp_path: Path, pg_admin_dsn: str, amqp_url: str
) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheel),
          "pytest", "pytest-asyncio", "pytest-timeout"])  # fmt: skip
    service = tmp_path / "service"
    (service / "jobs").mkdir(parents=True)
    (service / "schemas.py").write_text(APP_SCHEMAS)
    (service / "jobs" / "__init__.py").write_text(APP_JOBS)
    shutil.copytree(ROOT / "examples", service / "examples",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (service / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV") and not key.startswith("ACCORD_")
    }
    env.update(PYTHONPATH=str(service), TEST_PG_DSN=pg_admin_dsn, TEST_AMQP_URL=amqp_url)
    probe = _run([str(python), "-c", PROBE], cwd=service, env=env)
    accord_file, jobs_file, schemas_file = probe.stdout.split()
    assert accord_file.startswith(str(venv)) and "site-packages" in accord_file
    assert jobs_file == str(service / "jobs" / "__init__.py")
    assert schemas_file == str(service / "schemas.py")
    # the example application's own end-to-end test, its `accord` processes from the venv
    done = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "examples/invoicing/tests"], cwd=service, env=env)  # fmt: skip
    assert " passed" in done.stdout and " failed" not in done.stdout
