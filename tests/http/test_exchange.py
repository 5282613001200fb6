"""pushup/http/exchange.py: the Writer's cache of fan-out responses and its bounds."""

from __future__ import annotations

from pushup.http import exchange
from pushup.http.exchange import Writer


def writer() -> Writer:
    w = Writer()
    w.tick(1_763_800_000.0)
    return w


def test_a_body_is_rendered_once_and_the_same_bytes_are_shared():
    w, body = writer(), b'{"messages":[]}'
    first = w.shared(body)
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(body)
    assert w.shared(body) is first
    assert w.shared_bytes == len(first)


def test_release_forgets_every_cached_response():
    w = writer()
    bodies = [b"a" * 1000, b"b" * 1000]
    first = w.shared(bodies[0])
    w.shared(bodies[1])
    w.release_shared()
    assert w.shared_bytes == 0
    again = w.shared(bodies[0])
    assert again == first and again is not first  # built anew: nothing was kept


def test_the_cache_is_bounded_in_bytes_and_always_keeps_the_newest(monkeypatch):
    monkeypatch.setattr(exchange, "_SHARED_BYTES", 10_000)
    w = writer()
    older, newer = b"o" * 6_000, b"n" * 6_000
    first = w.shared(older)
    kept = w.shared(newer)  # past the bound: the older entry goes
    assert w.shared_bytes == len(kept)
    assert w.shared(newer) is kept
    huge = b"h" * 50_000  # larger than the bound on its own: still shared
    raw = w.shared(huge)
    assert w.shared(huge) is raw and w.shared_bytes == len(raw)
    assert w.shared(older) is not first  # it was forgotten: built anew


def test_the_cache_is_bounded_in_count(monkeypatch):
    monkeypatch.setattr(exchange, "_SHARED_CACHE", 3)
    w = writer()
    bodies = [bytes([65 + i]) * 10 for i in range(4)]
    raws = [w.shared(body) for body in bodies]  # the fourth clears the three before
    assert w.shared_bytes == len(raws[3])
    assert w.shared(bodies[3]) is raws[3] and w.shared(bodies[0]) is not raws[0]
