import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pushup.core.errors import BadChannelName, BadJSON, BadRequest, TooLarge, TooManyChannels
from pushup.core.model import (
    Message,
    Origin,
    channel_list_json,
    check_channel_list,
    check_channel_name,
    dumps,
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


def test_data_is_stored_compact_with_exponents_written_short():
    """docs/api.md, "Publish": compact, UTF-8, a float's exponent without + or
    leading zeros (the same number as the publisher's)."""
    sent = loads(b'{"data": {"a": [1e100, 2.5E-07, 1.5, "\\u00e9\\n"], "b": null}}')
    assert encode_data(sent["data"], 1000) == b'{"a":[1e100,2.5e-7,1.5,"\xc3\xa9\\n"],"b":null}'


def test_message_json_is_built_once_and_lists_only_subscribed_channels():
    m = Message("n1.a", 1, 1_000_000, ("x", "y"), b'{"k":[1,2]}')
    assert json.loads(m.full) == {"id": "n1.a-1", "timestamp": 1.0, "channels": ["x", "y"],
                                  "data": {"k": [1, 2]}}
    assert m.json_for(frozenset({"x", "y", "z"})) is m.full
    assert json.loads(m.json_for(frozenset({"y"})))["channels"] == ["y"]
    assert m.data_json == b'{"k":[1,2]}'


def test_the_default_node_id_is_the_host_name_and_port_in_the_node_id_alphabet():
    from pushup.core.model import check_node_id, default_node_id

    assert default_node_id("web-1.example.com", 8080, "ab12") == "web-1-example-com-8080"
    assert default_node_id("box", 0, "ab12") == "nab12"  # no stable port: random
    long = default_node_id("h" * 300, 65535, "x")
    assert check_node_id(long + "-63")  # a worker's id still fits


def test_an_origin_name_parses_into_its_node_id_and_epoch():
    from pushup.core.model import Origin, parse_origin

    origin = Origin("n-1", 1_763_800_000_123_456)
    assert parse_origin(origin.name) == ("n-1", 1_763_800_000_123)
    assert parse_origin("garbage") is None and parse_origin("a.B!") is None


# A message's channel list is written without json.dumps where nothing needs
# escaping: every valid name must still come out as dumps writes it.
def _is_valid_name(name: str) -> bool:
    try:
        return check_channel_name(name) == name
    except BadChannelName:
        return False


_valid_names = st.text(min_size=1, max_size=12).filter(_is_valid_name)


@given(st.lists(_valid_names, min_size=1, max_size=4, unique=True))
def test_a_channel_list_is_written_as_json_dumps_writes_it(names: list[str]) -> None:
    assert channel_list_json(tuple(names)) == dumps(names)
    m = Message("o", 1, 1_700_000_000_000_000, tuple(names), b"1")
    assert json.loads(m.full)["channels"] == names
    assert json.loads(m.json_for(frozenset(names[:1])))["channels"] == names[:1]


def test_quotes_and_backslashes_in_a_channel_name_are_escaped() -> None:
    assert channel_list_json(('a"b', "c\\d", "é")) == '["a\\"b","c\\\\d","é"]'.encode()
