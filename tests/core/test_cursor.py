import pytest

from pushup.core.cursor import EMPTY, Cursor, decode
from pushup.core.errors import BadRequest


def test_cursor_round_trips_through_its_token():
    c = Cursor.of({"n1.abc": 5, "n2.xyz": 17})
    assert decode(c.encode()) == c


def test_empty_cursor_round_trips():
    assert decode(EMPTY.encode()) == EMPTY


def test_a_cursor_never_parses_as_a_number():
    for positions in ({}, {"n1.a": 1}, {"a.b": 123456789}):
        with pytest.raises(ValueError):
            float(Cursor.of(positions).encode())


def test_merging_only_moves_positions_forward():
    c = Cursor.of({"a.1": 10, "b.1": 3})
    merged = c.advanced([("a.1", 4), ("b.1", 8), ("c.1", 2)])
    assert merged.as_dict() == {"a.1": 10, "b.1": 8, "c.1": 2}


def test_an_origin_absent_from_the_cursor_is_at_zero():
    assert Cursor.of({"a.1": 3}).position("b.1") == 0


@pytest.mark.parametrize("token", ["", "c1.%%%", "c1.!!", "x1.abc", "c1.YQ", "c1.YTp4",
                                   "c1." + "QQ" * 3000])
def test_garbage_is_refused_with_400(token):
    with pytest.raises(BadRequest) as e:
        decode(token)
    assert e.value.status == 400
