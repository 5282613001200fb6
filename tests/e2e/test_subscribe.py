"""GET /subscribe: immediate, held, timeout, paging, since/until, multi-channel, validation."""
from __future__ import annotations

import time

import pytest

from tests.e2e.support import assert_error, assert_json_ok, uniq


def ids(body):
    return [m["id"] for m in body["messages"]]


def test_cached_messages_answered_at_once(node):
    ch = uniq("cached")
    pub = node.publish([ch], "hello")
    body = node.subscribe_guarded([ch], "cached messages answered at once")  # since=0
    assert ids(body) == [pub["id"]]
    m = body["messages"][0]
    assert set(m) >= {"id", "timestamp", "channels", "data"}
    assert m["channels"] == [ch] and m["data"] == "hello"
    assert not body.get("gap", False)
    assert body["closed"] == []


def test_held_then_answered_by_publish(node):
    ch = uniq("held")
    cur = node.subscribe([ch])["cursor"]
    p = node.subscribe_async([ch], since=cur, timeout=60)
    node.wait_subscribers(ch, 1)
    assert not p.done()
    pub = node.publish([ch], {"n": 1})
    body = assert_json_ok(p.result(10))
    assert ids(body) == [pub["id"]] and body["messages"][0]["data"] == {"n": 1}
    # the new cursor points after it
    assert node.subscribe([ch], since=body["cursor"])["messages"] == []


def test_held_not_answered_by_other_channel(node):
    ch, other = uniq("mine"), uniq("other")
    cur = node.subscribe([ch])["cursor"]
    p = node.subscribe_async([ch], since=cur, timeout=1)
    node.wait_subscribers(ch, 1)
    node.publish([other], "not for you")
    body = assert_json_ok(p.result(15))
    assert body["messages"] == []


def test_timeout_returns_empty_and_cursor_still_works(node):
    ch = uniq("to")
    old = node.publish([ch], "old")
    cur = node.subscribe([ch])["cursor"]
    body = node.subscribe([ch], since=cur, timeout=1)
    assert body["messages"] == [] and body["cursor"]
    new = node.publish([ch], "new")
    body2 = node.subscribe([ch], since=body["cursor"], timeout=5)
    assert ids(body2) == [new["id"]] and old["id"] not in ids(body2)


def test_timeout_zero_answers_at_once(node):
    ch = uniq("t0")
    body = node.subscribe([ch], timeout=0)  # the answer itself is the event
    assert body["messages"] == [] and body.get("gap", False) is False


def test_fractional_timeout_accepted(node):
    body = node.subscribe([uniq("frac")], timeout=0.3)
    assert body["messages"] == []


def test_limit_paging_walks_every_message_once_in_order(node):
    ch = uniq("page")
    r = node.publish_batch([{"channels": [ch], "data": i} for i in range(23)])
    published = [m["id"] for m in assert_json_ok(r, 201)["messages"]]
    seen, cursor, pages = [], "0", 0
    while True:
        body = node.subscribe([ch], since=cursor, limit=5, timeout=0)
        assert len(body["messages"]) <= 5
        if not body["messages"]:
            break
        if len(seen) + 5 <= 23:
            assert len(body["messages"]) == 5
        seen += ids(body)
        cursor = body["cursor"]
        pages += 1
        assert pages < 20
    assert seen == published


def test_default_limit_is_100(node):
    ch = uniq("deflim")
    node.publish_batch([{"channels": [ch], "data": i} for i in range(150)])
    body = node.subscribe([ch], since="0")
    assert [m["data"] for m in body["messages"]] == list(range(100))
    body2 = node.subscribe([ch], since=body["cursor"])
    assert [m["data"] for m in body2["messages"]] == list(range(100, 150))


def test_limit_above_max_is_capped(node):
    ch = uniq("bigl")
    node.publish_batch([{"channels": [ch], "data": i} for i in range(5)])
    body = node.subscribe([ch], since="0", limit=10**9)
    assert len(body["messages"]) == 5


def test_max_limit_and_max_timeout_flags(start_node):
    n = start_node("--max-limit", "4", "--max-timeout", "1")
    ch = uniq("caps")
    n.publish_batch([{"channels": [ch], "data": i} for i in range(10)])
    body = n.subscribe([ch], since="0", limit=50)
    assert [m["data"] for m in body["messages"]] == [0, 1, 2, 3]
    body = n.subscribe([ch], since="0")  # default 100, capped to 4 as well
    assert len(body["messages"]) == 4
    body = n.subscribe_guarded([uniq("empty")], "timeout=1000 capped to --max-timeout 1",
                               timeout=1000)
    assert body["messages"] == []


def test_since_time_is_strictly_greater(node):
    ch = uniq("since")
    p = [node.publish([ch], i) for i in range(3)]
    body = node.subscribe([ch], since=repr(p[0]["timestamp"]))
    assert ids(body) == [p[1]["id"], p[2]["id"]]
    body = node.subscribe([ch], since=repr(p[2]["timestamp"]))
    assert body["messages"] == []
    body = node.subscribe([ch], since=repr(p[0]["timestamp"] - 0.000001))
    assert ids(body) == [m["id"] for m in p]
    body = node.subscribe([ch], since="{:.6f}".format(p[1]["timestamp"]))
    assert ids(body) == [p[2]["id"]]


def test_since_time_in_future_holds(node):
    ch = uniq("future")
    node.publish([ch], "past")
    body = node.subscribe([ch], since=repr(time.time() + 3600), timeout=0)
    assert body["messages"] == []


def test_since_integer_and_exponent_are_times(node):
    ch = uniq("sint")
    pub = node.publish([ch], 1)
    for s in ("0", "0.0", "1e3", "-1"):
        assert ids(node.subscribe([ch], since=s)) == [pub["id"]], s


def test_until(node):
    ch = uniq("until")
    p = [node.publish([ch], i) for i in range(4)]
    body = node.subscribe([ch], since="0", until=repr(p[1]["timestamp"]), timeout=30,
                          http_timeout=10)
    assert ids(body) == [p[0]["id"], p[1]["id"]]
    body = node.subscribe([ch], since=repr(p[0]["timestamp"]), until=repr(p[2]["timestamp"]))
    assert ids(body) == [p[1]["id"], p[2]["id"]]


def test_until_in_past_answers_at_once(node):
    ch = uniq("untilpast")
    body = node.subscribe_guarded([ch], "an until in the past answered at once",
                                  until=repr(time.time() - 10))
    assert body["messages"] == []


def test_held_poll_with_until_in_future_is_answered_by_publish(node):
    ch = uniq("untilfut")
    cur = node.subscribe([ch])["cursor"]
    p = node.subscribe_async([ch], since=cur, until=repr(time.time() + 3600), timeout=60)
    node.wait_subscribers(ch, 1)
    pub = node.publish([ch], "in range")
    assert ids(assert_json_ok(p.result(10))) == [pub["id"]]


def test_message_on_two_channels_returned_once_with_both_names(node):
    a, b, c = uniq("a"), uniq("b"), uniq("c")
    pub = node.publish([a, b, c], "multi")
    body = node.subscribe([a, b], since="0")
    assert ids(body) == [pub["id"]]
    assert sorted(body["messages"][0]["channels"]) == sorted([a, b])
    body = node.subscribe([c], since="0")
    assert body["messages"][0]["channels"] == [c]


def test_held_multi_channel_message_once(node):
    a, b = uniq("a"), uniq("b")
    cur = node.subscribe([a, b])["cursor"]
    p = node.subscribe_async([a, b], since=cur, timeout=60)
    node.wait_subscribers(a, 1)
    pub = node.publish([a, b], "both")
    body = assert_json_ok(p.result(10))
    assert ids(body) == [pub["id"]]
    assert sorted(body["messages"][0]["channels"]) == sorted([a, b])
    assert node.subscribe([a, b], since=body["cursor"])["messages"] == []


def test_messages_sorted_by_timestamp_across_channels(node):
    a, b = uniq("a"), uniq("b")
    pubs = [node.publish([a if i % 2 else b], i) for i in range(12)]
    body = node.subscribe([b, a], since="0")
    assert ids(body) == [p["id"] for p in pubs]
    keys = [(m["timestamp"], m["id"]) for m in body["messages"]]
    assert keys == sorted(keys)


def test_duplicate_names_in_query_are_folded(node):
    a = uniq("fold")
    pub = node.publish([a], 1)
    body = node.subscribe(f"{a},{a}", since="0")
    assert ids(body) == [pub["id"]] and body["messages"][0]["channels"] == [a]


def test_cursor_is_opaque_not_a_number(node):
    ch = uniq("cur")
    node.publish([ch], 1)
    for kw in ({}, {"since": "0"}, {"timeout": 0}):
        cur = node.subscribe([ch], **kw)["cursor"]
        with pytest.raises(ValueError):
            float(cur)


def test_cursor_decodes_for_other_channels(node):
    """A cursor is a position, not a credential: one that decodes is honoured."""
    a, b = uniq("a"), uniq("b")
    cur = node.subscribe([a])["cursor"]
    pub = node.publish([b], "x")
    body = node.subscribe([b], since=cur)
    assert ids(body) == [pub["id"]]


@pytest.mark.parametrize("since", ["nan", "NaN", "inf", "-inf", "Infinity", "", "garbage",
                                   "not-a-cursor", "eyJ4IjoxfQ", "0x10"])
def test_bad_since_is_400(node, since):
    assert_error(node.subscribe_raw([uniq()], since=since, timeout=0), 400, "bad_parameter")


@pytest.mark.parametrize("until", ["nan", "inf", "", "abc"])
def test_bad_until_is_400(node, until):
    assert_error(node.subscribe_raw([uniq()], until=until, timeout=0), 400, "bad_parameter")


@pytest.mark.parametrize("timeout", ["-1", "-0.5", "abc", "", "nan", "1s"])
def test_bad_timeout_is_400(node, timeout):
    assert_error(node.subscribe_raw([uniq()], timeout=timeout, http_timeout=10), 400,
                 "bad_parameter")


@pytest.mark.parametrize("limit", ["0", "-1", "abc", "", "1.5", "nan"])
def test_bad_limit_is_400(node, limit):
    assert_error(node.subscribe_raw([uniq()], limit=limit, timeout=0), 400, "bad_parameter")


def test_missing_or_empty_channels_is_400(node):
    assert_error(node.get("/subscribe?timeout=0"), 400, "bad_parameter")
    assert_error(node.get("/subscribe?channels=&timeout=0"), 400, "bad_channel_name")


@pytest.mark.parametrize("query", ["channels={a}&timeout=0&timeout=1",
                                   "channels={a}&channels={a}&timeout=0",
                                   "channels={a}&since=0&since=0&timeout=0",
                                   "channels={a}&limit=1&limit=2&timeout=0",
                                   "channels={a}&until=1&until=2&timeout=0"])
def test_repeated_parameter_is_400(node, query):
    assert_error(node.get("/subscribe?" + query.format(a=uniq())), 400, "bad_parameter")


def test_too_many_channels_default_64(node):
    chans = [uniq("s") for _ in range(65)]
    assert_error(node.subscribe_raw(chans, timeout=0), 400, "too_many_channels")
    node.subscribe(chans[:64], timeout=0)


def test_default_timeout_holds(node):
    """Without `timeout` the poll is held (default 50 s), not answered at once."""
    import socket as _socket
    ch = uniq("deft")
    cur = node.subscribe([ch])["cursor"]
    with pytest.raises((_socket.timeout, TimeoutError)):
        node.get(node.sub_path([ch], since=cur), timeout=2)


def test_default_timeout_is_capped_by_max_timeout(start_node):
    n = start_node("--max-timeout", "0.5")
    body = n.subscribe_guarded([uniq()], "the default 50 s capped to --max-timeout 0.5",
                               timeout=None, guard=20)
    assert body["messages"] == []


def test_default_max_limit_is_1000(node):
    a, b = uniq("ml"), uniq("ml")
    for ch in (a, b):
        r = node.publish_batch([{"channels": [ch], "data": i} for i in range(600)])
        assert r.status == 201, r
    body = node.subscribe([a, b], since="0", limit=5000)
    assert len(body["messages"]) == 1000
    body = node.subscribe([a, b], since=body["cursor"], limit=5000)
    assert len(body["messages"]) == 200


def test_default_per_channel_cap_is_1000(node):
    ch = uniq("cap")
    for start in (0, 500, 1000):
        r = node.publish_batch([{"channels": [ch], "data": i}
                                for i in range(start, min(start + 500, 1005))])
        assert r.status == 201, r
    body = node.subscribe([ch], since="0", limit=1000)
    assert body.get("gap") is True
    assert [m["data"] for m in body["messages"]] == list(range(5, 1005))
