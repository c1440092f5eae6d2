"""The records a worker writes to its journal, and the restart check built on them.

Each record names the claim it was written under (tenant, job id, attempt id, generation), so
the journal alone says which attempt did what. They are wire data: frozen pydantic models,
tolerant of fields a newer minor version adds. :func:`unrecorded_effects` is the check a
worker runs on restart: effects it began whose outcome the database never recorded are the
ones that need reconciliation (the journal outcome, when present, is local evidence for it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from jobs.runner.errors import JournalRecordInvalid


class RecordType(StrEnum):
    CLAIM = "claim"
    EFFECT_BEGIN = "effect_begin"
    EFFECT_OUTCOME = "effect_outcome"
    PUBLISH = "publish"


class EffectResult(StrEnum):
    """How an effect ended, as the worker saw it (DESIGN §7: anything not explicit is unknown)."""

    SUCCESS = "success"
    FAILED_BEFORE_DISPATCH = "failed_before_dispatch"
    UNKNOWN = "unknown"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    tenant: str = Field(min_length=1)
    job_id: str = Field(min_length=1)
    attempt_id: str = Field(min_length=1)
    generation: int = Field(ge=0)


class Claim(_Record):
    """The worker claimed ``job_id`` as ``attempt_id`` at ``generation``."""

    type: Literal[RecordType.CLAIM] = RecordType.CLAIM


class EffectBegin(_Record):
    """Written (and fsynced) after the database recorded the effect pending, before dispatch."""

    type: Literal[RecordType.EFFECT_BEGIN] = RecordType.EFFECT_BEGIN
    effect_key: str = Field(min_length=1)
    idempotency_key: str | None = None


class EffectOutcome(_Record):
    """What dispatching the effect returned: a receipt on success, else why not."""

    type: Literal[RecordType.EFFECT_OUTCOME] = RecordType.EFFECT_OUTCOME
    effect_key: str = Field(min_length=1)
    outcome: EffectResult
    receipt: str | None = None
    detail: str | None = None


class Publish(_Record):
    """The worker published the job's result (``object_key`` names the result object, if any)."""

    type: Literal[RecordType.PUBLISH] = RecordType.PUBLISH
    object_key: str | None = None


JournalRecord = Annotated[
    Claim | EffectBegin | EffectOutcome | Publish, Field(discriminator="type")
]
_ADAPTER: TypeAdapter[Claim | EffectBegin | EffectOutcome | Publish] = TypeAdapter(JournalRecord)


def parse_record(record: Mapping[str, Any]) -> Claim | EffectBegin | EffectOutcome | Publish:
    """The typed record for a journal payload; JournalRecordInvalid if it is not one."""
    try:
        return _ADAPTER.validate_python(dict(record))
    except ValidationError as exc:
        raise JournalRecordInvalid(
            type=record.get("type"), errors=exc.error_count(), detail=str(exc.errors()[0]["msg"])
        ) from exc


@dataclass(frozen=True, slots=True)
class EffectRef:
    """One dispatch of an effect: the effect key within its job, under one attempt."""

    job_id: str
    effect_key: str
    attempt_id: str


@dataclass(frozen=True, slots=True)
class UnrecordedEffect:
    """An effect begun in the journal whose outcome the database does not hold."""

    begin: EffectBegin
    # The outcome the journal recorded after that begin, if any: local evidence, not authority.
    journal_outcome: EffectOutcome | None

    @property
    def ref(self) -> EffectRef:
        return EffectRef(self.begin.job_id, self.begin.effect_key, self.begin.attempt_id)


def unrecorded_effects(
    records: Iterable[Mapping[str, Any]], recorded: Collection[EffectRef]
) -> list[UnrecordedEffect]:
    """Effects begun in ``records`` whose outcome is not in ``recorded``, in journal order.

    Pure. ``recorded`` holds the refs whose outcome the database holds (any outcome,
    including unknown). When one ref was begun several times (a retry after
    failed-before-dispatch), only its last begin counts, with the outcome written after it.
    Records of other types are skipped; a malformed effect record raises JournalRecordInvalid.
    """
    begun: dict[EffectRef, UnrecordedEffect] = {}
    effect_types = {RecordType.EFFECT_BEGIN.value, RecordType.EFFECT_OUTCOME.value}
    for raw in records:
        if raw.get("type") not in effect_types:
            continue
        record = parse_record(raw)
        if isinstance(record, EffectBegin):
            ref = EffectRef(record.job_id, record.effect_key, record.attempt_id)
            begun.pop(ref, None)  # a later begin moves the ref to the end (journal order)
            begun[ref] = UnrecordedEffect(record, None)
        elif isinstance(record, EffectOutcome):
            ref = EffectRef(record.job_id, record.effect_key, record.attempt_id)
            if ref in begun:
                begun[ref] = UnrecordedEffect(begun[ref].begin, record)
    return [entry for ref, entry in begun.items() if ref not in recorded]
