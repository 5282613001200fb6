"""pushup/http/sse.py through the HTTP front: a subscribe with Accept: text/event-stream."""

from __future__ import annotations

import json
import time

import pytest
from twisted.internet.address import IPv4Address

from pushup.core.cursor import Cursor
from pushup.core.model import Draft
from pushup.http import tokens
from tests.conftest import Conn, _Transport, assert_error
from tests.sse_client import data_of, dechunk, parse_events

STREAM = {"Accept": "text/event-stream"}


def body(conn) -> tuple[bytes, bool]:
    """The stream's body so far, and whether it has ended (chunked on HTTP/1.1)."""
    head, _, rest = conn.transport.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    assert b"Content-Type: text/event-stream" in head and b"Content-Length" not in head
    if b"Transfer-Encoding: chunked" not in head:  # close-delimited (HTTP/1.0)
        return rest, conn.transport.disconnecting
    data, end = dechunk(rest)
    return data, end is not None


def events(conn) -> list[dict[str, str]]:
    return parse_events(body(conn)[0])


def named(conn, event: str) -> list[dict[str, str]]:
    return [e for e in events(conn) if e.get("event") == event]


def stream(node, channels: str, headers=None, **params):
    query = "".join(f"&{k}={v}" for k, v in params.items())
    return node.open("GET", f"/subscribe?channels={channels}{query}",
                     headers={**STREAM, **(headers or {})})


def ended(conn) -> bool:
    return body(conn)[1] and conn.transport.disconnecting


def assert_still_streaming_after(node, conn, seconds: float) -> None:
    """`seconds` after it opened, the stream of channel "a" still carries a message
    published then, and has not ended."""
    node.turn()
    node.clock.advance(seconds)
    node.publish("a", "in time")
    node.turn()
    assert data_of(events(conn)) == ["in time"] and not ended(conn)


def test_each_message_is_an_event_whose_id_is_the_cursor_after_it(node):
    node.publish("a", 1)
    node.publish("a", 2)
    conn = stream(node, "a")
    node.turn()
    got = [e for e in events(conn) if "event" not in e]
    assert data_of(got) == [1, 2]
    node.publish("a", 3)
    node.turn()
    got = [e for e in events(conn) if "event" not in e]
    assert data_of(got) == [1, 2, 3]
    # a reconnect after the first event resumes exactly there
    again = stream(node, "a", headers={"Last-Event-ID": got[0]["id"]}, since=0)
    node.turn()
    assert data_of(events(again)) == [2, 3]


def test_the_stream_names_its_position_before_any_message(node):
    node.publish("a", "old")
    conn = stream(node, "a", since="now")
    first = events(conn)
    assert [e["event"] for e in first] == ["cursor"]
    assert first[0]["id"] == first[0]["data"] and first[0]["id"].startswith("c1.")
    assert ended(conn) is False


def test_an_eventsource_that_reconnects_before_any_message_misses_nothing(node):
    conn = stream(node, "a", since="now")
    last_event_id = events(conn)[-1]["id"]
    conn.close()
    for i in range(5):
        node.publish("a", i)  # published while the client was away
    again = stream(node, "a", headers={"Last-Event-ID": last_event_id}, since="now")
    node.turn()
    assert data_of(events(again)) == [0, 1, 2, 3, 4]


def test_drain_names_the_position_then_ends_the_stream(node):
    conn = stream(node, "a")
    node.turn()
    node.publish("a", "x")
    node.turn()
    node.node.service.drain()
    got = events(conn)
    assert got[-1]["event"] == "cursor"
    assert got[-1]["id"] == got[-2]["id"]  # the position just after "x"
    assert ended(conn)


def test_an_idle_stream_sends_heartbeat_comments_without_a_blank_line(node):
    conn = stream(node, "a")
    node.turn()
    node.clock.advance(15)
    data, done = body(conn)
    # a blank line after the comment makes some readers (httpx-sse) emit an empty event
    assert data.endswith(b"\n\n: keep-alive\n") and not done
    assert not conn.transport.disconnecting
    node.clock.advance(15)
    assert body(conn)[0].endswith(b"\n\n: keep-alive\n: keep-alive\n")


def test_a_stream_is_chunked_on_http_1_1_and_close_delimited_on_http_1_0(node):
    node.publish("a", 1)
    conn = stream(node, "a", since=0)
    node.turn()
    head, _, rest = conn.transport.value().partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    node.node.service.drain()
    assert body(conn)[1]  # the last chunk came
    assert rest.split(b"\r\n", 1)[0] == b"%x" % len(dechunk(rest)[0].split(b"\n\n")[0] + b"\n\n")
    old = node.connect()
    old.send(b"GET /subscribe?channels=a&since=0 HTTP/1.0\r\nAccept: text/event-stream\r\n\r\n")
    node.turn()
    head, _, rest = old.transport.value().partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and b"Content-Length" not in head
    assert b"Connection: close" in head
    assert data_of(parse_events(rest)) == [1]


def test_a_gap_is_an_event(make_node):
    node = make_node(max_messages_per_channel=2)
    for i in range(5):
        node.publish("a", i)
    conn = stream(node, "a", since=0)
    node.turn()
    got = events(conn)
    assert got[0]["event"] == "gap" and got[0]["id"] == got[0]["data"]
    assert data_of(got) == [3, 4]


def test_a_client_that_leaves_is_forgotten(node):
    conn = stream(node, "a")
    node.turn()
    assert node.stats()["waiting"] == 1
    conn.close()
    assert node.stats()["waiting"] == 0


def test_since_now_streams_only_what_comes_next(node):
    node.publish("a", "old")
    conn = stream(node, "a", since="now")
    node.turn()
    node.publish("a", "new")
    node.turn()
    assert data_of(events(conn)) == ["new"]


# -- until ---------------------------------------------------------------------


@pytest.mark.timeout(20)  # before the fix this request never returned
def test_until_in_the_past_streams_what_is_before_it_then_ends(node):
    node.publish("a", "before")
    until = node.clock.seconds()
    node.clock.advance(1)
    node.publish("a", "after")
    conn = stream(node, "a", since=0, until=f"{until:.6f}")
    for _ in range(3):
        node.turn()
    assert data_of(events(conn)) == ["before"]
    assert events(conn)[-1]["event"] == "end"
    assert ended(conn)
    assert node.get("/health").status == 200
    # the EventSource's reconnect: nothing is left before until, so 204 stops it
    again = stream(node, "a", headers={"Last-Event-ID": events(conn)[-1]["id"]},
                   since=0, until=f"{until:.6f}")
    assert again.response.status == 204
    assert node.get("/health").status == 200


@pytest.mark.timeout(20)  # before the fix the stream re-subscribed forever once until passed
def test_a_stream_ends_when_until_passes(node):
    until = node.clock.seconds() + 30
    conn = stream(node, "a", until=f"{until:.6f}")
    assert_still_streaming_after(node, conn, 10)
    node.clock.advance(21)
    node.turn()
    assert events(conn)[-1]["event"] == "end"
    assert ended(conn)


# -- closed channels -----------------------------------------------------------


def test_a_deleted_channel_leaves_the_stream_and_is_never_re_created(node):
    conn = stream(node, "a,b")
    node.turn()
    assert node.request("DELETE", "/channels/a").status == 204
    node.turn()
    closed = named(conn, "closed")
    assert [json.loads(e["data"]) for e in closed] == [["a"]]
    assert not ended(conn)
    node.clock.advance(15)  # the stream holds again, on b only
    node.turn()
    assert node.get("/channels/a").status == 404
    node.publish("b", "still here")
    node.turn()
    assert data_of(events(conn)) == ["still here"]
    # a reconnect with an id issued after the close does not bring a back either
    again = stream(node, "a,b", headers={"Last-Event-ID": events(conn)[-1]["id"]})
    node.turn()
    assert node.get("/channels/a").status == 404
    again.close()
    assert node.request("DELETE", "/channels/b").status == 204
    node.turn()
    assert [json.loads(e["data"]) for e in named(conn, "closed")] == [["a"], ["b"]]
    assert ended(conn)
    assert node.get("/channels/b").status == 404
    # the EventSource's reconnect with the last id: 204, which stops it for good
    last = events(conn)[-1]["id"]
    assert stream(node, "a,b", headers={"Last-Event-ID": last}).response.status == 204
    assert node.get("/channels/a").status == 404 and node.get("/channels/b").status == 404
    # the same id as since (a client that keeps its own cursor) counts the same
    assert stream(node, "a,b", since=last).response.status == 204


def test_a_channel_closed_with_a_message_in_flight_lists_it_on_the_channels_left(node):
    conn = stream(node, "a,b")
    node.turn()
    service = node.service
    service.publish([Draft(("a", "b"), b'"both"')])  # its fan-out is on the next turn
    service.delete_channel("b")  # answers the stream first, closing b
    node.turn()
    message = [e for e in events(conn) if "event" not in e]
    assert [json.loads(e["data"])["channels"] for e in message] == [["a"]]
    assert [json.loads(e["data"]) for e in named(conn, "closed")] == [["b"]]
    assert not ended(conn)


def test_a_stream_answered_by_a_fan_out_reads_the_store_no_second_time(node):
    conn = stream(node, "a")
    node.turn()
    # Compiled, the service's store and methods are fixed: the store is counted
    # as each side reads it. The fan-out makes one Delivery per store query
    # (Service._answer), each told to on_answered; the stream (its connection's
    # Held cancels it: stream.stop) reads through the service it was given.
    held = conn.protocol._waiting.__self__
    queries: list[object] = []

    class Counting:  # the store, counting the stream's queries
        def __init__(self, store: object) -> None:
            self.store = store

        def query(self, q: object) -> object:
            queries.append(q)
            return self.store.query(q)  # type: ignore[attr-defined]

        def __getattr__(self, name: str) -> object:
            return getattr(self.store, name)

    class Seen:  # the service as the stream sees it: the same, with the store counted
        def __init__(self, service: object) -> None:
            self.service = service
            self.store = Counting(service.store)  # type: ignore[attr-defined]

        def __getattr__(self, name: str) -> object:
            return getattr(self.service, name)

    held.service = Seen(node.service)
    answered: list[object] = []
    node.service.on_answered = lambda delivery, subscribers: answered.append(delivery)
    node.service.publish([Draft(("a",), b"1")])
    node.turn()  # the fan-out: one query for the stream's hold, rendered as it is
    assert len(answered) + len(queries) == 1
    assert data_of([e for e in events(conn) if "event" not in e]) == [1]


# -- tokens --------------------------------------------------------------------


def test_a_stream_ends_when_its_token_expires(make_node):
    node = make_node(subscribe_secret="s" * 32)
    token = tokens.issue("s" * 32, ["a"], node.clock.seconds() + 60)
    conn = stream(node, "a", token=token)
    assert_still_streaming_after(node, conn, 59)
    node.clock.advance(1)
    expired = events(conn)[-1]
    assert expired["event"] == "expired"
    assert json.loads(expired["data"])["error"]["code"] == "unauthorized"
    assert ended(conn)
    assert node.stats()["waiting"] == 0
    # the EventSource's reconnect with the same token is refused: it stops
    again = stream(node, "a", headers={"Last-Event-ID": expired["id"]}, token=token)
    assert_error(again.response, 401, None)


# -- flow control ------------------------------------------------------------------


class _NeverReads(_Transport):
    """A client that reads nothing: a close waits for output never taken."""

    def abortConnection(self) -> None:
        self.aborted = True
        super().abortConnection()

    aborted = False


@pytest.mark.parametrize("paused", [True, False], ids=["paused", "under-the-high-water-mark"])
def test_a_stream_that_ends_while_its_client_reads_nothing_is_aborted(make_node, paused):
    """Paused 3 s before the end: cut off send_timeout after the pause; not
    paused (its output under the transport's high-water mark): after the end."""
    node = make_node(subscribe_secret="s" * 32, send_timeout=8)
    token = tokens.issue("s" * 32, ["a"], node.clock.seconds() + 60)
    conn = node.connect(_NeverReads)
    conn.protocol.dataReceived(b"GET /subscribe?channels=a&token=%s HTTP/1.1\r\nHost: x\r\n"
                               b"Accept: text/event-stream\r\n\r\n" % token.encode())
    node.turn()
    node.clock.advance(57)
    if paused:  # the transport's buffer is full: what TCP says of a client not reading
        conn.protocol.pauseProducing()
    node.clock.advance(3)  # the token expires: the stream ends, its close waits on output
    assert events(conn)[-1]["event"] == "expired"
    assert conn.transport.disconnecting and not conn.transport.aborted
    left = 5 if paused else 8  # until send_timeout has passed with nothing taken
    node.clock.advance(left - 0.1)
    assert not conn.transport.aborted
    node.clock.advance(0.1)
    assert conn.transport.aborted
    conn.close()  # the abort completes
    assert node.stats()["connections"] == 1  # the one asking for the figures


def test_a_closing_connection_whose_output_moves_gets_the_send_timeout_again(make_node):
    node = make_node(send_timeout=8)
    conn = node.connect(_NeverReads)
    conn.protocol.dataReceived(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert conn.transport.disconnecting
    node.clock.advance(5)
    conn.protocol.pauseProducing()
    conn.protocol.resumeProducing()  # the client took some: a slow reader, not a dead one
    node.clock.advance(7.9)
    assert not conn.transport.aborted
    node.clock.advance(0.1)
    assert conn.transport.aborted


class _SlowReader(_Transport):
    """A client that reads only when told: the transport pauses its producer
    past 64 KiB unread, as a TCP transport does."""

    def write(self, data: bytes) -> None:
        super().write(data)
        if len(self.value()) > 64 * 1024 and not self.paused:
            self.paused = True
            self.producer.pauseProducing()

    def read(self) -> bytes:
        data = self.value()
        self.clear()
        if self.paused:
            self.paused = False
            self.producer.resumeProducing()
        return data

    paused = False


def test_a_stream_that_is_not_read_holds_no_more_than_a_page(make_node):
    page = 64 * 1024
    node = make_node(max_response_bytes=page, max_body_bytes=4 << 20)
    blob = "x" * 4000
    for n in range(10):
        node.post("/publish", {"messages": [{"channels": ["a"], "data": [n * 100 + i, blob]}
                                            for i in range(100)]})  # 4 MB in all
    conn = Conn.__new__(Conn)
    conn.harness, conn.lost, conn.sent, conn._heads = node, False, [], []
    conn.transport = _SlowReader(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
    conn.protocol = node.node.front.buildProtocol(conn.transport.getPeer())
    conn.protocol.makeConnection(conn.transport)
    node.conns.append(conn)
    conn.request("GET", "/subscribe?channels=a&since=0", headers=STREAM)
    for _ in range(20):
        node.turn()
    # the client has read nothing: at most the transport's 64 KiB and one page wait
    assert len(conn.transport.value()) < 64 * 1024 + page + 16 * 1024
    received = b""
    deadline = time.monotonic() + 30  # hang guard only
    while b"[999," not in received and time.monotonic() < deadline:
        received += conn.transport.read()
        node.turn()
    head, _, rest = received.partition(b"\r\n\r\n")
    got = [json.loads(e["data"])["data"][0] for e in parse_events(dechunk(rest)[0])
           if "event" not in e]
    assert got == list(range(1000))  # each once, in order


# -- ids come back -------------------------------------------------------------


def test_an_issued_id_of_a_300_origin_cursor_is_accepted_back(node):
    node.publish("a", 1)
    # 300 origins at their longest: the ids the node issues from it are ~40 KB
    big = Cursor.of({f"{'n' * 60}{i:04d}.{'e' * 16}": 10**17 + i for i in range(300)})
    conn = stream(node, "a", since=big.encode())
    node.turn()
    issued = events(conn)[-1]["id"]
    assert len(issued) > 30_000
    node.publish("a", 2)
    again = stream(node, "a", headers={"Last-Event-ID": issued})
    node.turn()
    assert data_of(events(again)) == [2]
    poll = node.get(f"/subscribe?channels=a&timeout=0&since={issued}")
    assert poll.status == 200 and [m["data"] for m in poll.json["messages"]] == [2]
    as_since = stream(node, "a", since=issued)
    node.turn()
    assert data_of(events(as_since)) == [2]
