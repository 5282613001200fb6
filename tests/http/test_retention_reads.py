"""No read serves a message past --message-ttl, not even one that holds no
subscriber: a HEAD, an event stream's page. The sweep's timer runs on a
0.25 s grain; these reads come between a message's ttl and that timer."""

from __future__ import annotations

from tests.http.test_sse import events, stream


def _published_then_past_its_ttl(make_node):
    node = make_node(message_ttl=4.0)
    node.clock.advance(0.1)  # its ttl ends mid-way through the sweep's grain
    node.publish("a", "old")
    node.clock.advance(4.05)
    assert [c for c in node.clock.getDelayedCalls() if c.active()]  # the sweep is still to come
    return node


def test_a_head_past_a_messages_ttl_lists_no_message(make_node):
    node = _published_then_past_its_ttl(make_node)
    head = node.request("HEAD", "/subscribe?channels=a&since=0")
    got = node.request("GET", "/subscribe?channels=a&since=0&timeout=0")
    assert got.json["messages"] == [] and got.json["gap"] is True
    # the head a GET would get: the same length as that body, not one with the message
    assert head.status == 200 and head.header("content-length") == str(len(got.body))


def test_an_event_stream_past_a_messages_ttl_sends_a_gap_not_the_message(make_node):
    node = _published_then_past_its_ttl(make_node)
    conn = stream(node, "a", since=0)
    node.turn()
    got = events(conn)
    assert [e.get("event") for e in got] == ["gap"], got  # no message event
