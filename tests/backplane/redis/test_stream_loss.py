"""Telling that Redis lost writes a node's cache read
(pushup/backplane/redis/stream_loss.py): READ's reply as values, no Redis."""

from __future__ import annotations

import json

from pushup.backplane.redis.stream_loss import diverged, unpacked
from pushup.core.stream import Stream
from pushup.core.stream_state import entry_of
from pushup.core.stream_values import Position


def cached(*parts: bytes) -> Stream:
    """A text stream whose cache holds ``parts``, one append each."""
    stream = Stream("p", "u1", "text/plain")
    at = Position(0, 0)
    for part in parts:
        stream.entries.append(entry_of(at, part, None))
        at = Position(at.appends + 1, at.size + len(part))
    return stream


def head(appends: int, size: int, mark: str | None = None) -> bytes:
    fields: list[object] = [appends, size, None] + ([] if mark is None else [mark])
    return json.dumps(fields).encode()


def reply(count: int, before: bytes, *items: bytes) -> list[object]:
    """READ's reply for a changed stream: Redis holds ``count`` appends."""
    return [b"u1", b"u1", b"9", b"{}", b"", b"w", count, before, *items]


def test_redis_holding_fewer_appends_than_the_cache_diverged() -> None:
    assert diverged(cached(b"a", b"b", b"c"), "m3", reply(2, b""), 3)


def test_another_append_where_the_caches_last_is_diverged_even_at_its_position() -> None:
    """Same count, same position (appends of the same sizes), another write."""
    assert diverged(cached(b"a", b"b"), "mine", reply(2, head(1, 1, "theirs")), 2)


def test_the_same_last_append_followed_by_others_is_the_cache_grown() -> None:
    item = head(2, 2, "next") + b"\nc"
    assert not diverged(cached(b"a", b"b"), "mine", reply(3, head(1, 1, "mine"), item), 2)


def test_appends_read_from_the_start_are_compared_where_the_caches_last_is() -> None:
    """Read by uid (the cache held it as a source): every append sent."""
    items = [head(0, 0, "m") + b"\na", head(1, 1, "x") + b"\nB"]
    assert diverged(cached(b"a", b"b"), "mine", reply(2, b"", *items), 0)
    assert not diverged(cached(b"a", b"b"), "x", reply(2, b"", *items), 0)


def test_an_append_of_another_size_at_the_caches_last_diverged_without_marks() -> None:
    """Appends written before they carried a mark: their positions decide."""
    assert diverged(cached(b"aa", b"b"), None, reply(2, head(1, 1)), 2)
    assert not diverged(cached(b"a", b"b"), None, reply(2, head(1, 1)), 2)


def test_an_empty_cache_never_diverged() -> None:
    assert not diverged(cached(), None, reply(0, b""), 0)


def test_an_append_reads_back_with_its_mark_and_without_one() -> None:
    entry, mark = unpacked(head(3, 7, "m") + b"\nxyz")
    assert (entry.begins, entry.data, mark) == (Position(3, 7), b"xyz", "m")
    assert unpacked(head(0, 0) + b"\nq")[1] is None
