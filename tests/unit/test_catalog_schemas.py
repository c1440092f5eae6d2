"""Pin the exported JSON Schema of every registered (type, version).

Evolution rules (schemas/events.py): within a version only additive, optional fields;
anything else is a new version. An incompatible edit to a registered model changes its
exported schema and fails here; a deliberate additive edit also fails until its pin is
updated on purpose. To re-pin after a reviewed change:

    .venv/bin/python -c "import tests.unit.test_catalog_schemas as t; t.repin()"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from accord.demo.catalog import ReportAcceptedV1, demo_catalog
from accord.schemas.events import Catalog, Event, EventType

PINNED = Path(__file__).parent / "pinned_schemas"


def exported(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def pinned(ce_type: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((PINNED / f"{ce_type}.json").read_text())
    return loaded


def repin() -> None:
    for entry in demo_catalog():
        text = json.dumps(exported(entry.model), indent=2, sort_keys=True) + "\n"
        (PINNED / f"{entry.ce_type}.json").write_text(text)


def additive_only(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """True when ``new`` only adds optional properties to ``old`` (the within-version rule)."""
    old_props, new_props = old.get("properties", {}), new.get("properties", {})
    kept = all(new_props.get(name) == spec for name, spec in old_props.items())
    same_required = set(old.get("required", [])) == set(new.get("required", []))
    return kept and same_required


def test_every_registered_version_has_a_pin_and_nothing_else_does() -> None:
    registered = {entry.ce_type for entry in demo_catalog()}
    assert registered == {path.stem for path in PINNED.glob("*.json")}


@pytest.mark.parametrize("entry", list(demo_catalog()), ids=lambda e: e.ce_type)
def test_exported_schema_matches_its_pin(entry: EventType) -> None:
    assert exported(entry.model) == pinned(entry.ce_type), (
        f"{entry.ce_type} changed: additive optional fields only within a version "
        "(then re-pin on purpose); anything else needs a new version"
    )


class ReportAcceptedV1Newer(ReportAcceptedV1):
    """A newer producer's v1: one new optional field (allowed within v1)."""

    model_config = ConfigDict(frozen=True)
    locale: str | None = None


class ReportAcceptedRemoved(BaseModel):
    model_config = ConfigDict(frozen=True)
    report_id: str = Field(min_length=1, max_length=128)


class ReportAcceptedRetyped(BaseModel):
    model_config = ConfigDict(frozen=True)
    report_id: int
    subject: str = Field(min_length=1, max_length=2000)
    priority: int | None = Field(default=None, ge=0, le=9)


def test_additive_optional_field_is_read_tolerantly_by_an_older_consumer() -> None:
    old = pinned("report.accepted.v1")
    assert additive_only(old, exported(ReportAcceptedV1Newer))
    assert exported(ReportAcceptedV1Newer) != old  # still a deliberate re-pin
    newer_payload = {"report_id": "r1", "subject": "s", "locale": "de"}
    newer = Catalog([EventType("report.accepted", 1, ReportAcceptedV1Newer)])
    event = Event(
        tenant="a", operation_id="o", type="report.accepted", version=1, payload=newer_payload
    )
    newer.validate(event, producing=True)  # the newer producer accepts its own field
    older = demo_catalog()
    model = older.validate(event, producing=False)  # tolerant reading ignores it
    assert isinstance(model, ReportAcceptedV1) and model.report_id == "r1"
    with pytest.raises(Exception, match="fails its catalog model"):
        older.validate(event, producing=True)  # producing stays strict


@pytest.mark.parametrize(
    "model", [ReportAcceptedRemoved, ReportAcceptedRetyped], ids=["removed", "retyped"]
)
def test_removed_or_retyped_field_changes_the_pin_and_is_not_additive(
    model: type[BaseModel],
) -> None:
    old = pinned("report.accepted.v1")
    assert exported(model) != old
    assert not additive_only(old, exported(model))
