"""POST /publish: single, batch (all or nothing), validation, sizes, ids and timestamps."""
from __future__ import annotations

import json
import re
import time

import pytest

from tests.e2e.support import assert_error, assert_json_ok, uniq

TS_RE = re.compile(rb'"timestamp":\s*(-?\d+\.\d+)\s*[,}]')


def test_publish_single(node):
    a, b = uniq("a"), uniq("b")
    before = time.time()
    r = node.publish_raw([a, b], {"k": [1, 2, 3]})
    body = assert_json_ok(r, 201)
    assert set(body) >= {"id", "timestamp", "channels"}
    assert isinstance(body["id"], str) and body["id"]
    assert isinstance(body["timestamp"], float)
    assert before - 60 < body["timestamp"] < time.time() + 60
    assert body["channels"] == [a, b]
    got = node.subscribe([a], since="0")
    m = got["messages"][0]
    assert m["id"] == body["id"] and m["timestamp"] == body["timestamp"]
    assert m["data"] == {"k": [1, 2, 3]}


def test_timestamps_have_six_decimals_and_strictly_increase(node):
    ch = uniq("ts")
    raws = [node.publish_raw([ch], i) for i in range(40)]
    stamps = []
    for r in raws:
        assert r.status == 201, r
        m = TS_RE.search(r.body)
        assert m, r.body
        assert len(m.group(1).split(b".")[1]) == 6, r.body
        stamps.append(float(m.group(1)))
    assert all(x < y for x, y in zip(stamps, stamps[1:], strict=False)), stamps
    sub = node.subscribe_raw([ch], since="0", limit=100)
    found = TS_RE.findall(sub.body)
    assert len(found) == 40 and all(len(t.split(b".")[1]) == 6 for t in found)


def test_ids_unique(node):
    ch = uniq("ids")
    ids = [node.publish([ch], i)["id"] for i in range(100)]
    r = node.publish_batch([{"channels": [ch], "data": i} for i in range(100)])
    ids += [m["id"] for m in assert_json_ok(r, 201)["messages"]]
    assert len(set(ids)) == 200


@pytest.mark.parametrize("data", [None, 0, -1.5, "", "text", True, False, [], {}, [1, [2, [3]]],
                                  {"a": {"b": None}}, "ünïcødé ✓ \U0001F600", 2**53, "\\\"\n\t",
                                  "</script>"])
def test_data_any_json_value_round_trips(node, data):
    ch = uniq("data")
    node.publish([ch], data)
    got = node.subscribe([ch], since="0")
    assert len(got["messages"]) == 1
    assert got["messages"][0]["data"] == data
    assert type(got["messages"][0]["data"]) is type(data)


def test_batch(node):
    a, b = uniq("a"), uniq("b")
    msgs = [{"channels": [a], "data": 1}, {"channels": [a, b], "data": 2},
            {"channels": [b], "data": 3}]
    body = assert_json_ok(node.publish_batch(msgs), 201)
    out = body["messages"]
    assert len(out) == 3
    assert [m["channels"] for m in out] == [[a], [a, b], [b]]
    assert len({m["id"] for m in out}) == 3
    stamps = [m["timestamp"] for m in out]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3  # applied in order
    got = node.subscribe([a, b], since="0")
    assert [m["data"] for m in got["messages"]] == [1, 2, 3]
    assert [m["id"] for m in got["messages"]] == [m["id"] for m in out]


def test_batch_empty_is_400(node):
    assert_error(node.publish_batch([]), 400, "bad_parameter")


@pytest.mark.parametrize("bad,code", [
    ({"channels": ["BADNAME with space"], "data": 1}, "bad_channel_name"),
    ({"channels": [], "data": 1}, "bad_parameter"),
    ({"data": 1}, "bad_parameter"),
    ({"channels": ["x"]}, "bad_parameter"),
    ({"channels": "x", "data": 1}, "bad_parameter"),
    ("not an object", "bad_parameter"),
    ({"channels": [f"c{i}" for i in range(65)], "data": 1}, "too_many_channels"),
])
def test_batch_all_or_nothing(node, bad, code):
    a = uniq("aon")
    if isinstance(bad, dict) and bad.get("channels") == ["x"]:
        bad = {"channels": [uniq("x")]}
    msgs = [{"channels": [a], "data": "first"}, bad, {"channels": [a], "data": "third"}]
    assert_error(node.publish_batch(msgs), 400, code)
    # nothing applied: not even the channel the valid first message named exists
    # (asked before the subscribe below, which would create it)
    assert_error(node.channel_info(a), 404, "no_such_channel")
    assert node.subscribe([a], since="0")["messages"] == []


def test_batch_with_oversized_message_publishes_nothing(start_node):
    n = start_node("--max-message-bytes", "100")
    a = uniq("aon")
    msgs = [{"channels": [a], "data": "ok"}, {"channels": [a], "data": "x" * 500}]
    assert_error(n.publish_batch(msgs), 413, "too_large")
    assert_error(n.channel_info(a), 404, "no_such_channel")
    assert n.subscribe([a], since="0")["messages"] == []


@pytest.mark.parametrize("body", [
    {"data": 1},
    {"channels": [], "data": 1},
    {"channels": "a", "data": 1},
    {"channels": None, "data": 1},
    {"channels": ["a"]},
    {"messages": "x"},
    {"messages": {}},
    {"messages": [1]},
])
def test_publish_bad_fields_is_400(node, body):
    assert_error(node.post("/publish", body), 400, "bad_parameter")


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"x"', b"42", b"null", b"true"])
def test_publish_non_object_body_is_400(node, raw):
    assert_error(node.post("/publish", raw_body=raw), 400, "bad_json")


@pytest.mark.parametrize("channels", [[1], [None], [["a"]], [{"a": 1}]])
def test_publish_non_string_channel_is_400(node, channels):
    assert_error(node.post("/publish", {"channels": channels, "data": 1}), 400,
                 "bad_channel_name")


@pytest.mark.parametrize("raw", [b"", b"not json", b"{", b'{"channels": ["a"], "data": }',
                                 b"\xff\xfe{}", b'{"channels": ["a"], "data": "\xff"}',
                                 b'{"channels": ["a"], "data": NaN}',
                                 b'{"channels": ["a"], "data": Infinity}',
                                 b'{"channels": ["a"], "data": -Infinity}',
                                 b'{"channels": ["a"], "data": [NaN]}'])
def test_publish_bad_json_is_400(node, raw):
    assert_error(node.post("/publish", raw_body=raw, headers={"Content-Type": "application/json"}),
                 400, "bad_json")


def test_too_many_channels_default_64(node):
    ok = [uniq("m") for _ in range(64)]
    assert_json_ok(node.publish_raw(ok, 1), 201)
    assert_error(node.publish_raw(ok + [uniq("m")], 1), 400, "too_many_channels")


def test_max_channels_flag(start_node):
    n = start_node("--max-channels", "2")
    chans = [uniq() for _ in range(3)]
    assert_json_ok(n.publish_raw(chans[:2], 1), 201)
    assert_error(n.publish_raw(chans, 1), 400, "too_many_channels")
    assert_error(n.subscribe_raw(chans, timeout=0), 400, "too_many_channels")
    n.subscribe(chans[:2])
    # duplicates are folded before counting
    n.subscribe([chans[0], chans[0], chans[1]])


def test_message_size_limit_default(node):
    ch = uniq("big")
    assert_json_ok(node.publish_raw([ch], "x" * 60000), 201)
    assert_error(node.publish_raw([ch], "x" * 70000), 413, "too_large")
    assert len(node.subscribe([ch], since="0")["messages"]) == 1


def test_body_size_limit_default(node):
    ch = uniq("body")
    # 20 messages of 60 KB each: every message fits, the body (~1.2 MB) does not
    msgs = [{"channels": [ch], "data": "y" * 60000} for _ in range(20)]
    assert_error(node.publish_batch(msgs), 413, "too_large")
    assert node.subscribe([ch], since="0")["messages"] == []
    node.alive_check()


def test_size_limit_flags(start_node):
    n = start_node("--max-body-bytes", "2000", "--max-message-bytes", "300")
    ch = uniq("lim")
    assert_json_ok(n.publish_raw([ch], "a" * 200), 201)
    assert_error(n.publish_raw([ch], "a" * 400), 413, "too_large")
    msgs = [{"channels": [ch], "data": "b" * 200} for _ in range(12)]  # ~2.9 KB body
    assert_error(n.publish_batch(msgs), 413, "too_large")
    assert [m["data"] for m in n.subscribe([ch], since="0")["messages"]] == ["a" * 200]


def test_publish_with_duplicate_channel_names_is_one_message(node):
    ch = uniq("dup")
    r = node.publish_raw([ch, ch], "once")  # docs/api.md: repeated channels fold into one
    assert_json_ok(r, 201)
    got = node.subscribe([ch], since="0")
    assert len(got["messages"]) == 1 and got["messages"][0]["channels"] == [ch]


def test_publish_serialised_json_is_valid(node):
    """What a subscriber receives is strict JSON (no NaN etc.), even for odd inputs."""
    ch = uniq("strict")
    node.publish([ch], {"f": 1e308, "neg": -0.0, "s": "\u2028\u2029"})
    r = node.subscribe_raw([ch], since="0")
    json.loads(r.body, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_multi_channel_publish_with_one_bad_name_publishes_nothing(node):
    good = uniq("good")
    assert_error(node.publish_raw([good, "bad name"], 1), 400, "bad_channel_name")
    assert node.subscribe([good], since="0")["messages"] == []
