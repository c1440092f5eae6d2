"""RFC 8785 canonical JSON (the digest's bytes), with a fast path for the common values.

``rfc8785.dumps`` is pure Python (tens of µs for a small document). For the values payloads
are mostly made of, ``orjson`` with sorted keys writes exactly the same bytes (and, for a
key that is a subclass of ``str``, which orjson refuses, the C-accelerated ``json.dumps``
with sorted keys, no whitespace and UTF-8 output):

* strings: each escapes exactly ``"``, ``\\`` and U+0000-U+001F (``\\b \\f \\n \\r \\t``, else
  ``\\u00xx`` in lower case) and writes everything else as UTF-8 (lone surrogates never get
  here: ``check_values`` refuses them);
* integers, ``true``, ``false``, ``null``, arrays: the same text;
* object keys: RFC 8785 sorts by UTF-16 code units, orjson and Python by code points (as
  UTF-8 bytes sort); the orders agree on ASCII keys.

Floats (ECMAScript number formatting: ``1.0`` is ``1``, ``1e21`` is ``1e+21``) and non-ASCII
keys take ``rfc8785.dumps``. tests/unit/test_canonical.py checks the fast path against
``rfc8785`` byte for byte on arbitrary documents (hypothesis).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import rfc8785

# The stdlib's compact UTF-8 JSON, for what orjson refuses (a key that is a str subclass).
_SORTED = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)
_UNSORTED = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# The I-JSON range rfc8785 accepts for integers (it refuses the rest with IntegerDomainError).
_SAFE_INT = 2**53 - 1


def _plain(value: Any) -> bool:
    """True when ``value`` holds only what the fast path writes as RFC 8785 does (integers
    outside the I-JSON range go to ``rfc8785``, which refuses them)."""
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -_SAFE_INT <= value <= _SAFE_INT
    if isinstance(value, dict):
        return all(isinstance(k, str) and k.isascii() and _plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    return False  # floats, and anything rfc8785 should judge itself


def compact_bytes(value: Any, *, sort_keys: bool = False) -> bytes:
    """``value`` as compact UTF-8 JSON, written by orjson in one C call (a third to a sixth of
    the stdlib encoder's time between two awaits: docs/bench-log.md). A key that is a ``str``
    subclass (a StrEnum member, say), which orjson refuses, takes the stdlib encoder, with
    the same bytes. Raises TypeError, ValueError or RecursionError for what is not JSON."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except TypeError:  # orjson.JSONEncodeError
        return (_SORTED if sort_keys else _UNSORTED).encode(value).encode("utf-8")


def plain_bytes(value: Any) -> bytes:
    """The fast path's bytes of a *plain* value (the caller checked it: ``events.check_values``
    found it plain): its RFC 8785 form, the compact JSON with sorted keys."""
    return compact_bytes(value, sort_keys=True)


def dumps(value: Any, *, plain: bool = False) -> bytes:
    """The RFC 8785 canonical form of ``value`` (raises what ``rfc8785.dumps`` raises).
    ``plain=True``: the caller knows ``value`` is plain (``events.check_values`` found it
    so), and it is not walked again."""
    if plain:
        return plain_bytes(value)
    if _plain(value):
        try:
            return plain_bytes(value)
        except UnicodeEncodeError:
            pass  # a lone surrogate: rfc8785 refuses it with its own error
    result: bytes = rfc8785.dumps(value)
    return result
