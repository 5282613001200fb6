"""pushup/http/streams.py (and pushup/core/streams.py under it) as plain values:
what PushUp chose where the Durable Streams protocol leaves it open (offsets, the
long poll's hold, the byte budget, the publish token, errors as JSON). The
protocol itself is the conformance suite's (tests/conformance/test_durable_streams.py).
"""

from __future__ import annotations

import json
import re

import pytest
from twisted.internet.task import Clock

from pushup.config import Config
from pushup.http.exchange import Held, Pending, Request, Response
from pushup.http.handlers import Handlers
from pushup.http.streams import LONG_POLL_S
from pushup.ops.node import Node

START = 1_763_800_000.0


def node(**config: object) -> Handlers:
    clock = Clock()
    clock.advance(START)
    return Node(Config(node_id="s", **config), clock).handlers  # type: ignore[arg-type]


class Connection:
    """Where a held long poll's answer goes: what the front's connection
    (``HTTPProtocol.answer_held``) is handed."""

    def __init__(self) -> None:
        self.answers: list[Response] = []
        self.held: Held | None = None

    def answer_held(self, response: Response) -> bool:
        self.answers.append(response)
        return True


def ask(handlers: Handlers, method: bytes, target: bytes, body: bytes = b"",
        client: Connection | None = None, **headers: bytes) -> Response | Pending | Held:
    path, _, query = target.partition(b"?")
    request = Request(method, path, query,
                      {k.replace("_", "-").lower().encode(): v for k, v in headers.items()},
                      body)
    answer = handlers.handle(request, client)  # type: ignore[arg-type]
    assert isinstance(answer, Response | Pending | Held)
    return answer


def hold(handlers: Handlers, target: bytes) -> Connection:
    """A long poll held: its connection, which gets the answer."""
    client = Connection()
    held = ask(handlers, b"GET", target, client=client)
    assert isinstance(held, Held) and client.answers == []
    client.held = held
    return client


def answered(answer: Response | Pending | Held) -> Response:
    assert isinstance(answer, Response), answer
    return answer


def header(response: Response, name: bytes) -> bytes | None:
    return dict(response.headers).get(name)


def test_an_offset_counts_appends_and_bytes_so_every_node_names_a_position_alike():
    offsets = []
    for handlers in (node(), node()):  # two nodes, the same appends
        answered(ask(handlers, b"PUT", b"/v1/stream/s", b"abc", content_type=b"text/plain"))
        appended = answered(ask(handlers, b"POST", b"/v1/stream/s", b"defgh",
                                content_type=b"text/plain"))
        offsets.append(header(appended, b"Stream-Next-Offset"))
    assert offsets == [b"0000000000000002_0000000000000008"] * 2
    assert re.fullmatch(rb"\d{16}_\d{16}", offsets[0] or b"")


@pytest.mark.parametrize(("target", "headers"), [
    (b"/v1/stream/s?offset=12", {}),
    (b"/v1/stream/s?offset=", {}),
    (b"/v1/stream/s?offset=-1&live=forever", {}),
    (b"/v1/stream/s?live=long-poll", {}),
])
def test_bad_read_parameters_are_400_with_the_json_error(target, headers):
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s"))
    refused = answered(ask(handlers, b"GET", target, **headers))
    assert refused.status == 400
    assert json.loads(refused.body or b"")["error"]["code"] == "bad_parameter"


@pytest.mark.parametrize("headers", [
    {"stream_ttl": b"03600"}, {"stream_ttl": b"1.5"},
    {"stream_ttl": b"60", "stream_expires_at": b"2030-01-01T00:00:00Z"},
    {"stream_expires_at": b"tomorrow"},
    {"stream_fork_offset": b"0000000000000000_0000000000000000"},
])
def test_bad_create_headers_are_400_with_the_json_error(headers):
    refused = answered(ask(node(), b"PUT", b"/v1/stream/s", **headers))
    assert refused.status == 400
    assert json.loads(refused.body or b"")["error"]["code"] == "bad_parameter"


def test_a_long_poll_holds_three_seconds_unless_it_asks_for_longer():
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s", b"x", content_type=b"text/plain"))
    tail = b"0000000000000001_0000000000000001"
    short = hold(handlers, b"/v1/stream/s?offset=" + tail + b"&live=long-poll")
    longer = hold(handlers, b"/v1/stream/s?offset=" + tail + b"&live=long-poll&timeout=20")
    handlers.service.clock.advance(LONG_POLL_S)
    assert [r.status for r in short.answers] == [204]
    assert longer.answers == []
    handlers.service.clock.advance(20 - LONG_POLL_S)
    assert [r.status for r in longer.answers] == [204]


def test_a_held_long_poll_is_answered_by_the_append():
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s", content_type=b"text/plain"))
    held = hold(handlers, b"/v1/stream/s?offset=-1&live=long-poll")
    answered(ask(handlers, b"POST", b"/v1/stream/s", b"hello", content_type=b"text/plain"))
    assert [(r.status, r.body) for r in held.answers] == [(200, b"hello")]


def test_streams_hold_no_more_bytes_than_max_cached_bytes_and_a_delete_gives_them_back():
    handlers = node(max_cached_bytes=4096, max_message_bytes=1024)
    answered(ask(handlers, b"PUT", b"/v1/stream/a", b"x" * 3000))
    refused = answered(ask(handlers, b"PUT", b"/v1/stream/b", b"y" * 1000))
    assert refused.status == 507
    assert json.loads(refused.body or b"")["error"]["code"] == "streams_full"
    assert answered(ask(handlers, b"DELETE", b"/v1/stream/a")).status == 204
    assert answered(ask(handlers, b"PUT", b"/v1/stream/b", b"y" * 1000)).status == 201


def test_a_sliding_ttl_is_renewed_by_reads_and_not_by_head():
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s", stream_ttl=b"10"))
    clock = handlers.service.clock
    clock.advance(8)
    assert answered(ask(handlers, b"GET", b"/v1/stream/s")).status == 200  # renews: +10 s
    clock.advance(8)
    assert answered(ask(handlers, b"HEAD", b"/v1/stream/s")).status == 200  # does not renew
    clock.advance(2)
    assert answered(ask(handlers, b"HEAD", b"/v1/stream/s")).status == 404


def test_with_a_publish_token_writes_need_it_and_reads_do_not():
    handlers = node(publish_token="secret")
    refused = answered(ask(handlers, b"PUT", b"/v1/stream/s"))
    assert refused.status == 401
    assert answered(ask(handlers, b"PUT", b"/v1/stream/s",
                        authorization=b"Bearer secret")).status == 201
    assert answered(ask(handlers, b"GET", b"/v1/stream/s")).status == 200
    assert answered(ask(handlers, b"DELETE", b"/v1/stream/s")).status == 401


def test_with_a_subscribe_secret_and_a_publish_token_reads_need_the_publish_token():
    handlers = node(publish_token="secret", subscribe_secret="s" * 32)
    answered(ask(handlers, b"PUT", b"/v1/stream/s", authorization=b"Bearer secret"))
    assert answered(ask(handlers, b"GET", b"/v1/stream/s")).status == 401
    assert answered(ask(handlers, b"GET", b"/v1/stream/s",
                        authorization=b"Bearer secret")).status == 200


def test_a_drain_answers_a_held_long_poll_at_once():
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s", content_type=b"text/plain"))
    held = hold(handlers, b"/v1/stream/s?offset=-1&live=long-poll&timeout=60")
    handlers.streams.drain()
    assert [(r.status, header(r, b"Stream-Up-To-Date")) for r in held.answers] == [
        (204, b"true")]


@pytest.mark.parametrize(("body", "code"), [
    (b"[NaN]", "bad_json"), (b"[" * 100_000 + b"]" * 100_000, "bad_json"), (b"{", "bad_json"),
    (b"[]", "bad_parameter")])
def test_a_json_append_is_as_strict_as_a_publish(body, code):
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s", content_type=b"application/json"))
    refused = answered(ask(handlers, b"POST", b"/v1/stream/s", body,
                           content_type=b"application/json"))
    assert refused.status == 400
    assert json.loads(refused.body or b"")["error"]["code"] == code


def test_the_stream_prefix_alone_is_no_stream():
    refused = answered(ask(node(), b"PUT", b"/v1/stream/"))
    assert refused.status == 404
    assert json.loads(refused.body or b"")["error"]["code"] == "not_found"


def test_a_held_long_poll_is_answered_404_when_its_stream_is_deleted():
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s", content_type=b"text/plain"))
    held = hold(handlers, b"/v1/stream/s?offset=-1&live=long-poll&timeout=60")
    answered(ask(handlers, b"DELETE", b"/v1/stream/s"))
    assert [(r.status, json.loads(r.body or b"")["error"]["code"]) for r in held.answers] == [
        (404, "not_found")]


def test_stats_count_the_long_polls_held_until_answered_or_timed_out():
    clock = Clock()
    clock.advance(START)
    whole = Node(Config(node_id="s"), clock)  # type: ignore[arg-type]
    handlers = whole.handlers
    answered(ask(handlers, b"PUT", b"/v1/stream/s", content_type=b"text/plain"))
    assert whole.stats()["stream_long_polls"] == 0
    short = hold(handlers, b"/v1/stream/s?offset=-1&live=long-poll")
    longer = hold(handlers, b"/v1/stream/s?offset=-1&live=long-poll&timeout=60")
    assert whole.stats()["stream_long_polls"] == 2
    clock.advance(LONG_POLL_S)  # the first's 204
    assert whole.stats()["stream_long_polls"] == 1
    answered(ask(handlers, b"POST", b"/v1/stream/s", b"x", content_type=b"text/plain"))
    assert whole.stats()["stream_long_polls"] == 0
    assert [r.status for r in short.answers + longer.answers] == [204, 200]


def test_a_long_poll_whose_client_left_is_forgotten_and_the_others_are_answered():
    clock = Clock()
    clock.advance(START)
    whole = Node(Config(node_id="s"), clock)  # type: ignore[arg-type]
    handlers = whole.handlers
    answered(ask(handlers, b"PUT", b"/v1/stream/s", content_type=b"text/plain"))
    gone = hold(handlers, b"/v1/stream/s?offset=-1&live=long-poll&timeout=60")
    staying = hold(handlers, b"/v1/stream/s?offset=-1&live=long-poll&timeout=60")
    assert gone.held is not None
    gone.held.cancel()  # what the front does when the connection is lost
    assert whole.stats()["stream_long_polls"] == 1
    answered(ask(handlers, b"POST", b"/v1/stream/s", b"x", content_type=b"text/plain"))
    assert (gone.answers, [r.body for r in staying.answers]) == ([], [b"x"])
    assert whole.stats()["stream_long_polls"] == 0


def test_a_refused_append_renders_the_values_its_error_carries_as_headers():
    """The core raises values (the sequence expected, a closed stream's
    tail); the HTTP layer names the headers they go out in."""
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s", content_type=b"text/plain"))
    answered(ask(handlers, b"POST", b"/v1/stream/s", b"a", content_type=b"text/plain",
                 producer_id=b"p", producer_epoch=b"1", producer_seq=b"0"))
    gap = answered(ask(handlers, b"POST", b"/v1/stream/s", b"c", content_type=b"text/plain",
                       producer_id=b"p", producer_epoch=b"1", producer_seq=b"3"))
    assert gap.status == 409 and json.loads(gap.body or b"")["error"]["code"] == "stream_conflict"
    assert (header(gap, b"Producer-Expected-Seq"), header(gap, b"Producer-Received-Seq")) == (
        b"1", b"3")
    stale = answered(ask(handlers, b"POST", b"/v1/stream/s", b"z", content_type=b"text/plain",
                         producer_id=b"p", producer_epoch=b"0", producer_seq=b"0"))
    assert (stale.status, header(stale, b"Producer-Epoch")) == (403, b"1")
    answered(ask(handlers, b"POST", b"/v1/stream/s", stream_closed=b"true"))
    closed = answered(ask(handlers, b"POST", b"/v1/stream/s", b"d", content_type=b"text/plain"))
    assert (closed.status, header(closed, b"Stream-Closed"),
            header(closed, b"Stream-Next-Offset")) == (
        409, b"true", b"0000000000000001_0000000000000001")


def test_stats_count_the_sse_responses_served_until_they_end():
    clock = Clock()
    clock.advance(START)
    whole = Node(Config(node_id="s"), clock)  # type: ignore[arg-type]
    handlers = whole.handlers
    answered(ask(handlers, b"PUT", b"/v1/stream/s", b"x", content_type=b"text/plain"))
    assert whole.stats()["stream_sse_readers"] == 0
    reader = Feeds()
    held = ask(handlers, b"GET", b"/v1/stream/s?offset=-1&live=sse", client=reader)
    assert isinstance(held, Held) and whole.stats()["stream_sse_readers"] == 1
    answered(ask(handlers, b"POST", b"/v1/stream/s", b"y", content_type=b"text/plain",
                 stream_closed=b"true"))  # read whole and closed: the response ends
    assert reader.ended and whole.stats()["stream_sse_readers"] == 0
    ask(handlers, b"GET", b"/v1/stream/s?offset=-1&live=sse", client=Feeds())
    assert whole.stats()["stream_sse_readers"] == 0  # closed: it ended at once


class Feeds:
    """The front's end of an SSE response (``HTTPProtocol``'s stream methods)."""

    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.ended = False

    def open_stream(self, content_type: bytes = b"", fields: object = ()) -> None:
        pass

    def send_events(self, data: bytes) -> bool:
        self.events.append(data)
        return True

    def end_stream(self) -> None:
        self.ended = True

    def when_writable(self, callback: object) -> None:
        pass
