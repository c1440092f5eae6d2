"""Typed journal records and the restart check for effects the database never recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.runner.errors import JournalRecordInvalid
from jobs.runner.journal import Journal, scan_journal
from jobs.runner.journal_records import (
    Claim,
    EffectBegin,
    EffectOutcome,
    EffectRef,
    EffectResult,
    Publish,
    RecordType,
    parse_record,
    unrecorded_effects,
)

IDS: dict[str, Any] = {"tenant": "t1", "job_id": "j1", "attempt_id": "a1", "generation": 3}


def begin(key: str, attempt: str = "a1", job: str = "j1") -> dict[str, Any]:
    rec = EffectBegin(**{**IDS, "attempt_id": attempt, "job_id": job}, effect_key=key)
    return rec.model_dump(mode="json")


def outcome(key: str, result: EffectResult, attempt: str = "a1") -> dict[str, Any]:
    rec = EffectOutcome(**{**IDS, "attempt_id": attempt}, effect_key=key, outcome=result)
    return rec.model_dump(mode="json")


def test_records_round_trip_through_the_journal(tmp_path: Path) -> None:
    records = [
        Claim(**IDS),
        EffectBegin(**IDS, effect_key="op-1:send", idempotency_key="k-1"),
        EffectOutcome(**IDS, effect_key="op-1:send", outcome=EffectResult.SUCCESS, receipt="r-9"),
        Publish(**IDS, object_key="sha256-" + "0" * 64),
    ]
    with Journal.open(tmp_path / "j", "r") as j:
        for record in records:
            j.append(record)
    raw = scan_journal(tmp_path / "j").records
    assert [r["type"] for r in raw] == [t.value for t in RecordType]
    assert [parse_record(r) for r in raw] == records


def test_parse_is_tolerant_of_new_fields_and_strict_on_shape() -> None:
    good = {**IDS, "type": "claim", "added_in_v1_1": True}
    assert parse_record(good) == Claim(**IDS)  # control
    for bad in (
        {**IDS, "type": "nope"},
        {**IDS},
        {**IDS, "type": "claim", "generation": -1},
        {**IDS, "type": "claim", "job_id": ""},
        {**IDS, "type": "effect_outcome", "effect_key": "k", "outcome": "maybe"},
    ):
        with pytest.raises(JournalRecordInvalid):
            parse_record(bad)


def test_records_are_frozen() -> None:
    claim = Claim(**IDS)
    with pytest.raises(ValueError):
        claim.generation = 4  # type: ignore[misc]


def test_unrecorded_effects_reports_begun_effects_the_database_lacks() -> None:
    records = [
        Claim(**IDS).model_dump(mode="json"),
        begin("a"),
        outcome("a", EffectResult.SUCCESS),
        begin("b"),
        begin("c"),
        outcome("c", EffectResult.UNKNOWN),
        {"type": "something_newer", "x": 1},
    ]
    # Control: the database recorded every outcome, so nothing is reported.
    everything = {EffectRef("j1", k, "a1") for k in "abc"}
    assert unrecorded_effects(records, everything) == []
    # The database recorded only "a": "b" (no local outcome) and "c" (local unknown) remain.
    found = unrecorded_effects(records, {EffectRef("j1", "a", "a1")})
    assert [(f.ref.effect_key, f.journal_outcome) for f in found] == [
        ("b", None),
        ("c", parse_record(records[5])),
    ]


def test_a_retried_begin_counts_once_with_only_its_own_outcome() -> None:
    records = [
        begin("a"),
        outcome("a", EffectResult.FAILED_BEFORE_DISPATCH),
        begin("b"),
        begin("a"),  # retry after failed-before-dispatch, same attempt
    ]
    found = unrecorded_effects(records, set())
    assert [(f.ref.effect_key, f.journal_outcome) for f in found] == [("b", None), ("a", None)]
    # Another attempt of the same effect key is a different dispatch.
    found = unrecorded_effects([begin("a"), begin("a", attempt="a2")], {EffectRef("j1", "a", "a1")})
    assert [f.ref for f in found] == [EffectRef("j1", "a", "a2")]


def test_unrecorded_effects_rejects_malformed_effect_records() -> None:
    with pytest.raises(JournalRecordInvalid):
        unrecorded_effects([{"type": "effect_begin", "job_id": "j1"}], set())
