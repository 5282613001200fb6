import json

import pytest

from pushup.errors import BadChannelName, BadJSON, BadRequest, TooLarge, TooManyChannels
from pushup.model import (
    Message,
    Origin,
    check_channel_list,
    check_channel_name,
    encode_data,
    format_time,
    loads,
    parse_time,
)


@pytest.mark.parametrize("name", ["author:John", "tag:c++", "a", "x" * 200, "ünïcode", "a/b"])
def test_valid_channel_names(name):
    assert check_channel_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 201, "a b", "a\tb", "a,b", "a\x00", "a\x7f", "a\u2003b",
                                  "\ud800", 5, None])
def test_invalid_channel_names(name):
    with pytest.raises(BadChannelName):
        check_channel_name(name)


def test_channel_list_folds_duplicates_and_caps_count():
    assert check_channel_list(["a", "b", "a"], 2) == ("a", "b")
    with pytest.raises(TooManyChannels):
        check_channel_list(["a", "b", "c"], 2)
    with pytest.raises(BadRequest):
        check_channel_list([], 2)


def test_timestamps_never_go_backwards_even_if_the_clock_does():
    origin = Origin("n1", 0)
    stamps = [origin.next(t)[1] for t in (1000, 900, 900, 2000, 5)]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert [origin.next(0)[0] for _ in range(3)] == [6, 7, 8]


def test_time_is_exact_to_the_microsecond():
    assert format_time(1763800000123456) == "1763800000.123456"
    assert parse_time("1763800000.123456", "since") == 1763800000123456
    assert float(format_time(5)) == 0.000005


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "", "abc"])
def test_bad_times_are_400(text):
    with pytest.raises(BadRequest):
        parse_time(text, "since")


@pytest.mark.parametrize("body", [b"\xff\xfe", b"NaN", b'{"a": Infinity}', b"[" * 100000, b"{"])
def test_bad_json_bodies(body):
    with pytest.raises(BadJSON):
        loads(body)


def test_data_over_the_limit_is_413():
    with pytest.raises(TooLarge):
        encode_data("x" * 100, 50)


def test_message_json_is_built_once_and_lists_only_subscribed_channels():
    m = Message("n1.a", 1, 1_000_000, ("x", "y"), b'{"k":[1,2]}')
    assert json.loads(m.full) == {"id": "n1.a-1", "timestamp": 1.0, "channels": ["x", "y"],
                                  "data": {"k": [1, 2]}}
    assert m.json_for(frozenset({"x", "y", "z"})) is m.full
    assert json.loads(m.json_for(frozenset({"y"})))["channels"] == ["y"]
    assert m.data_json == b'{"k":[1,2]}'
