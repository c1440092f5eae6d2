"""The canonical-JSON fast path writes exactly what rfc8785 writes (byte for byte)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import rfc8785
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from accord.schemas import canonical
from accord.schemas.errors import InvalidEvent
from accord.schemas.events import check_values, semantic_digest
from tests.support import SOAK

_SAFE_INT = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
_TEXT = st.text(st.characters(exclude_categories=("Cs",)))  # no lone surrogates (refused)
_SCALARS = st.none() | st.booleans() | _SAFE_INT | _TEXT
# What check_values accepts and finds plain: no NUL in text, every key ASCII.
_NO_NUL = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
_ASCII_KEY = st.text(st.characters(max_codepoint=127, exclude_characters="\x00"))
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)


def _documents(scalars: st.SearchStrategy[Any], keys: st.SearchStrategy[str]) -> Any:
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
        max_leaves=30,
    )


@settings(max_examples=3000 if SOAK else 300, deadline=None)
@given(_documents(_SCALARS | _FLOATS, _TEXT))
def test_the_fast_path_and_rfc8785_agree_on_everything(document: Any) -> None:
    assert canonical.dumps(document) == rfc8785.dumps(document)


@settings(max_examples=2000 if SOAK else 200, deadline=None)
@given(_documents(_SCALARS, st.text(st.characters(max_codepoint=127))))
def test_plain_documents_take_the_fast_path(document: Any) -> None:
    assert canonical._plain(document)
    assert canonical.dumps(document) == rfc8785.dumps(document)


def test_where_the_two_orders_or_formats_differ_it_falls_back() -> None:
    # UTF-16 key order (RFC 8785) differs from code-point order past the BMP
    keys = {"\U0001f600": 1, "\ufb01": 2}
    assert not canonical._plain(keys) and canonical.dumps(keys) == rfc8785.dumps(keys)
    assert canonical.dumps({"n": 1.0, "e": 1e21}) == b'{"e":1e+21,"n":1}'
    assert canonical.dumps({"s": '\u2028\x1f"\\'}) == rfc8785.dumps({"s": '\u2028\x1f"\\'})


def test_a_lone_surrogate_is_refused_as_rfc8785_refuses_it() -> None:
    good = {"x": "\ud7ff\ue000"}  # control: either side of the surrogates
    assert canonical.dumps(good) == rfc8785.dumps(good)
    for text in ("\ud800", "a\udfff", "\udc00\ud800"):
        for document in ({"x": text}, [text], {text: 1}):
            with pytest.raises(ValueError) as theirs:
                rfc8785.dumps(document)
            with pytest.raises(ValueError) as ours:
                canonical.dumps(document)
            assert type(ours.value) is type(theirs.value)
        with pytest.raises(rfc8785.CanonicalizationError):  # in a value, its own error
            canonical.dumps({"x": text})


def test_integers_outside_the_i_json_range_are_refused_as_rfc8785_refuses_them() -> None:
    edge = 2**53 - 1
    assert canonical.dumps([edge, -edge]) == rfc8785.dumps([edge, -edge])  # control
    for value in (2**53, -(2**53), 10**30):
        with pytest.raises(rfc8785.IntegerDomainError):
            rfc8785.dumps({"n": value})
        with pytest.raises(rfc8785.IntegerDomainError):
            canonical.dumps({"n": value})


@settings(max_examples=2000 if SOAK else 300, deadline=None)
@given(st.dictionaries(_TEXT, _documents(_SCALARS | _FLOATS, _TEXT), max_size=5))
def test_the_digest_of_a_checked_payload_is_rfc8785_whatever_check_values_found(
    payload: dict[str, Any],
) -> None:
    try:
        plain = check_values(payload)
    except InvalidEvent:
        assume(False)  # refused before any digest (NUL, ...)
    envelope = {"tenant": "acme", "operation_id": "op-1", "type": "t.x", "version": 1}
    document = {**envelope, "authority_epoch": 2**53 - 1, "material": payload}
    expected = hashlib.sha256(rfc8785.dumps(document)).hexdigest()
    # check_values' finding spares the digest its own walk; it must never change the bytes
    assert plain == canonical._plain(payload)
    digest = semantic_digest(
        tenant="acme",
        operation_id="op-1",
        type_="t.x",
        version=1,
        authority_epoch=2**53 - 1,
        material=payload,
        plain_material=plain,
    )
    assert digest == expected


@settings(max_examples=2000 if SOAK else 300, deadline=None)
@given(
    _TEXT | _FLOATS,
    _TEXT,
    _TEXT | st.none(),
    _SAFE_INT | st.booleans(),
    _SAFE_INT | st.booleans(),
    st.dictionaries(
        _ASCII_KEY,
        _documents(st.none() | st.booleans() | _SAFE_INT | _NO_NUL, _ASCII_KEY),
        max_size=5,
    ),
)
def test_the_digest_written_by_the_fast_path_is_rfc8785(
    tenant: str, operation_id: str, type_: str, version: int, epoch: int, payload: dict[str, Any]
) -> None:
    # Every envelope field arbitrary (a bool where a number belongs, or a float or None
    # where text belongs, takes the slow path, as a number past I-JSON does): the fast
    # path's document is rfc8785's, byte for byte.
    try:
        assume(check_values(payload))
    except InvalidEvent:
        assume(False)  # refused before any digest (NUL, ...)
    document = {
        "tenant": tenant,
        "operation_id": operation_id,
        "type": type_,
        "version": version,
        "authority_epoch": epoch,
        "material": payload,
    }
    digest = semantic_digest(
        tenant=tenant,
        operation_id=operation_id,
        type_=type_,
        version=version,
        authority_epoch=epoch,
        material=payload,
        plain_material=True,
    )
    assert digest == hashlib.sha256(rfc8785.dumps(document)).hexdigest()


def test_a_plain_payload_beside_an_envelope_number_past_i_json_still_refuses() -> None:
    payload = {"report_id": "r1"}
    assert check_values(payload)  # control: plain
    with pytest.raises(InvalidEvent):
        semantic_digest(
            tenant="acme",
            operation_id="op-1",
            type_="t.x",
            version=1,
            authority_epoch=2**53,
            material=payload,
            plain_material=True,
        )
