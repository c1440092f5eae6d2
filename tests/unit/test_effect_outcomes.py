"""Effect outcome classification and the intent digest (no services)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.jobs.errors import EffectIntentInvalid, ReceiptInvalid
from accord.jobs.models import EffectState, Lease
from accord.jobs.runner.effects import (
    MAX_DETAIL_CHARS,
    MAX_RECEIPT_CHARS,
    FailedBeforeDispatch,
    Success,
    check_receipt,
    classify_error,
    classify_result,
    idempotency_key,
    intent_digest,
)


def lease(**changes: object) -> Lease:
    fields: dict[str, object] = {
        "job_id": 1,
        "tenant": "acme",
        "workflow": "report",
        "operation_id": "report:r1",
        "owner": "w",
        "attempt_id": uuid.uuid4(),
        "generation": 1,
        "epoch": 1,
        "lease_expires_at": datetime.now(UTC),
    }
    fields.update(changes)
    return Lease(**fields)  # type: ignore[arg-type]


def test_only_explicit_outcomes_stay_themselves() -> None:
    assert classify_result(Success("r")).state is EffectState.SUCCEEDED
    assert classify_result(Success("r")).receipt == "r"
    fbd = FailedBeforeDispatch(reason="refused")
    assert classify_result(fbd).state is EffectState.FAILED_BEFORE_DISPATCH
    assert classify_error(fbd).detail == "refused"
    for other in (None, True, "ok", {"receipt": "r"}):
        assert classify_result(other).state is EffectState.UNKNOWN
    for exc in (ValueError(), TimeoutError(), asyncio.CancelledError(), OSError()):
        assert classify_error(exc).state is EffectState.UNKNOWN


def test_a_receipt_is_a_bounded_string_and_a_detail_is_cut() -> None:
    for fine in (None, "", "r" * MAX_RECEIPT_CHARS, "reçu-✓"):
        check_receipt(fine)
    # not a string, too long, a NUL (PostgreSQL's text refuses it), a lone surrogate
    for bad in (123, b"bytes", "r" * (MAX_RECEIPT_CHARS + 1), "a\x00b", "a\ud800b"):
        with pytest.raises(ReceiptInvalid):
            check_receipt(bad)
    # a FailedBeforeDispatch's reason is descriptive: kept to its first MAX_DETAIL_CHARS
    long = FailedBeforeDispatch(reason="x" * (MAX_DETAIL_CHARS * 3))
    assert classify_error(long).detail == "x" * MAX_DETAIL_CHARS


def test_intent_digest_binds_meaning_not_attempt() -> None:
    one = intent_digest(lease(), "k", {"a": 1, "b": [1, 2]})
    # another attempt, generation and epoch of the same operation: same digest
    assert one == intent_digest(lease(generation=7, epoch=3), "k", {"b": [1, 2], "a": 1})
    assert one != intent_digest(lease(), "k", {"a": 2, "b": [1, 2]})
    assert one != intent_digest(lease(), "k2", {"a": 1, "b": [1, 2]})
    assert one != intent_digest(lease(tenant="other"), "k", {"a": 1, "b": [1, 2]})
    with pytest.raises(EffectIntentInvalid):
        intent_digest(lease(), "k", {"x": float("nan")})


def test_idempotency_key_is_stable_and_unambiguous() -> None:
    assert idempotency_key(lease(), "k") == idempotency_key(lease(generation=9), "k")
    assert idempotency_key(lease(operation_id="a:b"), "c") != idempotency_key(
        lease(operation_id="a"), "b:c"
    )


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), _VALUES, max_size=5), st.text(min_size=1))
def test_intent_digests_and_keys_are_rfc8785s_bytes(intent: dict[str, Any], key: str) -> None:
    """The digests and keys written by earlier versions (rfc8785.dumps) still match: a
    resumed job compares its intent digest with the recorded one, and a provider dedupes on
    the key."""
    held = lease(operation_id="op:é")
    document = {
        "tenant": held.tenant,
        "workflow": held.workflow,
        "operation_id": held.operation_id,
        "effect_key": key,
        "intent": intent,
    }
    assert intent_digest(held, key, intent) == hashlib.sha256(rfc8785.dumps(document)).hexdigest()
    triple = [held.tenant, held.workflow, held.operation_id, key]
    expected = "accord-" + hashlib.sha256(rfc8785.dumps(triple)).hexdigest()[:40]
    assert idempotency_key(held, key) == expected
