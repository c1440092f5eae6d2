"""The worker loop, effect execution and the append-only runner journal."""

from accord.jobs.errors import (
    JournalBroken,
    JournalCorrupt,
    JournalError,
    JournalHeaderInvalid,
    JournalLocked,
    JournalRecordInvalid,
    JournalRunnerMismatch,
    JournalTornTail,
    JournalUnavailable,
    ObjectCorrupt,
    ObjectKeyInvalid,
    ObjectNotFound,
    ObjectStoreError,
)
from accord.jobs.framing import Defect, Journal, JournalScan, Repair, Tail, scan_journal
from accord.jobs.runner.config import Handler, Registered, WorkerConfig
from accord.jobs.runner.context import EffectCall, JobContext
from accord.jobs.runner.effects import (
    EffectOutcomeError,
    EffectUnknown,
    FailedBeforeDispatch,
    Success,
    intent_digest,
)
from accord.jobs.runner.endings import Ending, Finished, WorkerStats
from accord.jobs.runner.journal_records import (
    Claim,
    EffectBegin,
    EffectOutcome,
    EffectRef,
    Publish,
    RecordType,
    UnrecordedEffect,
    parse_record,
    unrecorded_effects,
)
from accord.jobs.runner.objects import LocalDirStore, ObjectInfo, ObjectStore, collect_garbage
from accord.jobs.runner.recovery import open_journal, report_unrecorded
from accord.jobs.runner.worker import Worker

__all__: list[str] = [
    "Claim",
    "Defect",
    "EffectBegin",
    "EffectCall",
    "EffectOutcome",
    "EffectOutcomeError",
    "EffectRef",
    "EffectUnknown",
    "Ending",
    "FailedBeforeDispatch",
    "Finished",
    "Handler",
    "JobContext",
    "Journal",
    "JournalBroken",
    "JournalCorrupt",
    "JournalError",
    "JournalHeaderInvalid",
    "JournalLocked",
    "JournalRecordInvalid",
    "JournalRunnerMismatch",
    "JournalScan",
    "JournalTornTail",
    "JournalUnavailable",
    "LocalDirStore",
    "ObjectCorrupt",
    "ObjectInfo",
    "ObjectKeyInvalid",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "Publish",
    "RecordType",
    "Registered",
    "Repair",
    "Success",
    "Tail",
    "UnrecordedEffect",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "collect_garbage",
    "intent_digest",
    "open_journal",
    "parse_record",
    "report_unrecorded",
    "scan_journal",
    "unrecorded_effects",
]
