"""pushup/http/exchange.py: the Writer's cache of fan-out responses and its bounds."""

from __future__ import annotations

import json

from pushup.core.cursor import Cursor
from pushup.core.model import Message, Query
from pushup.core.service import Delivery
from pushup.core.store import Result
from pushup.http import exchange
from pushup.http.exchange import Writer
from pushup.http.render import poll_body

T = 1_763_800_000_000_000


def writer() -> Writer:
    w = Writer()
    w.tick(1_763_800_000.0)
    return w


def delivery(size: int = 0, fill: str = "x") -> Delivery:
    """A delivery of one message whose data is ``size`` characters (none if 0)."""
    messages = (Message("o", 1, T, ("c",), json.dumps(fill * size).encode()),) if size else ()
    return Delivery(Query(("c",), Cursor(()), None, 100), Result(messages, Cursor(()), False))


def test_a_delivery_is_rendered_once_and_the_same_bytes_are_shared():
    w, d = writer(), delivery()
    first = w.shared(d)
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(poll_body(d))
    assert w.shared(d) is first
    assert w.shared_bytes == len(first)
    assert w.shared_body(d) is w.shared_body(d) == poll_body(d)  # rendered once


def test_an_equal_delivery_that_is_another_object_is_rendered_anew():
    w, d = writer(), delivery()
    first = w.shared(d)
    twin = delivery()
    assert twin == d and w.shared(twin) == first and w.shared(twin) is not first


def test_release_forgets_every_cached_response():
    w = writer()
    deliveries = [delivery(1000, "a"), delivery(1000, "b")]
    first = w.shared(deliveries[0])
    w.shared(deliveries[1])
    w.release_shared()
    assert w.shared_bytes == 0
    again = w.shared(deliveries[0])
    assert again == first and again is not first  # built anew: nothing was kept


def test_the_cache_is_bounded_in_bytes_and_always_keeps_the_newest(monkeypatch):
    monkeypatch.setattr(exchange, "_SHARED_BYTES", 10_000)
    w = writer()
    older, newer = delivery(6_000, "o"), delivery(6_000, "n")
    first = w.shared(older)
    kept = w.shared(newer)  # past the bound: the older entry goes
    assert w.shared_bytes == len(kept)
    assert w.shared(newer) is kept
    huge = delivery(50_000, "h")  # larger than the bound on its own: still shared
    raw = w.shared(huge)
    assert w.shared(huge) is raw and w.shared_bytes == len(raw)
    assert w.shared(older) is not first  # it was forgotten: built anew


def test_the_cache_is_bounded_in_count(monkeypatch):
    monkeypatch.setattr(exchange, "_SHARED_CACHE", 3)
    w = writer()
    deliveries = [delivery(10, chr(65 + i)) for i in range(4)]
    raws = [w.shared(d) for d in deliveries]  # the fourth clears the three before
    assert w.shared_bytes == len(raws[3])
    assert w.shared(deliveries[3]) is raws[3] and w.shared(deliveries[0]) is not raws[0]


def test_a_response_past_the_bounds_is_rebuilt_from_the_body_rendered_once(monkeypatch):
    monkeypatch.setattr(exchange, "_SHARED_CACHE", 2)
    w = writer()
    rendered: list[Delivery] = []
    monkeypatch.setattr(exchange, "poll_body", lambda d: rendered.append(d) or poll_body(d))
    deliveries = [delivery(10, chr(65 + i)) for i in range(3)]
    for _ in range(3):  # more deliveries than responses kept: responses are rebuilt
        raws = [w.shared(d) for d in deliveries]
    assert raws == [w.head(200, exchange.JSON, len(poll_body(d))) + poll_body(d)
                    for d in deliveries]
    assert rendered == deliveries  # each body once
    w.release_shared()
    w.shared_body(deliveries[0])
    assert rendered == [*deliveries, deliveries[0]]  # a new fan-out renders anew
