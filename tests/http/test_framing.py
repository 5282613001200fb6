"""pushup/http/framing.py: an answer's terms, its Connection header, and an
event stream's chunks, as values."""

from __future__ import annotations

import pytest
from twisted.web.http import toChunk

import pushup
from pushup.http.exchange import Request
from pushup.http.framing import (
    CHUNKED,
    CLOSE,
    CLOSE_DELIMITED,
    REFUSAL,
    Queued,
    chunk,
    connection,
    stream_framing,
    terms,
)


def fields(given):
    return given.keep_alive, given.http10, given.head


def test_terms_are_made_once_for_all_requests():
    assert fields(terms(True, False, True)) == (True, False, True)
    assert terms(True, False, True) is terms(True, False, True)  # a request allocates none
    assert terms(False, False, False) is REFUSAL and fields(REFUSAL) == (False, False, False)
    every = [(a, b, c) for a in (False, True) for b in (False, True) for c in (False, True)]
    assert [fields(terms(*flags)) for flags in every] == every


@pytest.mark.skipif(not pushup.BUILD.startswith("compiled"),
                    reason="a Final attribute is read-only in the compiled build only "
                           "(mypy rejects the assignment in both)")
def test_terms_and_a_queued_request_are_frozen():
    queued = Queued(Request(b"GET", b"/", b"", {}), terms(True, False, False), 42)
    with pytest.raises(AttributeError):
        queued.size = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        queued.terms.keep_alive = False  # type: ignore[misc]


def test_closing_a_queued_request_keeps_all_but_its_keep_alive():
    queued = Queued(Request(b"HEAD", b"/", b"", {}), terms(True, True, True), 42)
    closing = queued.closing()
    assert closing.request is queued.request and closing.size == 42
    assert fields(closing.terms) == (False, True, True)
    assert fields(queued.terms) == (True, True, True)  # the original is unchanged


def test_the_connection_header_closes_for_the_client_the_answer_or_a_drain():
    assert connection(terms(True, False, False), close=False, draining=False) == b""
    assert connection(terms(True, True, False), close=False, draining=False) == b"keep-alive"
    assert connection(terms(False, False, False), close=False, draining=False) == CLOSE
    assert connection(terms(True, False, False), close=True, draining=False) == CLOSE
    assert connection(terms(True, True, False), close=False, draining=True) == CLOSE


def test_only_http_1_1_kept_alive_with_a_body_takes_the_shared_fan_out_response():
    assert terms(True, False, False).shareable()
    assert not any(terms(*flags).shareable() for flags in
                   ((False, False, False), (True, True, False), (True, False, True)))


@pytest.mark.parametrize("data", [b"", b"x", b"data: 1\n\n" * 300])
def test_a_chunk_is_the_bytes_twisted_frames(data):
    assert chunk(data) == b"".join(toChunk(data))


def test_a_stream_is_chunked_on_http_1_1_and_delimited_by_the_close_on_http_1_0():
    assert stream_framing(terms(True, False, False)) is CHUNKED
    assert stream_framing(terms(True, True, False)) is CLOSE_DELIMITED
    assert CHUNKED.frame(b"abc") == b"3\r\nabc\r\n" and CHUNKED.end() == b"0\r\n\r\n"
    assert CHUNKED.head_fields() == ((b"Transfer-Encoding", b"chunked"),)
    assert CLOSE_DELIMITED.frame(b"abc") == b"abc" and CLOSE_DELIMITED.end() == b""
    assert CLOSE_DELIMITED.head_fields() == ()
