"""The import layers of DESIGN.md §1 hold: accord > relay | consumers | jobs > schemas.

Checked twice: by import-linter (the CI tool) and by a direct AST scan, whose own
control proves it flags a violation.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "relay", "consumers", "jobs", "accord")
ALLOWED: dict[str, set[str]] = {
    "schemas": {"schemas"},
    "relay": {"relay", "schemas"},
    "consumers": {"consumers", "schemas"},
    "jobs": {"jobs", "schemas"},
    "accord": set(PACKAGES),
}


def imported_roots(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots & set(PACKAGES)


def violations() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            bad = imported_roots(path.read_text(encoding="utf-8")) - ALLOWED[package]
            found.extend(f"{path.relative_to(ROOT)} imports {name}" for name in sorted(bad))
    return found


def test_scanner_flags_a_forbidden_import() -> None:
    # control: the scanner is not a check that cannot fail
    assert imported_roots("from jobs import store\nimport consumers.inbox") == {"jobs", "consumers"}
    assert not ({"jobs"} - ALLOWED["jobs"]) and ({"relay"} - ALLOWED["jobs"])


def test_no_package_imports_across_its_layer() -> None:
    assert violations() == []


def test_import_linter_contract_holds() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    done = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout
