"""pushup/core/streams.py as values: positions, forks and their lifetimes, the
byte budget, producers. No HTTP, no clock (``now`` is an argument)."""

from __future__ import annotations

import pytest

from pushup.core.errors import (
    BadRequest,
    NotFound,
    StaleEpoch,
    StreamConflict,
    StreamsFull,
)
from pushup.core.stream_budget import STREAM_OVERHEAD, stream_cost
from pushup.core.stream_values import (
    START,
    Append,
    Creation,
    Position,
)
from pushup.core.streams import Streams

TEXT = "text/plain"


def streams(budget: int = 10**9) -> Streams:
    ids = iter(range(10**6))
    return Streams(lambda: str(next(ids)), budget)


def create(store: Streams, path: str, body: bytes = b"", content_type: str | None = TEXT,
           **fork: object) -> None:
    store.create(path, Creation(content_type, None, None, False, body, **fork), 0)  # type: ignore[arg-type]


def append(store: Streams, path: str, body: bytes, content_type: str = TEXT,
           producer: tuple[str, int, int] | None = None, close: bool = False) -> Position:
    return store.append(path, Append(content_type, body, close, None, producer), 0).tail


def text(store: Streams, path: str, at: Position = START) -> bytes:
    return store.get(path, 0).read(at, 1 << 20).data


def test_a_fork_reads_its_source_up_to_the_fork_then_its_own_appends_only():
    store = streams()
    create(store, "/s", b"ab")
    fork_at = append(store, "/s", b"cd")
    create(store, "/f", forked_from="/s", fork_offset=fork_at.offset)
    append(store, "/s", b"SOURCE")
    append(store, "/f", b"ef")
    assert text(store, "/f") == b"abcdef"
    assert text(store, "/f", Position(1, 2)) == b"cdef"  # offsets are the source's
    assert text(store, "/s") == b"abcdSOURCE"


@pytest.mark.parametrize(("content_type", "body", "sub", "expected"), [
    (TEXT, b"hello", 3, b"abhel"),
    ("application/json", b"[1,2,3]", 2, (b"0", b"1", b"2")),
])
def test_a_sub_offset_forks_inside_the_next_append(content_type, body, sub, expected):
    store = streams()
    create(store, "/s", b"ab" if content_type == TEXT else b"0", content_type)
    anchor = store.get("/s", 0).tail
    append(store, "/s", body, content_type)
    create(store, "/f", content_type=None, forked_from="/s", fork_offset=anchor.offset,
           fork_sub_offset=sub)
    read = store.get("/f", 0).read(START, 1 << 20)
    assert (read.data if content_type == TEXT else read.messages) == expected
    with pytest.raises(BadRequest):
        create(store, "/g", content_type=None, forked_from="/s", fork_offset=anchor.offset,
               fork_sub_offset=len(body) + 1)


def test_a_deleted_source_with_forks_is_gone_until_its_last_fork_goes():
    store = streams()
    create(store, "/s", b"abc")
    create(store, "/f", forked_from="/s")
    store.delete("/s", 0)
    with pytest.raises(Exception) as gone:
        store.get("/s", 0)
    assert gone.value.status == 410  # type: ignore[attr-defined]
    with pytest.raises(StreamConflict):
        create(store, "/s")
    assert text(store, "/f") == b"abc"
    store.delete("/f", 0)
    with pytest.raises(NotFound):
        store.get("/s", 0)
    create(store, "/s")  # the path is free again
    assert store.held == stream_cost(store.get("/s", 0))


def test_the_budget_counts_every_stream_and_returns_through_a_cascade():
    store = streams(budget=3 * STREAM_OVERHEAD)
    create(store, "/s", b"x" * 100)
    create(store, "/f", forked_from="/s")
    with pytest.raises(StreamsFull):
        create(store, "/g", b"y" * STREAM_OVERHEAD)
    store.delete("/s", 0)
    store.delete("/f", 0)
    assert store.held == 0


def test_producers_are_fenced_by_epoch_and_sequence():
    store = streams()
    create(store, "/s")
    append(store, "/s", b"a", producer=("p", 1, 0))
    assert append(store, "/s", b"a", producer=("p", 1, 0)) == Position(1, 1)  # a repeat
    with pytest.raises(StreamConflict) as gap:
        append(store, "/s", b"c", producer=("p", 1, 2))
    assert gap.value.expected == 1  # rendered Producer-Expected-Seq: 1 (tests/http)
    append(store, "/s", b"b", producer=("p", 2, 0))
    with pytest.raises(StaleEpoch) as stale:
        append(store, "/s", b"z", producer=("p", 1, 1))
    assert stale.value.current == 2
    assert text(store, "/s") == b"ab"


def test_a_new_producer_counts_against_the_budget():
    store = streams(budget=STREAM_OVERHEAD + 64)
    create(store, "/s")
    with pytest.raises(StreamsFull):
        append(store, "/s", b"x", producer=("p" * 100, 0, 0))
    assert text(store, "/s") == b""  # nothing stored
