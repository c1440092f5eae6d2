"""Nothing below the composition root names an application: ``schemas/``, ``relay/``,
``consumers/`` and ``jobs/`` know no demo type, class, table, provider or setting (the demo
is one application among others, declared in accord/demo)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOUNDARIES = ("schemas", "relay", "consumers", "jobs")
DEMO_NAMES = re.compile(
    r"demo|report\.accepted|report\.published|report_projection|create_report|ReportAccepted"
    r"|ReportPublished|provider_url",
    re.IGNORECASE,
)


def demo_names(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*")):
        if path.suffix not in (".py", ".sql") or "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DEMO_NAMES.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_the_scan_finds_the_demo_where_it_lives() -> None:
    assert demo_names(ROOT / "accord" / "demo")  # control: the scan is not blind


def test_no_boundary_module_names_the_demo() -> None:
    assert [hit for b in BOUNDARIES for hit in demo_names(ROOT / b)] == []
