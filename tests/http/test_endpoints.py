"""pushup/http/handlers.py through the HTTP front: every endpoint's answers and errors,
as API.md says.

Raw HTTP through the node's real Front and HTTPProtocol over a
StringTransport (see conftest.py); time is a ``task.Clock``.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from urllib.parse import quote

import pytest

from pushup.core.model import Draft
from pushup.http.tokens import issue

START = 1_763_800_000.0
TOKEN = "s3cret-token"
ORIGIN = "https://app.example"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def enc(name: str) -> str:
    return quote(name, safe="")


# -- routing ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["//", "/nope", "/publish/", "/channels/a/b",
                                  "/channels/a/renew/x",
                                  "/subscribe/x", "/health/"])
def test_unknown_path_is_404_not_found(node, check_error, path):
    check_error(node.get(path), 404, "not_found")


@pytest.mark.parametrize("method, path, allowed", [
    ("GET", "/publish", "POST"),
    ("PUT", "/publish", "POST"),
    ("POST", "/subscribe", "GET, HEAD"),
    ("DELETE", "/subscribe?channels=a", "GET, HEAD"),
    ("GET", "/channels", "POST"),
    ("PUT", "/channels/a", "GET, HEAD, DELETE"),
    ("POST", "/channels/a", "GET, HEAD, DELETE"),
    ("GET", "/channels/a/renew", "POST"),
    ("POST", "/health", "GET, HEAD"),
    ("DELETE", "/stats", "GET, HEAD"),
    ("POST", "/metrics", "GET, HEAD"),
])
def test_wrong_method_is_405_with_allow_header(node, check_error, method, path, allowed):
    response = node.request(method, path, b"" if method in ("POST", "PUT") else None)
    check_error(response, 405, "method_not_allowed")
    assert response.header("allow") == allowed


def test_server_header_names_no_version(make_node, check_error):
    node = make_node(max_body_bytes=50)
    for response in (node.get("/health"), node.get("/nope"), node.publish("a", 1),
                     node.request("DELETE", "/channels/a")):
        assert response.header("server") == "PushUp", response.headers
    big = node.open("POST", "/publish", b"x" * 60, {"Expect": "100-continue"})
    assert big.response.header("server") == "PushUp"


def test_responses_are_json_utf8_and_not_cached(node):
    response = node.publish("a", "é")
    assert response.header("content-type") == "application/json; charset=utf-8"
    assert response.header("cache-control") == "no-store"
    assert int(response.header("content-length")) == len(response.body)


# -- publish ---------------------------------------------------------------


def test_publish_returns_201_with_id_timestamp_and_channels(node):
    response = node.publish(["author:John", "tag:c++", "tag:java"], {"title": "hi"})
    assert response.status == 201
    body = response.json
    assert set(body) == {"id", "timestamp", "channels"}
    assert isinstance(body["id"], str) and body["id"]
    assert body["timestamp"] == START
    assert body["channels"] == ["author:John", "tag:c++", "tag:java"]


def test_a_receipt_is_its_fields_whatever_the_channel_names_and_data(node):
    # names that spell the data's key, quote it or end in a backslash; data that repeats it
    channels = ["data", 'a"data":"b', "c\\", 'd":']
    data = {"x": ',"data":', "data": [1, {"y": 2, "data": 3}]}  # its JSON has ,"data": too
    response = node.publish(channels, data)
    assert response.status == 201
    assert response.json == {"id": response.json["id"], "timestamp": START,
                             "channels": channels}
    pulled = node.get("/subscribe?channels=data&since=0&timeout=0").json["messages"]
    assert pulled == [{**response.json, "channels": ["data"], "data": data}]


def test_publish_folds_duplicate_channels(node):
    assert node.publish(["a", "b", "a"], 1).json["channels"] == ["a", "b"]


def test_publish_timestamp_has_microseconds(node):
    node.clock.advance(0.123456)
    response = node.publish("a", 1)
    assert b'"timestamp":1763800000.123456' in response.body


def test_batch_publish_returns_receipts_in_order(node):
    response = node.post("/publish", {"messages": [{"channels": ["a"], "data": 1},
                                                   {"channels": ["a", "b"], "data": 2}]})
    assert response.status == 201
    receipts = response.json["messages"]
    assert [r["channels"] for r in receipts] == [["a"], ["a", "b"]]
    assert receipts[0]["id"] != receipts[1]["id"]
    assert receipts[0]["timestamp"] < receipts[1]["timestamp"]
    answer = node.subscribe("a,b", since=0, timeout=0).response
    assert [m["data"] for m in answer.json["messages"]] == [1, 2]


def test_message_ids_are_unique(node):
    seen = {node.publish("a", i).json["id"] for i in range(50)}
    assert len(seen) == 50


def test_timestamps_never_go_backwards_when_the_clock_does(node):
    first = node.publish("a", 1).json["timestamp"]
    node.clock.advance(-10)
    second = node.publish("a", 2).json["timestamp"]
    assert second > first


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": "x"},
    {"messages": [{"channels": ["a"], "data": 1}], "channels": ["a"]},
    {"messages": [{"channels": ["a"], "data": 1}], "data": 1},
    {"messages": [{"channels": ["a"]}]},
    {"messages": [1]},
    {"channels": ["a"]},
    {"data": 1},
    {"channels": "a", "data": 1},
    {"channels": [], "data": 1},
    {"channels": None, "data": 1},
])
def test_malformed_publish_is_400_bad_parameter(node, check_error, body):
    check_error(node.post("/publish", body), 400, "bad_parameter")
    assert node.stats()["published"] == 0


@pytest.mark.parametrize("raw", [
    b"", b"   ", b"{", b"not json", b'{"channels": ["a"], "data": 1,}',
    b"[]", b"1", b'"text"', b"null",
    b'{"channels": ["a"], "data": "\xff\xfe"}',  # invalid UTF-8
    b'{"channels": ["a"], "data": NaN}',
    b'{"channels": ["a"], "data": Infinity}',
    b'{"channels": ["a"], "data": -Infinity}',
    b'{"channels": ["a"], "data": 1e400}',  # parses to inf: not JSON-encodable
    b'{"channels": ["a"], "data": "\\ud800"}',  # lone surrogate
    b'{"channels": ["a"], "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
])
def test_bad_json_body_is_400_bad_json(node, check_error, raw):
    check_error(node.post("/publish", raw), 400, "bad_json")
    assert node.stats()["published"] == 0


@pytest.mark.parametrize("name", ["", "a b", "a,b", "a\tb", "tab\x01", "x" * 201, "\u00a0nbsp",
                                  "del\x7f", 5, None, ["a"]])
def test_publish_with_bad_channel_name_is_400(node, check_error, name):
    check_error(node.publish([name], 1), 400, "bad_channel_name")


def test_channel_name_of_200_characters_is_accepted(node):
    assert node.publish(["x" * 200], 1).status == 201


def test_publish_to_too_many_channels_is_400(make_node, check_error):
    node = make_node(max_channels=3)
    assert node.publish(["a", "b", "c"], 1).status == 201
    check_error(node.publish(["a", "b", "c", "d"], 1), 400, "too_many_channels")


def test_message_over_the_size_limit_is_413(make_node, check_error):
    node = make_node(max_message_bytes=10)
    assert node.publish("a", "12345678").status == 201  # 10 bytes serialised
    check_error(node.publish("a", "123456789"), 413, "too_large")


def test_batch_with_one_bad_message_publishes_nothing(node, check_error):
    held = node.subscribe("a", timeout=30)
    response = node.post("/publish", {"messages": [{"channels": ["a"], "data": 1},
                                                   {"channels": ["a", ""], "data": 2}]})
    check_error(response, 400, "bad_channel_name")
    assert held.response is None
    stats = node.stats()
    assert (stats["published"], stats["messages"]) == (0, 0)
    assert node.subscribe("a", since=0, timeout=0).response.json["messages"] == []


def test_bad_request_does_not_disturb_held_subscriptions(node):
    held = node.subscribe("a", timeout=30)
    node.post("/publish", b"{garbage")
    node.post("/publish", {"channels": ["a"]})
    node.get("/subscribe?channels=a&since=nan")
    assert held.response is None
    node.publish("a", "ok")
    assert [m["data"] for m in held.response.json["messages"]] == ["ok"]


# -- body limits -----------------------------------------------------------


def test_body_at_the_limit_is_accepted(make_node):
    node = make_node(max_body_bytes=100)
    body = json.dumps({"channels": ["a"], "data": ""}).encode()
    body = body[:-1] + b" " * (100 - len(body)) + b"}"
    assert len(body) == 100
    assert node.post("/publish", body).status == 201


def test_body_over_the_limit_by_content_length_is_413(make_node, check_error):
    node = make_node(max_body_bytes=100)
    conn = node.open("POST", "/publish", b" " * 101)
    response = conn.response
    check_error(response, 413, "too_large")
    assert response.header("connection") == "close"
    assert node.stats()["published"] == 0


def test_body_over_the_limit_chunked_is_413(make_node, check_error):
    node = make_node(max_body_bytes=100)
    conn = node.connect()
    chunk = b" " * 60
    conn.send(b"POST /publish HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              + (b"%x\r\n%s\r\n" % (len(chunk), chunk)) * 2 + b"0\r\n\r\n")
    check_error(conn.response, 413, "too_large")


def test_chunked_body_under_the_limit_is_accepted(make_node):
    node = make_node(max_body_bytes=100)
    conn = node.connect()
    body = b'{"channels":["a"],"data":1}'
    conn.send(b"POST /publish HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    assert conn.response.status == 201


def test_oversized_body_announced_with_expect_continue_is_refused_at_once(make_node,
                                                                          check_error):
    node = make_node(max_body_bytes=100)
    conn = node.connect()
    conn.send(b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
              b"Expect: 100-continue\r\n\r\n")  # the body is never sent
    check_error(conn.response, 413, "too_large")
    assert b"100 Continue" not in conn.transport.value()
    assert conn.transport.disconnecting


def test_huge_body_is_cut_off_once_past_the_discard_cap(make_node, check_error):
    node = make_node(max_body_bytes=100)
    conn = node.connect()
    conn.send(b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: 40000000\r\n\r\n")
    conn.send(b" " * (17 * 1024 * 1024))  # past DISCARD_CAP: the server stops reading
    check_error(conn.response, 413, "too_large")
    assert conn.transport.disconnecting


def test_body_limit_applies_to_channel_endpoints(make_node, check_error):
    node = make_node(max_body_bytes=20)
    check_error(node.post("/channels", {"name": "x" * 30}), 413, "too_large")


def test_malformed_http_gets_the_json_error_body(node, check_error):
    # API.md: every 4xx/5xx response has the {"error": {...}} body.
    conn = node.connect()
    conn.send(b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
    response = conn.response
    assert response is not None and response.status == 400
    check_error(response, 400, None)


# -- subscribe -------------------------------------------------------------


def test_subscribe_without_channels_is_400(node, check_error):
    check_error(node.get("/subscribe"), 400, "bad_parameter")
    check_error(node.get("/subscribe?since=0"), 400, "bad_parameter")


@pytest.mark.parametrize("channels", ["", "a,,b", ",a", "a%20b", "%09", "x" * 201])
def test_subscribe_with_bad_channel_name_is_400(node, check_error, channels):
    check_error(node.get(f"/subscribe?channels={channels}"), 400, "bad_channel_name")


def test_subscribe_to_too_many_channels_is_400(make_node, check_error):
    node = make_node(max_channels=3)
    assert node.get("/subscribe?channels=a,b,c&timeout=0").status == 200
    assert node.get("/subscribe?channels=a,b,c,a&timeout=0").status == 200  # folded
    check_error(node.get("/subscribe?channels=a,b,c,d&timeout=0"), 400, "too_many_channels")


@pytest.mark.parametrize("since", ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "",
                                   "garbage", "c1.!!!", "c1.bm90IGEgY3Vyc29y", "0x10"])
def test_bad_since_is_400(node, check_error, since):
    check_error(node.get(f"/subscribe?channels=a&timeout=0&since={enc(since)}"),
                400, "bad_parameter")


@pytest.mark.parametrize("until", ["nan", "inf", "", "soon"])
def test_bad_until_is_400(node, check_error, until):
    check_error(node.get(f"/subscribe?channels=a&timeout=0&until={enc(until)}"),
                400, "bad_parameter")


@pytest.mark.parametrize("timeout", ["-1", "-0.001", "abc", "", "nan", "1s"])
def test_bad_timeout_is_400(node, check_error, timeout):
    check_error(node.get(f"/subscribe?channels=a&timeout={enc(timeout)}"), 400, "bad_parameter")


@pytest.mark.parametrize("limit", ["0", "-1", "abc", "", "1.5", "nan"])
def test_bad_limit_is_400(node, check_error, limit):
    check_error(node.get(f"/subscribe?channels=a&timeout=0&limit={enc(limit)}"),
                400, "bad_parameter")


@pytest.mark.parametrize("query", ["channels=a&channels=b", "channels=a&since=0&since=1",
                                   "channels=a&timeout=0&timeout=1",
                                   "channels=a&timeout=0&limit=1&limit=2",
                                   "channels=a&timeout=0&until=1&until=2"])
def test_repeated_parameter_is_400(node, check_error, query):
    check_error(node.get(f"/subscribe?{query}"), 400, "bad_parameter")


@pytest.mark.parametrize(("bound", "answered"), [("since", [2]), ("until", [1])],
                         ids=["since-a-time-is-strictly-after-it",
                              "until-a-time-is-at-or-before-it"])
def test_a_time_bound_keeps_the_messages_on_its_side(node, bound, answered):
    node.publish("a", 1)  # at START
    node.clock.advance(1)
    node.publish("a", 2)
    answer = node.get(f"/subscribe?channels=a&timeout=0&{bound}={START}")
    assert [m["data"] for m in answer.json["messages"]] == answered


def test_empty_cursor_is_a_valid_since(node):
    node.publish("a", 1)
    answer = node.get("/subscribe?channels=a&timeout=0&since=c1.")
    assert [m["data"] for m in answer.json["messages"]] == [1]


def test_cursor_from_a_response_is_accepted_as_since(node):
    node.publish("a", 1)
    cursor = node.get("/subscribe?channels=a&timeout=0").json["cursor"]
    node.publish("a", 2)
    answer = node.get(f"/subscribe?channels=a&timeout=0&since={enc(cursor)}")
    assert [m["data"] for m in answer.json["messages"]] == [2]


def test_default_limit_is_100(node):
    node.post("/publish", {"messages": [{"channels": ["a"], "data": i} for i in range(101)]})
    assert len(node.get("/subscribe?channels=a&timeout=0").json["messages"]) == 100


def test_limit_pages_through_messages(node):
    for i in range(5):
        node.publish("a", i)
    first = node.get("/subscribe?channels=a&timeout=0&limit=2").json
    assert [m["data"] for m in first["messages"]] == [0, 1]
    second = node.get(f"/subscribe?channels=a&timeout=0&limit=2&since={enc(first['cursor'])}")
    assert [m["data"] for m in second.json["messages"]] == [2, 3]


def test_limit_above_the_maximum_is_capped(make_node):
    node = make_node(max_limit=3)
    for i in range(5):
        node.publish("a", i)
    answer = node.get("/subscribe?channels=a&timeout=0&limit=1000")
    assert answer.status == 200
    assert len(answer.json["messages"]) == 3


def test_huge_limit_is_capped_not_refused(make_node):
    node = make_node(max_limit=3)
    node.publish("a", 1)
    answer = node.get("/subscribe?channels=a&timeout=0&limit=" + "9" * 20)
    assert answer.status == 200, answer  # API.md: above the maximum is capped, not refused


def test_timeout_above_the_maximum_is_capped(make_node):
    node = make_node(max_timeout=10)
    for timeout in ("1000", "1" + "0" * 20):
        held = node.subscribe("a", timeout=timeout)
        assert held.response is None
        node.clock.advance(10)
        assert held.response.status == 200


def test_default_timeout_is_50_seconds(node):
    held = node.open("GET", "/subscribe?channels=a")
    node.clock.advance(49.99)
    assert held.response is None
    node.clock.advance(0.01)
    assert held.response is not None


def test_subscribe_response_shape(node):
    node.publish("a", {"k": [1, 2]})
    body = node.get("/subscribe?channels=a&timeout=0").json
    assert set(body) <= {"messages", "cursor", "closed", "gap"}
    assert {"messages", "cursor", "closed"} <= set(body)
    (message,) = body["messages"]
    assert set(message) == {"id", "timestamp", "channels", "data"}
    assert message["data"] == {"k": [1, 2]}


def test_non_utf8_parameter_is_400(node, check_error):
    check_error(node.get("/subscribe?channels=%FF"), 400, "bad_parameter")


# -- channel names in paths and queries ------------------------------------


@pytest.mark.parametrize("name", ["tag:c++", "author:John", "a/b", "ümlaut", "x" * 200,
                                  "?query#hash", "%41"])
def test_url_encoded_channel_names_work_in_paths_and_queries(node, name):
    created = node.post("/channels", {"name": name})
    assert created.status == 201, created
    assert created.json["channel"] == name
    node.publish(name, 1)
    info = node.get(f"/channels/{enc(name)}")
    assert info.status == 200, info
    assert info.json["channel"] == name
    assert info.json["messages"] == 1
    answer = node.get(f"/subscribe?channels={enc(name)}&timeout=0")
    assert answer.json["messages"][0]["channels"] == [name]
    assert node.post(f"/channels/{enc(name)}/renew").status == 200
    assert node.request("DELETE", f"/channels/{enc(name)}").status == 204


def test_unencoded_colon_and_plus_in_a_path_are_literal(node):
    node.publish(["tag:c++", "author:John"], 1)
    assert node.get("/channels/tag:c++").json["channel"] == "tag:c++"
    assert node.get("/channels/author:John").json["channel"] == "author:John"


@pytest.mark.parametrize("segment", ["a%20b", "a%2Cb", "a%09b", "%00", "x" * 201, "%FF"])
def test_bad_channel_name_in_path_is_400(node, check_error, segment):
    check_error(node.get(f"/channels/{segment}"), 400, "bad_channel_name")


# -- channels --------------------------------------------------------------


def test_create_channel_with_a_name(node):
    response = node.post("/channels", {"name": "room", "ttl": 60})
    assert response.status == 201
    assert response.json == {"channel": "room", "expires_at": START + 60}


def test_create_channel_uses_the_default_ttl(make_node):
    node = make_node(channel_ttl=90)
    assert node.post("/channels", {"name": "room"}).json["expires_at"] == START + 90


def test_create_channel_without_a_name_generates_unique_ones(node):
    names = {node.post("/channels", body).json["channel"]
             for body in (None, {}, {"ttl": 5}, b"")}
    assert len(names) == 4
    for name in names:
        assert node.get(f"/channels/{enc(name)}").status == 200


def test_create_taken_channel_is_409(node, check_error):
    assert node.post("/channels", {"name": "room"}).status == 201
    check_error(node.post("/channels", {"name": "room"}), 409, "channel_exists")


def test_create_channel_made_by_a_publish_is_409(node, check_error):
    node.publish("implicit", 1)
    check_error(node.post("/channels", {"name": "implicit"}), 409, "channel_exists")


@pytest.mark.parametrize("ttl", [0, -1, "60", True, None.__class__.__name__, 366 * 86400 + 1,
                                 [60]])
def test_create_channel_with_bad_ttl_is_400(node, check_error, ttl):
    check_error(node.post("/channels", {"name": "room", "ttl": ttl}), 400, "bad_parameter")


@pytest.mark.parametrize("name", [5, ["a"], "", "a b", "a,b"])
def test_create_channel_with_bad_name_is_400(node, check_error, name):
    check_error(node.post("/channels", {"name": name}), 400, "bad_channel_name")


@pytest.mark.parametrize("raw", [b"[]", b"{", b'{"ttl": NaN}'])
def test_create_channel_with_bad_body_is_400_bad_json(node, check_error, raw):
    check_error(node.post("/channels", raw), 400, "bad_json")


def test_renew_channel(node):
    node.post("/channels", {"name": "room", "ttl": 60})
    node.clock.advance(30)
    response = node.post("/channels/room/renew", {"ttl": 100})
    assert response.status == 200
    assert response.json == {"channel": "room", "expires_at": START + 130}
    node.clock.advance(10)
    # No ttl: the channel's own ttl (now 100) again.
    assert node.post("/channels/room/renew").json["expires_at"] == START + 140


def test_renew_unknown_channel_is_404(node, check_error):
    check_error(node.post("/channels/ghost/renew", {"ttl": 10}), 404, "no_such_channel")


def test_renew_with_bad_ttl_is_400(node, check_error):
    node.post("/channels", {"name": "room"})
    check_error(node.post("/channels/room/renew", {"ttl": -5}), 400, "bad_parameter")


def test_delete_channel_is_204_without_body(node):
    node.publish("room", 1)
    response = node.request("DELETE", "/channels/room")
    assert response.status == 204
    assert response.body == b""
    assert response.header("content-type") is None
    assert node.get("/channels/room").status == 404


def test_delete_unknown_channel_is_404(node, check_error):
    check_error(node.request("DELETE", "/channels/ghost"), 404, "no_such_channel")


def test_channel_info(node):
    node.publish("room", 1)
    node.publish(["room", "other"], 2)
    held = [node.subscribe("room", timeout=30, since=START + 100) for _ in range(2)]
    assert all(h.response is None for h in held)
    response = node.get("/channels/room")
    assert response.status == 200
    assert response.json == {"channel": "room", "expires_at": START + 3600,
                             "messages": 2, "subscribers": 2}


def test_channel_info_of_unknown_channel_is_404(node, check_error):
    check_error(node.get("/channels/ghost"), 404, "no_such_channel")


def test_head_channel_info_has_no_body(node):
    node.publish("room", 1)
    response = node.request("HEAD", "/channels/room")
    assert response.status == 200
    assert response.body == b""


# -- authorization ---------------------------------------------------------


PROTECTED = [
    ("POST", "/publish", {"channels": ["a"], "data": 1}, 201),
    ("POST", "/channels", {"name": "new"}, 201),
    ("GET", "/channels/room", None, 200),
    ("HEAD", "/channels/room", None, 200),
    ("POST", "/channels/room/renew", {"ttl": 10}, 200),
    ("DELETE", "/channels/room", None, 204),
]


@pytest.fixture
def guarded(make_node):
    node = make_node(publish_token=TOKEN)
    node.service.store.create("room", None, node.service.now())  # not through HTTP auth
    node.service.rearm()
    return node


@pytest.mark.parametrize("method, path, body, ok", PROTECTED)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN])
def test_protected_endpoint_without_valid_token_is_401(guarded, check_error, method, path,
                                                       body, ok, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = guarded.request(method, path, body, headers=headers)
    if method == "HEAD":
        assert response.status == 401
    else:
        check_error(response, 401, "unauthorized")
    assert guarded.stats()["published"] == 0
    assert guarded.service.store.channel("room") is not None  # nothing was deleted


@pytest.mark.parametrize("method, path, body, ok", PROTECTED)
def test_protected_endpoint_with_the_token_succeeds(guarded, method, path, body, ok):
    assert guarded.request(method, path, body, headers=AUTH).status == ok


def test_subscribe_needs_no_token(guarded):
    guarded.service.publish([Draft(("a",), b"1")])
    answer = guarded.get("/subscribe?channels=a&timeout=0")
    assert answer.status == 200
    assert len(answer.json["messages"]) == 1


def test_operations_endpoints_need_no_token(guarded):
    for path in ("/health", "/stats", "/metrics"):
        assert guarded.get(path).status == 200


def test_without_a_token_configured_publishing_is_open(node):
    assert node.publish("a", 1).status == 201
    assert node.get("/channels/a").status == 200


# -- CORS ------------------------------------------------------------------


@pytest.fixture
def cors(make_node):
    return make_node(cors_origin=(ORIGIN,), publish_token=TOKEN, max_body_bytes=100,
                     max_timeout=5)


def test_cors_header_on_every_kind_of_response(cors):
    held = cors.subscribe("a", timeout=5)
    responses = [
        cors.get("/health"),
        cors.get("/stats"),
        cors.get("/metrics"),
        cors.publish("a", 1, headers=AUTH),                          # 201
        cors.get("/subscribe?channels=a&timeout=0"),                 # 200
        cors.publish("a", 1),                                        # 401
        cors.get("/nope"),                                           # 404
        cors.get("/channels/ghost", headers=AUTH),                   # 404
        cors.request("PUT", "/publish", b""),                        # 405
        cors.get("/subscribe?channels=a&since=nan"),                 # 400
        cors.post("/publish", b"{", headers=AUTH),                   # 400
        cors.post("/channels", {"name": "a"}, headers=AUTH),         # 409
        cors.request("DELETE", "/channels/a", headers=AUTH),         # 204
        cors.open("POST", "/publish", b" " * 101, AUTH).response,    # 413
        cors.open("POST", "/publish", b" " * 101,                    # 413 at once
                  {**AUTH, "Expect": "100-continue"}).response,
    ]
    cors.clock.advance(5)
    responses.append(held.response)                                  # a held one, answered
    cors.service.drain()
    responses.append(cors.get("/health"))                            # 503
    for response in responses:
        assert response is not None
        assert response.header("access-control-allow-origin") == ORIGIN, response


def test_cors_header_on_timed_out_subscribe(cors):
    held = cors.subscribe("a", timeout=5)
    cors.clock.advance(5)
    assert held.response.json["messages"] == []
    assert held.response.header("access-control-allow-origin") == ORIGIN


def test_cors_star_is_sent_as_star(make_node):
    node = make_node(cors_origin=("*",))
    assert node.get("/health").header("access-control-allow-origin") == "*"


@pytest.mark.parametrize("path", ["/publish", "/subscribe?channels=a", "/channels",
                                  "/channels/room", "/channels/room/renew", "/health"])
def test_options_is_a_204_preflight_without_token(cors, path):
    response = cors.request("OPTIONS", path, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert response.status == 204
    assert response.body == b""
    assert response.header("access-control-allow-origin") == ORIGIN
    assert "POST" in response.header("access-control-allow-methods")
    allowed = response.header("access-control-allow-headers").lower()
    assert "authorization" in allowed and "content-type" in allowed


def test_options_on_any_path_is_a_204_preflight(cors):
    # API.md: "OPTIONS on any path is a 204 preflight answer".
    response = cors.request("OPTIONS", "/not/a/route")
    assert response.status == 204, response
    assert response.header("access-control-allow-origin") == ORIGIN


@pytest.mark.parametrize("path, allowed", [("/publish", "POST"),
                                           ("/subscribe?channels=a", "GET, HEAD"),
                                           ("/channels/room", "GET, HEAD, DELETE")])
def test_options_without_cors_is_405(node, check_error, path, allowed):
    response = node.request("OPTIONS", path)
    check_error(response, 405, "method_not_allowed")
    assert response.header("allow") == allowed


SEVERAL = ("http://localhost:8000", "http://127.0.0.1:8000")


def test_several_cors_origins_each_answer_names_the_pages_own(make_node):
    node = make_node(cors_origin=SEVERAL, max_timeout=5)
    for origin in SEVERAL:
        for response in (node.get("/health", headers={"Origin": origin}),
                         node.request("OPTIONS", "/publish", headers={"Origin": origin}),
                         node.publish("a", 1, headers={"Origin": origin})):
            assert response.header("access-control-allow-origin") == origin, response
            assert response.header("vary") == "Origin", response
    stranger = node.get("/health", headers={"Origin": "http://evil.example"})
    assert stranger.header("access-control-allow-origin") is None
    assert stranger.header("vary") == "Origin"
    check_forbidden = node.publish("a", 1, headers={"Origin": "http://evil.example"})
    assert check_forbidden.status == 403


def test_several_cors_origins_on_held_polls_and_streams(make_node):
    node = make_node(cors_origin=SEVERAL, max_timeout=5)
    polls = [node.open("GET", "/subscribe?channels=a&timeout=5", headers={"Origin": o})
             for o in SEVERAL]
    stream = node.open("GET", "/subscribe?channels=a", headers={
        "Origin": SEVERAL[1], "Accept": "text/event-stream"})
    assert node.publish("a", 1).status == 201
    for poll, origin in zip(polls, SEVERAL, strict=True):
        assert poll.response.json["messages"][0]["data"] == 1  # a fan-out's answer...
        assert poll.response.header("access-control-allow-origin") == origin  # ...per page
    head = stream.transport.value().partition(b"\r\n\r\n")[0].decode()
    assert f"\r\nAccess-Control-Allow-Origin: {SEVERAL[1]}\r\n" in head


def test_no_cors_header_when_not_configured(node):
    for response in (node.get("/health"), node.get("/nope"), node.publish("a", 1)):
        assert response.header("access-control-allow-origin") is None


# -- operations ------------------------------------------------------------


def test_health_is_200_ok(node):
    response = node.get("/health")
    assert response.status == 200
    assert response.json["status"] == "ok"
    assert node.request("HEAD", "/health").status == 200


def test_get_root_is_a_json_index_of_the_endpoints(node):
    response = node.get("/")
    assert response.status == 200
    index = response.json
    assert index["service"] == "pushup"
    assert index["version"] == version("pushup")
    assert index["links"] == {
        "publish": "/publish", "subscribe": "/subscribe", "channels": "/channels",
        "channel": "/channels/{name}", "health": "/health", "stats": "/stats",
        "metrics": "/metrics", "client": "/pushup.js"}
    head = node.request("HEAD", "/")
    assert (head.status, head.body) == (200, b"")


def test_with_an_admin_port_the_index_lists_only_what_the_client_port_serves(make_node):
    node = make_node(admin_port=9001)  # not bound: the harness drives the client front only
    links = node.get("/").json["links"]
    assert "stats" not in links and "metrics" not in links
    for path in links.values():
        if "{" not in path:
            assert node.get(path).status != 404, path


def test_head_subscribe_answers_what_a_get_would_now_without_holding(node):
    node.publish("a", 1)
    get = node.get("/subscribe?channels=a&since=0")
    head = node.request("HEAD", "/subscribe?channels=a&since=0")
    assert (head.status, head.body) == (200, b"")
    assert head.header("content-length") == str(len(get.body))
    empty = node.request("HEAD", "/subscribe?channels=a&timeout=30")  # not held: at once
    assert empty.status == 200
    delivered = node.stats()["delivered"]
    node.request("HEAD", "/subscribe?channels=a&since=0")
    node.request("HEAD", "/subscribe?channels=never&since=now")
    assert node.stats()["delivered"] == delivered  # a HEAD delivers nothing
    assert node.get("/channels/never").status == 404  # ...and creates no channel
    assert node.request("HEAD", "/subscribe?channels=a&since=nan").status == 400


def test_head_subscribe_checks_the_token(make_node):
    node = make_node(subscribe_secret="k" * 32)
    assert node.request("HEAD", "/subscribe?channels=a").status == 401
    token = issue("k" * 32, ["a"], START + 60)
    assert node.request("HEAD", f"/subscribe?channels=a&token={token}").status == 200


def test_health_is_503_while_draining(node, check_error):
    node.service.drain()
    check_error(node.get("/health"), 503, "shutting_down")


class OutsideEngine:
    """The node's backplane, plus an outside engine whose probe we decide."""

    def __init__(self, inner, probe):
        self.inner, self.probe = inner, probe

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_health_is_503_engine_unavailable_while_the_outside_engine_does_not_answer(
        node, check_error):
    from twisted.internet import defer

    from pushup.core import errors

    handlers = node.node.handlers
    asked = []
    unanswered = defer.Deferred()
    handlers.backplane = OutsideEngine(handlers.backplane,
                                       lambda: asked.append(1) or unanswered)
    conn = node.open("GET", "/health")
    assert conn.response is None  # waits for the engine's answer
    unanswered.errback(errors.EngineUnavailable("Redis is unreachable"))
    check_error(conn.response, 503, "engine_unavailable")
    handlers.backplane = OutsideEngine(handlers.backplane.inner,
                                       lambda: defer.succeed(None))
    assert node.get("/health").status == 200
    assert asked == [1]


def test_health_is_200_with_each_part_of_the_outside_engine_while_some_part_serves(node):
    from twisted.internet import defer

    handlers = node.node.handlers
    primaries = [{"address": "10.0.0.1:7000", "state": "up", "slots": 8192},
                 {"address": "10.0.0.2:7000", "state": "down", "slots": 8192}]
    handlers.backplane = OutsideEngine(
        handlers.backplane, lambda: defer.succeed({"redis": {"primaries": primaries}}))
    response = node.get("/health")
    assert response.status == 200
    assert response.json == {"status": "ok", "node_id": node.node.service.store.node_id,
                             "redis": {"primaries": primaries}}


def test_connections_over_the_limit_are_answered_503_overloaded(make_node, check_error):
    node = make_node(max_connections=2, cors_origin=("*",))
    first, second = node.connect(), node.connect()
    third = node.connect()
    response = third.response  # answered on connect, before any request
    check_error(response, 503, "overloaded")
    assert response.header("server") == "PushUp"
    assert response.header("access-control-allow-origin") == "*"
    third.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert third.lost
    first.close()
    second.close()
    stats = node.stats()
    assert stats["refused"] == 1
    assert stats["connections"] == 1  # the /stats request's own
    assert node.clock.getDelayedCalls() == []  # the refusal's timer went with it


# -- pages of other origins (a browser's no-cors POST carries Origin) -------


FORGED = {"Origin": "https://evil.example", "Content-Type": "text/plain"}


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/publish", {"channels": ["a"], "data": 1}),
    ("POST", "/channels", {"name": "made-by-a-page"}),
    ("POST", "/channels/a/renew", None),
    ("DELETE", "/channels/a", None),
    ("GET", "/channels/a", None),
])
def test_a_page_of_another_origin_cannot_publish_or_manage_channels(node, check_error,
                                                                    method, path, body):
    node.publish("a", 0)
    response = node.request(method, path, body, headers=FORGED)
    check_error(response, 403, "forbidden")
    assert node.stats()["published"] == 1
    assert node.get("/channels/a").status == 200


def test_a_page_of_the_allowed_origin_may_publish(make_node):
    node = make_node(cors_origin=("https://app.example",))
    response = node.publish("a", 1, headers={"Origin": "https://app.example"})
    assert response.status == 201
    assert response.header("access-control-allow-origin") == "https://app.example"


def test_a_page_served_by_the_node_itself_may_publish(node):
    response = node.publish("a", 1, headers={"Origin": "http://pushup.test"})  # Host
    assert response.status == 201


def test_a_page_with_the_token_may_publish_from_anywhere(make_node):
    node = make_node(publish_token=TOKEN)
    response = node.publish("a", 1, headers={**FORGED, **AUTH})
    assert response.status == 201


def test_subscribing_from_another_origin_stays_open(node):
    node.publish("a", 1)
    response = node.get("/subscribe?channels=a&timeout=0", headers=FORGED)
    assert [m["data"] for m in response.json["messages"]] == [1]


# -- since=now ---------------------------------------------------------------


def test_since_now_skips_what_is_cached_and_its_cursor_continues(node):
    node.publish("a", "old")
    first = node.subscribe("a", since="now", timeout=0).response.json
    assert first["messages"] == []
    node.publish("a", "new")
    after = node.subscribe("a", since=first["cursor"], timeout=0).response.json
    assert [m["data"] for m in after["messages"]] == ["new"]


def test_a_poll_held_since_now_gets_only_the_next_message(node):
    node.publish("a", "old")
    held = node.subscribe("a", since="now", timeout=30)
    assert held.response is None
    node.publish("a", "next")
    node.turn()
    assert [m["data"] for m in held.response.json["messages"]] == ["next"]


def test_since_now_on_a_new_channel_waits(node):
    held = node.subscribe("fresh", since="now", timeout=30)
    assert held.response is None
    node.clock.advance(30)
    assert held.response.json["messages"] == []


# -- subscriber tokens (--subscribe-secret) -----------------------------------

SUB_SECRET = "a-subscribe-secret-of-at-least-32-bytes!"


@pytest.fixture
def private(make_node):
    return make_node(subscribe_secret=SUB_SECRET)


def grant(*channels: str, ttl: float = 600, secret: str = SUB_SECRET) -> str:
    from pushup.http.tokens import issue

    return issue(secret, channels, START + ttl)


def test_subscribe_without_a_token_is_401(private, check_error):
    check_error(private.get("/subscribe?channels=a&timeout=0"), 401, "unauthorized")


@pytest.mark.parametrize("token", ["not-a-jwt",
                                   grant("a", secret="another-secret-of-32-bytes-or-more")])
def test_subscribe_with_a_bad_token_is_401(private, check_error, token):
    check_error(private.get(f"/subscribe?channels=a&timeout=0&token={token}"), 401,
                "unauthorized")


def test_subscribe_with_a_token_in_the_query_or_a_bearer_header(private):
    private.publish("a", 1)
    by_query = private.get(f"/subscribe?channels=a&timeout=0&token={grant('a')}")
    by_header = private.get("/subscribe?channels=a&timeout=0",
                            headers={"Authorization": f"Bearer {grant('a')}"})
    for response in (by_query, by_header):
        assert [m["data"] for m in response.json["messages"]] == [1]


def test_a_channel_the_token_does_not_grant_is_403(private, check_error):
    token = grant("a", "room42:*")
    assert private.get(f"/subscribe?channels=room42:x,a&timeout=0&token={token}").status == 200
    check_error(private.get(f"/subscribe?channels=a,b&timeout=0&token={token}"), 403,
                "forbidden")
    check_error(private.get(f"/subscribe?channels=room4&timeout=0&token={token}"), 403,
                "forbidden")


def test_an_expired_token_is_401_even_when_checked_before(private, check_error):
    token = grant("a", ttl=10)
    assert private.get(f"/subscribe?channels=a&timeout=0&token={token}").status == 200
    private.clock.advance(10)
    check_error(private.get(f"/subscribe?channels=a&timeout=0&token={token}"), 401,
                "unauthorized")


def test_publishing_needs_no_subscribe_token(private):
    assert private.publish("a", 1).status == 201


# -- the browser client ------------------------------------------------------


def test_the_browser_client_is_served_as_a_javascript_module(make_node):
    node = make_node(cors_origin=("https://app.example",))
    response = node.get("/pushup.js")
    assert response.status == 200
    assert response.header("content-type") == "text/javascript; charset=utf-8"
    assert response.header("access-control-allow-origin") == "https://app.example"
    assert b"export function subscribe(" in response.body
    assert len(response.body) < 16 * 1024
