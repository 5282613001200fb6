"""pushup/http/incoming.py: the request being read, as a value: a head that
breaks a rule raises ``Refuse`` carrying the answer it gets (h11's way)."""

from __future__ import annotations

import pytest

from pushup.http.incoming import MAX_HEADER_BYTES, MAX_HEADERS, Incoming, Refuse


def refusal(call) -> int:
    with pytest.raises(Refuse) as caught:
        call()
    assert caught.value.response is not None
    return caught.value.response.status


def with_headers(*lines: tuple[bytes, bytes]) -> Incoming:
    incoming = Incoming()
    for name, value in lines:
        incoming.add_header(name, value, max_event_id=0)
    return incoming


def test_a_repeated_header_is_joined_and_a_repeated_idempotency_key_is_marked():
    incoming = with_headers((b"accept", b"a"), (b"accept", b"b"), (b"idempotency-key", b"k"))
    assert incoming.headers[b"accept"] == b"a, b" and not incoming.repeated_key
    incoming.add_header(b"idempotency-key", b"k", max_event_id=0)
    assert incoming.repeated_key


def test_a_head_past_its_bytes_or_lines_is_431():
    big = Incoming()
    assert refusal(lambda: big.add_header(b"x", b"a" * MAX_HEADER_BYTES, 0)) == 431
    many = with_headers(*((b"x-%d" % i, b"") for i in range(MAX_HEADERS)))
    assert refusal(lambda: many.add_header(b"one-more", b"", 0)) == 431


def test_a_last_event_id_within_its_allowance_is_not_counted():
    incoming = Incoming()
    incoming.add_header(b"last-event-id", b"i" * MAX_HEADER_BYTES, max_event_id=MAX_HEADER_BYTES)
    assert incoming.header_bytes == 0
    assert refusal(lambda: incoming.add_header(b"last-event-id", b"i" * (MAX_HEADER_BYTES + 1),
                                               max_event_id=MAX_HEADER_BYTES)) == 431


def test_a_target_longer_than_allowed_is_414():
    incoming = Incoming()
    incoming.add_url(b"/" + b"a" * 99, max_target=100)
    assert refusal(lambda: incoming.add_url(b"b", max_target=100)) == 414


@pytest.mark.parametrize("hosts, http10, valid", [
    ([b"x"], False, True), ([b"x:80"], False, True), ([b"[::1]:8080"], False, True),
    ([], True, True), ([], False, False), ([b"x", b"y"], False, False),
    ([b"a b"], False, False), ([b""], False, False), ([b"x/y"], True, False),
])
def test_a_head_needs_exactly_one_valid_host_but_http_1_0_may_give_none(hosts, http10, valid):
    incoming = with_headers(*((b"host", host) for host in hosts))
    incoming.url = b"/p"
    if valid:
        incoming.check_head(http10)
    else:
        assert refusal(lambda: incoming.check_head(http10)) == 400


@pytest.mark.parametrize("url, path, query", [
    (b"/subscribe?channels=a", b"/subscribe", b"channels=a"), (b"/stats", b"/stats", b""),
    (b"http://x/subscribe?channels=a", b"/subscribe", b"channels=a"),
    (b"http://x/stats", b"/stats", b""),
])
def test_a_target_in_origin_or_absolute_form_is_split_into_path_and_query(url, path, query):
    incoming = with_headers((b"host", b"x"))
    incoming.url = url
    incoming.check_head(http10=False)
    assert (incoming.path, incoming.query) == (path, query)


@pytest.mark.parametrize("url", [b"x", b"http://x"])  # unparsable; no path
def test_a_target_that_names_no_path_is_404(url):
    incoming = with_headers((b"host", b"x"))
    incoming.url = url
    assert refusal(lambda: incoming.check_head(http10=False)) == 404


def test_a_body_is_kept_up_to_its_limit_then_counted_and_dropped():
    incoming = Incoming()
    incoming.limit = 5
    assert incoming.take(b"abc") and incoming.take(b"de")
    assert incoming.whole_body() == b"abcde"
    assert not incoming.take(b"f") and incoming.too_large
    assert not incoming.take(b"g") and incoming.body == [] and incoming.body_bytes == 7
