"""The records a worker writes to its journal, and the restart check built on them.

Each record names the claim it was written under (tenant, job id, attempt id, generation), so
the journal alone says which attempt did what; effect records also carry the ``seq`` of their
``jobs.effects`` row, so ``(job_id, effect_key, seq)`` names one begin exactly as the database
does, and outcomes use the database's own :class:`jobs.models.EffectState`. They are wire
data: frozen pydantic models, tolerant of fields a newer minor version adds.
:func:`unrecorded_effects` is the check a worker runs on restart: effects it began whose
outcome the database never recorded are the ones that need reconciliation (the journal
outcome, when present, is local evidence for it).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from accord.jobs.errors import JournalRecordInvalid
from accord.jobs.models import EffectState


class RecordType(StrEnum):
    CLAIM = "claim"
    EFFECT_BEGIN = "effect_begin"
    EFFECT_OUTCOME = "effect_outcome"
    PUBLISH = "publish"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    tenant: str = Field(min_length=1)
    job_id: int = Field(ge=1)
    attempt_id: uuid.UUID
    generation: int = Field(ge=0)


class Claim(_Record):
    """The worker claimed ``job_id`` as ``attempt_id`` at ``generation``."""

    type: Literal[RecordType.CLAIM] = RecordType.CLAIM


class EffectBegin(_Record):
    """Written (and fsynced) after the database recorded the effect pending, before dispatch."""

    type: Literal[RecordType.EFFECT_BEGIN] = RecordType.EFFECT_BEGIN
    effect_key: str = Field(min_length=1)
    seq: int = Field(ge=1)  # the begin's number within (job, effect key): jobs.effects.seq
    idempotency_key: str | None = None
    intent_digest: str | None = None


class EffectOutcome(_Record):
    """What dispatching the effect returned: a receipt on success, else why not. With
    ``reused`` the attempt dispatched nothing: ``seq`` names the record an earlier attempt
    finished ``succeeded`` (a job the repair role resumed), whose receipt this attempt used."""

    type: Literal[RecordType.EFFECT_OUTCOME] = RecordType.EFFECT_OUTCOME
    effect_key: str = Field(min_length=1)
    seq: int = Field(ge=1)
    outcome: EffectState
    receipt: str | None = None
    detail: str | None = None
    reused: bool = False

    @field_validator("outcome")
    @classmethod
    def _finished(cls, value: EffectState) -> EffectState:
        if value is EffectState.PENDING:
            raise ValueError("an outcome is never pending")
        return value


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
    """One begin of an effect: the primary key of its ``jobs.effects`` row."""

    job_id: int
    effect_key: str
    seq: int


@dataclass(frozen=True, slots=True)
class Begun:
    """One begin record's identity: the effect row it began and the attempt that began it
    (None when the record names none it can be read as). Two attempts can begin the same
    row's key, when a restore rewinds the job ids and a new job takes an old one's id: each
    begin is its own evidence, recorded only on the row its own attempt began."""

    ref: EffectRef
    attempt_id: str | None


@dataclass(frozen=True, slots=True)
class UnrecordedEffect:
    """An effect begun in the journal whose outcome the database does not hold."""

    begin: EffectBegin
    # The outcome the journal recorded after that begin, if any: local evidence, not authority.
    journal_outcome: EffectOutcome | None
    # Its note in jobs.journal_evidence (0054) when its attempt began no row in the database
    # (a restore's evidence, kept until a person acknowledges it), else None.
    evidence_id: int | None = None

    @property
    def ref(self) -> EffectRef:
        return EffectRef(self.begin.job_id, self.begin.effect_key, self.begin.seq)

    @property
    def begun(self) -> Begun:
        return begun_of(self.begin)


def begun_of(record: EffectBegin | EffectOutcome) -> Begun:
    """The begin an effect record is (or, an outcome, belongs to)."""
    ref = EffectRef(record.job_id, record.effect_key, record.seq)
    return Begun(ref, str(record.attempt_id))


def unrecorded_effects(
    records: Iterable[Mapping[str, Any]], recorded: Collection[Begun]
) -> list[UnrecordedEffect]:
    """Effects begun in ``records`` whose outcome is not in ``recorded``, in journal order.

    Pure. ``recorded`` holds the begins whose ``jobs.effects`` row, the one their own attempt
    began, is no longer ``pending`` (any outcome, including unknown). An outcome belongs to
    the begin of its own attempt; two attempts' begins of one ref are two entries. Records of
    other types are skipped; a malformed effect record raises JournalRecordInvalid.
    """
    begun: dict[Begun, UnrecordedEffect] = {}
    effect_types = {RecordType.EFFECT_BEGIN.value, RecordType.EFFECT_OUTCOME.value}
    for raw in records:
        if raw.get("type") not in effect_types:
            continue
        record = parse_record(raw)
        if isinstance(record, EffectBegin):
            begun.setdefault(begun_of(record), UnrecordedEffect(record, None))
        elif isinstance(record, EffectOutcome) and (key := begun_of(record)) in begun:
            begun[key] = UnrecordedEffect(begun[key].begin, record)
    return [entry for key, entry in begun.items() if key not in recorded]
