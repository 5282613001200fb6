"""pushup/core/stream.py and the stream service's named methods as values:
what a reader waiting on a stream is told, and what a store shared with
other nodes may change of a stream it caches (never its fields directly)."""

from __future__ import annotations

from pushup.core.stream import Stream
from pushup.core.stream_values import Append, Creation, Entry, Position
from pushup.core.streams import Streams

TEXT = "text/plain"


def streams(budget: int = 10**9) -> Streams:
    ids = iter(range(10**6))
    return Streams(lambda: str(next(ids)), budget)


def test_a_waiting_reader_is_woken_once_and_one_that_left_never():
    stream = Stream("/s", "u", TEXT)
    woken: list[str] = []
    stream.wait(lambda: woken.append("a"))
    gone = lambda: woken.append("b")  # noqa: E731
    stream.wait(gone)
    stream.stop_waiting(gone)
    stream.stop_waiting(gone)  # not waiting: nothing
    assert stream.waited_on
    stream.wake()
    stream.wake()
    assert woken == ["a"] and not stream.waited_on


def test_wakes_held_wake_nobody_within_and_keep_the_readers_in_order():
    store = streams()
    store.create("/s", Creation(TEXT, None, None, False, b""), 0)
    stream = store.get("/s", 0)
    woken: list[str] = []
    stream.wait(lambda: woken.append("before"))
    with store.wakes_held([stream]):
        store.append("/s", Append(TEXT, b"x", False), 0)  # would wake them
        stream.wait(lambda: woken.append("during"))
    assert woken == []
    stream.wake()
    assert woken == ["before", "during"]


def test_a_fresh_state_is_taken_up_and_the_appends_and_identity_kept():
    cached = Stream("/s", "u", TEXT)
    cached.add_entry(Entry(Position(0, 0), b"ab"))
    fresh = Stream("/s", "u", TEXT, ttl=5, closed=True, tail=Position(1, 2), forks=1)
    cached.take_state(fresh)
    assert (cached.ttl, cached.closed, cached.tail, cached.forks) == (5, True, Position(1, 2), 1)
    assert cached.entries == [Entry(Position(0, 0), b"ab")] and cached.begins == [0]
    cached.forget_entries()
    assert cached.entries == [] and cached.begins == [] and cached.tail == Position(1, 2)


def test_a_deadline_renewed_elsewhere_never_goes_back_and_a_tail_raised_never_falls():
    stream = Stream("/s", "u", TEXT, ttl=5, deadline=100, tail=Position(3, 10))
    stream.renew_deadline(50)
    assert stream.deadline == 100
    stream.renew_deadline(150)
    assert stream.deadline == 150
    Stream("/t", "v", TEXT).renew_deadline(150)  # no TTL: no deadline to renew
    stream.raise_tail(Position(2, 20))
    assert stream.tail == Position(3, 20)
    stream.mark_deleted()
    assert stream.deleted


def test_expired_streams_are_swept_at_most_every_ten_seconds_and_held_counts_live_ones():
    store = streams()
    store.create("/s", Creation(TEXT, 1, None, False, b""), 20_000_000)  # 1 s TTL
    assert store.holds("/s", 20_500_000) and not store.holds("/s", 21_000_000)
    store.sweep_due(20_000_001)
    assert store.at("/s") is not None  # swept before its deadline: kept
    store.sweep_due(25_000_000)  # expired, but 5 s after the last sweep: not due
    assert store.at("/s") is not None
    store.sweep_due(40_000_002)
    assert store.at("/s") is None


def test_figures_say_the_budget_held_or_with_a_shared_store_only_the_count():
    store = streams(budget=10_000)
    store.create("/s", Creation(TEXT, None, None, False, b"abc"), 0)
    figures = store.figures(shared=False)
    assert figures["count"] == 1 and figures["bytes"] == store.held > 0
    assert figures["budget"] == 10_000 and figures["producers"] == 0
    assert store.figures(shared=True) == {"count": 1}
    store.charge_afresh()
    assert store.figures(shared=False)["bytes"] == 0
