"""Typed journal records and the restart check for effects the database never recorded."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord.jobs.errors import JournalRecordInvalid
from accord.jobs.framing import Journal, scan_journal
from accord.jobs.models import EffectState
from accord.jobs.runner.journal import RunnerJournal
from accord.jobs.runner.journal_records import (
    Begun,
    Claim,
    EffectBegin,
    EffectOutcome,
    EffectRef,
    Publish,
    RecordType,
    parse_record,
    unrecorded_effects,
)

ATTEMPT = uuid.uuid4()
ATTEMPTS = (ATTEMPT, uuid.uuid4())  # two attempts that began the same refs (ids rewound)
IDS: dict[str, Any] = {"tenant": "t1", "job_id": 7, "attempt_id": ATTEMPT, "generation": 3}


def begin(key: str, seq: int = 1) -> dict[str, Any]:
    return EffectBegin(**IDS, effect_key=key, seq=seq).model_dump(mode="json")


def outcome(key: str, result: EffectState, seq: int = 1) -> dict[str, Any]:
    rec = EffectOutcome(**IDS, effect_key=key, seq=seq, outcome=result)
    return rec.model_dump(mode="json")


def done(key: str, seq: int = 1) -> Begun:
    """``begin(key, seq)``'s identity: what the database recorded, when it did."""
    return Begun(EffectRef(7, key, seq), str(ATTEMPT))


def test_records_round_trip_through_the_journal(tmp_path: Path) -> None:
    records = [
        Claim(**IDS),
        EffectBegin(**IDS, effect_key="op-1:send", seq=1, idempotency_key="k-1"),
        EffectOutcome(
            **IDS, effect_key="op-1:send", seq=1, outcome=EffectState.SUCCEEDED, receipt="r-9"
        ),
        Publish(**IDS, object_key="sha256-" + "0" * 64),
    ]
    with Journal.open(tmp_path / "j", "r") as j:
        for record in records:
            j.append(record)
    raw = scan_journal(tmp_path / "j").records
    assert [r["type"] for r in raw] == [t.value for t in RecordType]
    assert [parse_record(r) for r in raw] == records


def test_parse_is_tolerant_of_new_fields_and_strict_on_shape() -> None:
    wire = {**IDS, "attempt_id": str(ATTEMPT)}
    good = {**wire, "type": "claim", "added_in_v1_1": True}
    assert parse_record(good) == Claim(**IDS)  # control
    effect = {**wire, "type": "effect_outcome", "effect_key": "k", "seq": 1}
    assert parse_record({**effect, "outcome": "unknown"}).type == "effect_outcome"  # control
    for bad in (
        {**wire, "type": "nope"},
        {**wire},
        {**wire, "type": "claim", "generation": -1},
        {**wire, "type": "claim", "attempt_id": "not-a-uuid"},
        {**effect, "outcome": "maybe"},
        {**effect, "outcome": "pending"},
        {**effect, "outcome": "unknown", "seq": 0},
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
        outcome("a", EffectState.SUCCEEDED),
        begin("b"),
        begin("c"),
        outcome("c", EffectState.UNKNOWN),
        {"type": "something_newer", "x": 1},
    ]
    # Control: the database recorded every outcome, so nothing is reported.
    everything = {done(k) for k in "abc"}
    assert unrecorded_effects(records, everything) == []
    # The database recorded only "a": "b" (no local outcome) and "c" (local unknown) remain.
    found = unrecorded_effects(records, {done("a")})
    assert [(f.ref.effect_key, f.journal_outcome) for f in found] == [
        ("b", None),
        ("c", parse_record(records[5])),
    ]


def test_each_begin_of_a_key_is_its_own_effect() -> None:
    records = [
        begin("a", seq=1),
        outcome("a", EffectState.FAILED_BEFORE_DISPATCH, seq=1),
        begin("a", seq=2),  # the retry after failed-before-dispatch
    ]
    found = unrecorded_effects(records, {done("a")})
    assert [(f.ref, f.journal_outcome) for f in found] == [(EffectRef(7, "a", 2), None)]
    assert unrecorded_effects(records, {done("a"), done("a", seq=2)}) == []


def test_two_attempts_begins_of_one_ref_are_each_reported_with_their_own_outcome() -> None:
    """A restore that rewinds job ids lets a new attempt begin the ref an old attempt's
    begin names. Before, the first begin stood for both: the second was never reported."""
    other = {**IDS, "attempt_id": uuid.uuid4()}
    records = [
        begin("a"),
        outcome("a", EffectState.SUCCEEDED),
        EffectBegin(**other, effect_key="a", seq=1).model_dump(mode="json"),
    ]
    theirs = Begun(EffectRef(7, "a", 1), str(other["attempt_id"]))
    # control: both recorded, each on its own attempt's row
    assert unrecorded_effects(records, {done("a"), theirs}) == []
    found = unrecorded_effects(records, {done("a")})
    assert [(f.begun, f.journal_outcome) for f in found] == [(theirs, None)]
    found = unrecorded_effects(records, {theirs})
    assert [(f.begun, f.journal_outcome) for f in found] == [(done("a"), parse_record(records[1]))]


def test_unrecorded_effects_rejects_malformed_effect_records() -> None:
    with pytest.raises(JournalRecordInvalid):
        unrecorded_effects([{"type": "effect_begin", "job_id": 7}], set())


def _effect_record(
    kind: str, job_id: int, seq: int, n: int, attempt: uuid.UUID = ATTEMPT
) -> dict[str, Any]:
    ids = {**IDS, "job_id": job_id, "attempt_id": attempt}
    if kind == "begin":
        return EffectBegin(**ids, effect_key="k", seq=seq, idempotency_key=f"i{n}").model_dump(
            mode="json"
        )
    result = (EffectState.SUCCEEDED, EffectState.UNKNOWN)[n % 2]
    return EffectOutcome(
        **ids, effect_key="k", seq=seq, outcome=result, receipt=f"r{n}"
    ).model_dump(mode="json")


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_rotations_keep_every_answer_of_the_restart_check(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    # Whatever was written and however often the journal rotated, the live segment gives the
    # restart check the same answer as the whole history would have, as long as the
    # database only ever adds recorded outcomes (it never forgets one).
    path = tmp_path_factory.mktemp("rot") / "w.journal"
    refs = st.tuples(st.integers(1, 4), st.integers(1, 2), st.sampled_from(ATTEMPTS))
    steps = data.draw(
        st.lists(st.tuples(st.sampled_from(["begin", "outcome", "claim", "rotate"]), refs))
    )
    history: list[dict[str, Any]] = []
    recorded: set[Begun] = set()
    with RunnerJournal.open(path, "r", segment_bytes=1 << 20) as journal:
        for n, (kind, (job_id, seq, attempt)) in enumerate(steps):
            if kind == "rotate":
                drawn = data.draw(st.sets(refs))
                recorded |= {Begun(EffectRef(j, "k", s), str(a)) for j, s, a in drawn}
                anyio.run(journal.rotate, frozenset(recorded))
                continue
            if kind == "claim":
                record = Claim(**{**IDS, "job_id": job_id}).model_dump(mode="json")
            else:
                record = _effect_record(kind, job_id, seq, n, attempt)
            journal.append(record)
            history.append(record)
    live = scan_journal(path).records
    assert unrecorded_effects(live, recorded) == unrecorded_effects(history, recorded)
