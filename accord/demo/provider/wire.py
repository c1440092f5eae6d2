"""What the provider simulator and its client agree on: fault modes and the receipt."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

HOST = "127.0.0.1"
MAX_BODY = 1 << 20


class Fault(StrEnum):
    NONE = "none"
    FAIL_BEFORE_ACCEPT = "fail_before_accept"
    DROP_AFTER_ACCEPT = "drop_after_accept"
    SLOW = "slow"


@dataclass(frozen=True, slots=True)
class Receipt:
    """The provider's proof that it accepted a request (its evidence row)."""

    receipt_id: str
    idempotency_key: str
    body_sha256: str
    accepted_at: float
    # True when this answer replayed an earlier acceptance; not part of the receipt's identity.
    replayed: bool = field(default=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        return cls(
            receipt_id=str(data["receipt_id"]),
            idempotency_key=str(data["idempotency_key"]),
            body_sha256=str(data["body_sha256"]),
            accepted_at=float(data["accepted_at"]),
            replayed=bool(data.get("replayed", False)),
        )
