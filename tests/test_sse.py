"""pushup/sse.py through the HTTP front: a subscribe with Accept: text/event-stream."""

from __future__ import annotations

import json

from tests.sse_client import parse_events

STREAM = {"Accept": "text/event-stream"}


def events(conn) -> list[dict[str, str]]:
    head, _, rest = conn.transport.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"Content-Type: text/event-stream" in head and b"Content-Length" not in head
    return parse_events(rest)


def stream(node, channels: str, headers=None, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return node.open("GET", f"/subscribe?channels={channels}&{query}",
                     headers={**STREAM, **(headers or {})})


def test_each_message_is_an_event_whose_id_is_the_cursor_after_it(node):
    node.publish("a", 1)
    node.publish("a", 2)
    conn = stream(node, "a")
    got = events(conn)
    assert [json.loads(e["data"])["data"] for e in got] == [1, 2]
    node.publish("a", 3)
    node.turn()
    got = events(conn)
    assert [json.loads(e["data"])["data"] for e in got] == [1, 2, 3]
    # a reconnect after the first event resumes exactly there
    again = stream(node, "a", headers={"Last-Event-ID": got[0]["id"]}, since=0)
    assert [json.loads(e["data"])["data"] for e in events(again)] == [2, 3]


def test_an_idle_stream_sends_heartbeat_comments(node):
    conn = stream(node, "a")
    assert events(conn) == []
    node.clock.advance(15)
    assert conn.transport.value().endswith(b"\r\n\r\n: keep-alive\n\n")
    assert not conn.transport.disconnecting


def test_a_gap_is_an_event(make_node):
    node = make_node(max_messages_per_channel=2)
    for i in range(5):
        node.publish("a", i)
    got = events(stream(node, "a", since=0))
    assert got[0]["event"] == "gap"
    assert [json.loads(e["data"])["data"] for e in got[1:]] == [3, 4]


def test_a_client_that_leaves_is_forgotten(node):
    conn = stream(node, "a")
    assert node.stats()["waiting"] == 1
    conn.close()
    assert node.stats()["waiting"] == 0


def test_drain_ends_the_stream(node):
    conn = stream(node, "a")
    node.node.service.drain()
    assert conn.transport.disconnecting


def test_since_now_streams_only_what_comes_next(node):
    node.publish("a", "old")
    conn = stream(node, "a", since="now")
    node.publish("a", "new")
    node.turn()
    assert [json.loads(e["data"])["data"] for e in events(conn)] == ["new"]
