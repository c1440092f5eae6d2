"""deploy/: every metric the alert rules and the Grafana dashboard name is one `/metrics`
serves. A real `accord metrics-serve` over the seeded mix of states is scraped and parsed;
each PromQL expression's identifiers (minus PromQL's own words and label names) must be a
served family, or one of its samples (``_total``, ``_bucket``, ...)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.ops.seed import seed_all

ROOT = Path(__file__).resolve().parents[3]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "accord-dashboard.json"

PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "by", "without", "on", "ignoring", "group_left",
    "group_right", "and", "or", "unless", "bool", "offset", "rate", "irate", "increase",
    "delta", "idelta", "deriv", "histogram_quantile", "abs", "absent", "time", "topk",
    "bottomk", "quantile", "clamp_min", "clamp_max", "le", "inf", "nan",
}  # fmt: skip
_SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers outside label matchers and
    grouping lists, minus PromQL keywords and functions."""
    bare = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)  # grouping labels
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # range selectors
    bare = re.sub(r'"[^"]*"', "", bare)
    found = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return {n for n in found if n.lower() not in PROMQL_WORDS}


def rule_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def panel_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def test_the_identifier_scan_finds_metrics_and_skips_promql() -> None:
    expr = 'histogram_quantile(0.99, sum by (le, consumer) (rate(a_b_bucket{x="y"}[5m]))) > 3'
    assert metric_names(expr) == {"a_b_bucket"}
    assert metric_names("max by (tenant) (t_r) > 0 or sum(delta(p_m[15m])) > 0") == {"t_r", "p_m"}


@pytest.fixture
async def seeded_dsn(pg_dsn: str) -> str:
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=4)
    assert pool is not None
    try:
        await seed_all(pool)
    finally:
        await pool.close()
    return pg_dsn


@pytest.fixture
def served(seeded_dsn: str) -> Iterator[set[str]]:
    pg_dsn = seeded_dsn
    with subprocess.Popen(
        [sys.executable, "-m", "accord", "metrics-serve", "--port", "0"],
        env={**os.environ, "ACCORD_APP": "accord.demo:app", "ACCORD_PG_DSN": pg_dsn},
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
            assert match, line
            with urllib.request.urlopen(match[0], timeout=10) as response:
                text = response.read().decode()
            families = list(text_string_to_metric_families(text))
            names = {f.name for f in families} | {s.name for f in families for s in f.samples}
            yield {f"{n}{suffix}" for n in names for suffix in _SUFFIXES}
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.timeout(90)
def test_every_rule_and_panel_reads_served_metrics(served: set[str]) -> None:
    checked = rule_exprs() + panel_exprs()
    assert len(rule_exprs()) >= 4 and len(panel_exprs()) >= 10
    # control: a name nothing serves is caught
    assert not metric_names("rate(accord_no_such_metric_total[5m])") <= served
    missing = {(where, name) for where, expr in checked for name in metric_names(expr) - served}
    assert not missing, sorted(missing)
    alerts = {name for name, _ in rule_exprs()}
    assert {"AccordUnknownEffectsOld", "AccordRelayLag", "AccordPoisonGrowing",
            "AccordRestoreDetected"} <= alerts  # fmt: skip
