"""The import layers of DESIGN.md §1 hold: the composition root > relay | consumers | jobs >
schemas, all inside the one ``accord`` import name.

Checked twice: by import-linter (the CI tool) and by a direct AST scan, whose own
control proves it flags a violation. A third check: nothing imports a boundary module by its
bare folder name (``import jobs``): in a source checkout that would load a second copy of the
module beside ``accord.jobs``, and an installed wheel has no such name at all.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOUNDARIES = ("schemas", "relay", "consumers", "jobs")
# accord.observe (the loops' liveness and flow counters) sits below everything: it imports
# nothing of accord, and every layer may report to it.
ALLOWED: dict[str, set[str]] = {
    "schemas": {"schemas", "observe"},
    "relay": {"relay", "schemas", "observe"},
    "consumers": {"consumers", "schemas", "observe"},
    "jobs": {"jobs", "schemas", "observe"},
}
#: Every folder of the repository that holds Python an application or a test runs.
SOURCE_DIRS = ("accord", "schemas", "relay", "consumers", "jobs", "bench", "tests", "examples")


def _imported(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "accord":  # `from accord import observe` is accord.observe
                names.update(f"accord.{alias.name}" for alias in node.names)
            else:
                names.add(node.module)
    return names


def imported_layers(source: str) -> set[str]:
    """The ``accord.<part>`` parts a module imports (``accord`` alone counts as the root)."""
    parts = set()
    for name in _imported(source):
        pieces = name.split(".")
        if pieces[0] == "accord":
            parts.add(pieces[1] if len(pieces) > 1 else "<root>")
    return parts


def bare_boundary_imports(source: str) -> set[str]:
    return {name for name in _imported(source) if name.split(".")[0] in BOUNDARIES}


def violations() -> list[str]:
    found = []
    for package in BOUNDARIES:
        for path in (ROOT / package).rglob("*.py"):
            layers = imported_layers(path.read_text(encoding="utf-8"))
            bad = layers - ALLOWED[package]
            found.extend(f"{path.relative_to(ROOT)} imports accord.{n}" for n in sorted(bad))
    return found


def bare_imports() -> list[str]:
    found = []
    for folder in SOURCE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            bad = bare_boundary_imports(path.read_text(encoding="utf-8"))
            found.extend(f"{path.relative_to(ROOT)} imports {n}" for n in sorted(bad))
    return found


def test_scanner_flags_a_forbidden_import() -> None:
    # control: the scanner is not a check that cannot fail
    source = "from accord.jobs import store\nimport accord.consumers.inbox\nimport accord"
    assert imported_layers(source) == {"jobs", "consumers", "<root>"}
    assert imported_layers("from accord import observe, app") == {"observe", "app"}
    assert {"relay"} - ALLOWED["jobs"] and not ({"schemas"} - ALLOWED["jobs"])
    assert bare_boundary_imports("from jobs import Store\nimport relay.outbox") == {
        "jobs",
        "relay.outbox",
    }
    assert not bare_boundary_imports("from accord.jobs import Store\nimport jobsite")


def test_no_package_imports_across_its_layer() -> None:
    assert violations() == []


def test_nothing_imports_a_boundary_by_its_bare_folder_name() -> None:
    assert bare_imports() == []


def test_import_linter_contract_holds() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout
