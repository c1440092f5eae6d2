"""Effect outcomes as a handler's call reports them, and how the runner classifies them.

An effect call (``JobContext.effect``) ends in exactly one of three recorded outcomes
(DESIGN.md §7): only an explicit :class:`Success` (returned) or :class:`FailedBeforeDispatch`
(returned or raised) stays itself; anything else (another exception, another return value,
a timeout, a cancellation) becomes ``unknown``, because the runner cannot tell whether the
request left. The handler then sees :class:`EffectUnknown`.

::

    AccordError
    └── EffectOutcomeError       an effect did not end in a success
        ├── FailedBeforeDispatch nothing was dispatched: the same key may begin again
        └── EffectUnknown        the request may have been dispatched: reconcile, never redo

The intent digest binds what the effect *means*: SHA-256 over RFC 8785 canonical JSON of the
tenant, workflow class, operation id, effect key and the handler's intent mapping. It leaves
out attempt, generation and authority epoch, so a retry after ``failed_before_dispatch`` in
a later attempt carries the same digest, while a changed intent is an ``EffectConflict``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785

from accord.jobs.errors import EffectIntentInvalid, ReceiptInvalid
from accord.jobs.models import EffectState, Lease
from accord.schemas import canonical
from accord.schemas.errors import AccordError

#: The longest receipt a Success takes, in characters: the database records it and the
#: journal keeps it in a frame of at most 1 MiB (jobs.framing.MAX_PAYLOAD), whatever the
#: characters' encoding (six bytes for an escaped one, at most).
MAX_RECEIPT_CHARS = 64 * 1024
#: The longest detail an outcome keeps (a FailedBeforeDispatch's reason), in characters.
MAX_DETAIL_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Success:
    """The call's explicit success, with the external receipt (the provider's proof): a
    string of at most MAX_RECEIPT_CHARS that the database and the journal can hold, or None
    (``check_receipt``: a call returning any other is recorded unknown)."""

    receipt: str | None = None


def check_receipt(receipt: object) -> None:
    """ReceiptInvalid unless ``receipt`` is None or a string the database and the journal
    can keep: at most MAX_RECEIPT_CHARS, no NUL (PostgreSQL's text refuses it), valid
    Unicode (no lone surrogate)."""
    if receipt is None:
        return
    if not isinstance(receipt, str):
        raise ReceiptInvalid(type=type(receipt).__name__, limit=MAX_RECEIPT_CHARS)
    if len(receipt) > MAX_RECEIPT_CHARS:
        raise ReceiptInvalid(type="str", length=len(receipt), limit=MAX_RECEIPT_CHARS)
    if "\x00" in receipt or (not receipt.isascii() and not _encodes(receipt)):
        raise ReceiptInvalid(type="str", detail="a NUL or a lone surrogate")


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class EffectOutcomeError(AccordError):
    """The effect did not end in a success."""

    reason = "effect_outcome"


class FailedBeforeDispatch(EffectOutcomeError):
    """The effect failed before anything was dispatched; it may begin again."""

    reason = "failed_before_dispatch"


class EffectUnknown(EffectOutcomeError):
    """The effect may have been dispatched; its outcome is unknown and needs reconciliation."""

    reason = "effect_unknown"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the runner records for one dispatched effect."""

    state: EffectState
    receipt: str | None = None
    detail: str | None = None


def intent_digest(lease: Lease, effect_key: str, intent: Mapping[str, Any]) -> str:
    """Hex SHA-256 of the RFC 8785 canonical intent document (see the module docstring)."""
    document: dict[str, Any] = {
        "tenant": lease.tenant,
        "workflow": lease.workflow,
        "operation_id": lease.operation_id,
        "effect_key": effect_key,
        "intent": dict(intent),
    }
    try:
        # The fast path for plain values (rfc8785's bytes exactly: schemas.canonical).
        text = canonical.dumps(document)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise EffectIntentInvalid(
            workflow=lease.workflow, effect_key=effect_key, detail=str(exc)[:200]
        ) from exc
    return hashlib.sha256(text).hexdigest()


def idempotency_key(lease: Lease, effect_key: str) -> str:
    """A provider idempotency key stable across attempts: (tenant, workflow class, operation
    id, effect key).

    Hashed so that no separator inside an identifier can make two triples collide.
    """
    text = canonical.dumps([lease.tenant, lease.workflow, lease.operation_id, effect_key])
    return "accord-" + hashlib.sha256(text).hexdigest()[:40]


def classify_result(result: object) -> Outcome:
    """The outcome of a call that returned ``result``: only Success and FailedBeforeDispatch
    stay themselves; any other value did not say what happened, so it is unknown."""
    if isinstance(result, Success):
        return Outcome(EffectState.SUCCEEDED, receipt=result.receipt)
    if isinstance(result, FailedBeforeDispatch):
        return Outcome(EffectState.FAILED_BEFORE_DISPATCH, detail=_detail(result))
    return Outcome(EffectState.UNKNOWN, detail=f"returned {type(result).__name__}")


def classify_error(exc: BaseException) -> Outcome:
    """The outcome of a call that raised ``exc`` (cancellation and timeouts included)."""
    if isinstance(exc, FailedBeforeDispatch):
        return Outcome(EffectState.FAILED_BEFORE_DISPATCH, detail=_detail(exc))
    return Outcome(EffectState.UNKNOWN, detail=f"raised {type(exc).__name__}")


def _detail(exc: FailedBeforeDispatch) -> str:
    reason = exc.fields.get("reason")
    return (str(reason) if reason is not None else str(exc))[:MAX_DETAIL_CHARS]
