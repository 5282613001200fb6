"""pushup/http/params.py: every parameter a client sends is checked here, a bad one
raising the error API.md names; defaults and caps come from the node's Config; parsed
queries are kept within their byte budget, least recently used first out."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pushup.config import Config
from pushup.core import errors
from pushup.core.channels import MAX_TTL
from pushup.core.cursor import Cursor
from pushup.core.model import NOW
from pushup.http.params import (
    DEFAULT_LIMIT,
    DEFAULT_TIMEOUT,
    Args,
    ParsedQueries,
    json_object,
    path_name,
    query_args,
    subscribe_query,
    ttl_of,
)

CONFIG = Config(node_id="t", max_timeout=30.0, max_limit=500)
MAX_TTL_S = MAX_TTL // 1_000_000  # 366 days


def subscribe(query: str):
    return subscribe_query(query_args(query.encode()), CONFIG)


def code_of(call) -> tuple[int, str]:
    with pytest.raises(errors.PushUpError) as raised:
        call()
    return raised.value.status, raised.value.code


def test_a_query_string_is_form_encoded_utf8_each_value_kept():
    assert query_args(b"channels=tag%3Ac%2B%2B,a+b&x=1&x=2&&flag") == {
        b"channels": [b"tag:c++,a b"], b"x": [b"1", b"2"], b"flag": [b""]}
    assert query_args(b"channels=%C3%A9t%C3%A9")[b"channels"] == ["été".encode()]


@given(st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1),
                       st.text(st.characters(blacklist_categories=("Cs",)))))
def test_any_percent_encoded_text_reads_back_as_its_utf8(params):
    raw = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in params.items())
    assert query_args(raw.encode()) == {k.encode(): [v.encode()] for k, v in params.items()}


def test_subscribe_defaults_and_caps_come_from_the_config():
    query, timeout = subscribe("channels=a,b")
    assert query.channels == ("a", "b") and query.since == 0 and query.until is None
    assert (query.limit, timeout) == (DEFAULT_LIMIT, 30.0)  # 50 s capped at 30
    assert subscribe_query(query_args(b"channels=a"), Config(node_id="t"))[1] == DEFAULT_TIMEOUT
    assert query.max_bytes == CONFIG.max_response_bytes
    query, timeout = subscribe("channels=a&timeout=9999&limit=99999999999999999999999")
    assert (query.limit, timeout) == (500, 30.0)
    query, timeout = subscribe("channels=a,a&timeout=0&limit=007")
    assert (query.channels, query.limit, timeout) == (("a",), 7, 0.0)


def test_since_is_now_a_time_or_a_cursor():
    assert subscribe("channels=a&since=now")[0].since is NOW
    assert subscribe("channels=a&since=1.5")[0].since == 1_500_000
    cursor = Cursor.of({"n1.a": 3})
    assert subscribe(f"channels=a&since={cursor.encode()}")[0].since == cursor
    assert subscribe("channels=a&until=2")[0].until == 2_000_000


@pytest.mark.parametrize(("query", "answer"), [
    ("timeout=1", (400, "bad_parameter")),  # no channels
    ("channels=", (400, "bad_channel_name")),
    ("channels=a%20b", (400, "bad_channel_name")),
    ("channels=a&channels=b", (400, "bad_parameter")),  # given twice
    ("channels=%FF", (400, "bad_parameter")),  # not UTF-8
    ("channels=a&since=yesterday", (400, "bad_parameter")),
    ("channels=a&since=1e12", (400, "bad_parameter")),  # past year 5138
    ("channels=a&until=nan", (400, "bad_parameter")),
    ("channels=a&timeout=-1", (400, "bad_parameter")),
    ("channels=a&timeout=inf", (400, "bad_parameter")),
    ("channels=a&timeout=nan", (400, "bad_parameter")),
    ("channels=a&limit=0", (400, "bad_parameter")),
    ("channels=a&limit=1.5", (400, "bad_parameter")),
    ("channels=a&limit=-3", (400, "bad_parameter")),
    ("channels=" + ",".join(f"c{i}" for i in range(65)), (400, "too_many_channels")),
])
def test_a_bad_subscribe_parameter_is_its_one_400(query, answer):
    assert code_of(lambda: subscribe(query)) == answer


def test_a_path_segment_is_one_checked_utf8_channel_name():
    assert path_name(b"tag%3Ac%2B%2B") == "tag:c++"
    assert code_of(lambda: path_name(b"%FF%FE")) == (400, "bad_channel_name")
    assert code_of(lambda: path_name(b"a%2Cb")) == (400, "bad_channel_name")


def test_a_body_is_one_json_object():
    assert json_object(b'{"name": "x"}') == {"name": "x"}
    assert json_object(b"  ", empty_ok=True) == {}
    assert code_of(lambda: json_object(b"")) == (400, "bad_json")
    assert code_of(lambda: json_object(b"[1]")) == (400, "bad_json")


def test_a_ttl_is_seconds_in_range_given_back_in_microseconds():
    assert ttl_of({}) is None and ttl_of({"ttl": None}) is None
    assert ttl_of({"ttl": 1.5}) == 1_500_000 and ttl_of({"ttl": MAX_TTL_S}) == MAX_TTL_S * 10**6
    for bad in (0, -1, MAX_TTL_S + 1, True, "60"):
        assert code_of(lambda bad=bad: ttl_of({"ttl": bad})) == (400, "bad_parameter")


def test_args_read_each_parameter_once():
    args = Args({b"a": [b"x"], b"twice": [b"1", b"2"]})
    assert args.get("a") == "x" and args.get("missing") is None
    assert args.number("missing", 2.5) == 2.5 and args.integer("missing", 4) == 4
    assert code_of(lambda: args.get("twice")) == (400, "bad_parameter")


def test_parsed_queries_keep_the_most_recently_used_within_the_budget():
    cache: ParsedQueries[str] = ParsedQueries(budget=8 * 1024, entries=3)
    for key in (b"a", b"b", b"c"):
        cache.put(key, key.decode())
    assert cache.get(b"a") == "a"  # now the most recent
    cache.put(b"d", "d")  # the entry cap: the least recently used (b) goes
    assert [cache.get(k) for k in (b"a", b"b", b"c", b"d")] == ["a", None, "c", "d"]
    cache.put(b"x" * 1024, "big")  # over an eighth of the budget: never kept
    assert cache.get(b"x" * 1024) is None and len(cache) == 3


@given(st.lists(st.binary(min_size=1, max_size=600), max_size=40))
def test_parsed_queries_never_hold_more_than_their_budget(keys):
    cache: ParsedQueries[int] = ParsedQueries(budget=4096, entries=1000)
    for i, key in enumerate(keys):
        cache.put(key, i)
        assert cache.bytes <= cache.budget
    if keys and len(keys[-1]) * 2 + 512 <= 4096 // 8:
        assert cache.get(keys[-1]) is not None  # the newest small one is always kept
