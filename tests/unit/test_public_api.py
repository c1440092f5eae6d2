"""Pin each package's public ``__all__``: changing the public surface is a deliberate edit."""

from __future__ import annotations

import importlib

import pytest

EXPECTED: dict[str, set[str]] = {
    "schemas": {
        "AccordError",
        "Catalog",
        "Event",
        "EventType",
        "Inbound",
        "Topology",
        "WireMessage",
        "WorkflowQueue",
        "ConfigError",
        "EventError",
        "InvalidEvent",
        "MalformedMessage",
        "MigrationError",
        "MigrationTampered",
        "NotInTransaction",
        "PayloadTooLarge",
        "SchemaAhead",
        "SchemaBehind",
        "ServiceUnavailable",
        "Settings",
        "UnknownEventType",
    },
    "relay": set(),
    "consumers": set(),
    "jobs": {
        "Callback",
        "Cancellation",
        "Effect",
        "EffectAlreadyBegun",
        "EffectConflict",
        "EffectError",
        "EffectNotPending",
        "EffectState",
        "EffectsDisabled",
        "EffectsUnresolved",
        "FenceLost",
        "Health",
        "InvalidLeaseLength",
        "JobConflict",
        "JobNotFound",
        "JobState",
        "JobView",
        "JobsError",
        "Lease",
        "Registration",
        "RegistrationError",
        "RescueReport",
        "Rescued",
        "Store",
        "Submitted",
        "WorkflowNotDrained",
        "WorkflowNotRegistered",
        "WorkflowOwnedElsewhere",
        "locked",
        "submit",
    },
    "jobs.runner": {
        "Claim",
        "Defect",
        "EffectBegin",
        "EffectOutcome",
        "EffectRef",
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
        "LocalDirStore",
        "ObjectCorrupt",
        "ObjectInfo",
        "ObjectKeyInvalid",
        "ObjectNotFound",
        "ObjectStore",
        "ObjectStoreError",
        "Publish",
        "RecordType",
        "Repair",
        "Tail",
        "UnrecordedEffect",
        "collect_garbage",
        "parse_record",
        "scan_journal",
        "unrecorded_effects",
    },
    "accord": set(),
}


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_public_all_is_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == EXPECTED[package]
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ names missing {name}"
