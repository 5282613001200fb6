"""pushup/http/streams.py at the edges of what a stream request may ask: a
fork chain's depth, a path's length, an expiry already past, an offset the
stream never issued; each refused with its status and the JSON error body,
and nothing stored."""

from __future__ import annotations

import json

import pytest

from pushup.core.streams import MAX_FORK_DEPTH, MAX_STREAM_PATH
from pushup.http.exchange import JSON
from tests.http.test_streams import answered, ask, header, node

TEXT = b"text/plain"


def refusal(response: object) -> tuple[int, str]:
    refused = answered(response)  # type: ignore[arg-type]
    assert refused.content_type == JSON
    return refused.status, json.loads(refused.body or b"")["error"]["code"]


def test_a_fork_past_max_fork_depth_is_400_fork_too_deep_and_the_chain_still_reads():
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/f0", b"root", content_type=TEXT))
    for level in range(1, MAX_FORK_DEPTH + 1):
        made = answered(ask(handlers, b"PUT", b"/v1/stream/f%d" % level,
                            stream_forked_from=b"/v1/stream/f%d" % (level - 1)))
        assert made.status == 201
    assert refusal(ask(handlers, b"PUT", b"/v1/stream/deeper",
                       stream_forked_from=b"/v1/stream/f%d" % MAX_FORK_DEPTH)) == (
        400, "fork_too_deep")
    assert answered(ask(handlers, b"HEAD", b"/v1/stream/deeper")).status == 404
    deepest = b"/v1/stream/f%d" % MAX_FORK_DEPTH
    assert answered(ask(handlers, b"POST", deepest, b"+", content_type=TEXT)).status == 204
    read = answered(ask(handlers, b"GET", deepest + b"?offset=-1"))
    assert (read.status, read.body) == (200, b"root+")


def test_a_path_past_max_stream_path_is_414_and_the_longest_gets_its_location():
    handlers = node()
    longest = b"/v1/stream/" + b"p" * (MAX_STREAM_PATH - len(b"/v1/stream/"))
    made = answered(ask(handlers, b"PUT", longest, host=b"example.com"))
    assert (made.status, header(made, b"Location")) == (201, b"http://example.com" + longest)
    assert refusal(ask(handlers, b"PUT", longest + b"p", host=b"example.com")) == (
        414, "too_large")
    assert answered(ask(handlers, b"HEAD", longest + b"p")).status == 404


@pytest.mark.parametrize("headers", [
    {"stream_ttl": b"0"}, {"stream_expires_at": b"2020-01-01T00:00:00Z"}])
def test_a_creation_that_would_expire_at_once_is_400_with_the_json_error(headers):
    handlers = node()
    assert refusal(ask(handlers, b"PUT", b"/v1/stream/s", b"x", content_type=TEXT,
                       **headers)) == (400, "bad_parameter")
    assert answered(ask(handlers, b"HEAD", b"/v1/stream/s")).status == 404


def test_an_offset_of_another_stream_inside_this_ones_tail_is_400():
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/a", content_type=b"application/octet-stream"))
    answered(ask(handlers, b"PUT", b"/v1/stream/b", content_type=b"application/octet-stream"))
    other = header(answered(ask(handlers, b"POST", b"/v1/stream/a", b"\x00\x01",
                                content_type=b"application/octet-stream")),
                   b"Stream-Next-Offset")
    answered(ask(handlers, b"POST", b"/v1/stream/b", b"\xff\xfe\xfd\xfc",
                 content_type=b"application/octet-stream"))
    assert other is not None
    for live in (b"", b"&live=long-poll", b"&live=sse"):
        assert refusal(ask(handlers, b"GET", b"/v1/stream/b?offset=" + other + live)) == (
            400, "bad_parameter")
    assert refusal(ask(handlers, b"PUT", b"/v1/stream/f", stream_forked_from=b"/v1/stream/b",
                       stream_fork_offset=other)) == (400, "bad_parameter")
