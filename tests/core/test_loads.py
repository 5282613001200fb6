"""Publish bodies are decoded by msgspec (pushup.core.model.loads): every body the
stdlib's ``json.loads`` accepted is accepted, and its ``data`` serialises to the
same bytes; every body it refused is refused (400 bad_json)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pushup.core.errors import BadJSON
from pushup.core.model import encode_data, loads

LIMIT = 1 << 20


def _refuse(name: str) -> object:
    raise ValueError(name)


def stdlib(body: bytes) -> bytes:
    """What PushUp stored for ``body`` before msgspec decoded it: the stdlib's
    decoder, and a non-finite float (``1e400``) refused as the stdlib's encoder
    refused it; the value then serialised as PushUp serialises ``data``."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_refuse)
        json.dumps(value, allow_nan=False)
    except (ValueError, RecursionError):
        raise BadJSON("refused") from None
    return encode_data(value, LIMIT)


def ours(body: bytes) -> bytes:
    return encode_data(loads(body), LIMIT)


ACCEPTED = [
    b'{"data":123456789012345678901234567890}',  # past 64 bits: still an integer
    b'{"data":-123456789012345678901234567890}',
    b'{"data":18446744073709551616}',
    b'{"data":-9223372036854775809}',
    b'{"data":' + b"9" * 4300 + b"}",  # the stdlib's longest integer
    b'{"data":1e5}', b'{"data":1E+05}', b'{"data":2.5e-3}', b'{"data":1.5e-300}',
    b'{"data":1e308}', b'{"data":5e-324}', b'{"data":2.5e-324}', b'{"data":0.1}',
    b'{"data":12345678901234567890.5}', b'{"data":1.0}', b'{"data":-0}',
    b'{"data":-0.0}', b'{"data":-0.0e0}',
    b'{"data":"\xe2\x80\xa8\xe2\x80\xa9"}', b'{"data":"\\u2028\\u2029"}',  # U+2028, U+2029
    b'{"data":"\\ud83d\\ude00 \xf0\x9f\x98\x80"}', b'{"data":"\\u0000\\/\\"\\\\"}',
    b'{"data":{"k":1,"k":2,"j":{"k":3,"k":[4]}}}',  # duplicate keys: the last one
    b' \t\r\n{"data" : [ 1 , true , false , null ] }\n',
    b'[' * 900 + b']' * 900,
]
REFUSED = [
    b'{"data":NaN}', b'{"data":Infinity}', b'{"data":-Infinity}',
    b'{"data":1e400}',  # an infinite float: refused when serialised
    b'{"data":' + b"9" * 4301 + b"}",
    b'{"data":"\\ud800"}',  # a lone surrogate
    b'"\xff"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'\xef\xbb\xbf{}',
    b'{"data":"\x00"}', b'{"data":01}', b'{"data":1.}', b'{"data":.5}', b'{"x":1} x',
    b'', b'{', b"{'a':1}", b'[' * 2000 + b']' * 2000,
]


@pytest.mark.parametrize("body", ACCEPTED)
def test_accepted_bodies_store_the_same_bytes(body: bytes) -> None:
    assert ours(body) == stdlib(body)


@pytest.mark.parametrize("body", REFUSED)
def test_refused_bodies_are_still_refused(body: bytes) -> None:
    with pytest.raises(BadJSON):
        stdlib(body)
    with pytest.raises(BadJSON):
        ours(body)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-(10**40), 10**40)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(value=values, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_any_json_the_stdlib_writes_decodes_to_the_same_bytes(
        value: object, ascii_only: bool, indent: int | None) -> None:
    body = json.dumps({"data": value}, ensure_ascii=ascii_only, indent=indent)
    try:
        raw = body.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in st.text(): not a body anyone sends
        return
    try:
        expected = stdlib(raw)
    except BadJSON:
        with pytest.raises(BadJSON):
            ours(raw)
        return
    assert ours(raw) == expected
