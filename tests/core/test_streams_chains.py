"""pushup/core/streams.py's forks and creation, at their edges: chains of forks
deeper than Python's recursion (read, deleted, expired, kept), the bound on a
chain's depth, what a creation may ask (a TTL, an expiry, a path), a fork of a
closed stream, and the offsets a stream takes (those it issued, only). Values,
``now`` an argument."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest

from pushup.core.errors import BadRequest, ForkTooDeep, NotFound, StreamGone, TargetTooLong
from pushup.core.stream import Stream
from pushup.core.stream_values import (
    START,
    Append,
    Creation,
    Entry,
    Position,
)
from pushup.core.streams import MAX_FORK_DEPTH, MAX_STREAM_PATH, Streams

TEXT = "text/plain"
NOW = 1_763_800_000_000_000  # microseconds


def streams() -> Streams:
    ids = iter(range(10**6))
    return Streams(lambda: str(next(ids)), 10**9)


def create(store: Streams, path: str, body: bytes = b"", *, ttl: int | None = None,
           expires_at: str | None = None, closed: bool = False, **fork: object) -> Stream:
    stream, created = store.create(path, Creation(
        TEXT if not fork else None, ttl, expires_at, closed, body, **fork),  # type: ignore[arg-type]
        NOW)
    assert created
    return stream


def append(store: Streams, path: str, body: bytes) -> Position:
    return store.append(path, Append(TEXT, body, False), NOW).tail


class Kept:
    """A journal that keeps nothing and counts what it was told."""

    def __init__(self) -> None:
        self.dropped_paths: list[str] = []

    def saved(self, stream: Stream, entries: Sequence[Entry], mapped: bool) -> None:
        pass

    def dropped(self, stream: Stream) -> None:
        self.dropped_paths.append(stream.path)


def kept_chain(depth: int, deadline: int | None = None) -> list[Stream]:
    """A chain of ``depth`` forks below a root, each fork one byte on its
    source's tail, as a journal kept it from before chains were bounded:
    every ancestor deleted (kept for its fork), the deepest live."""
    chain = [Stream("/c0", "0", TEXT, deleted=True, forks=1)]
    chain[0].append(b"0", None)
    for level in range(1, depth + 1):
        source = chain[-1]
        fork = Stream(f"/c{level}", str(level), TEXT, source=source, forked_at=source.tail,
                      tail=source.tail, fork_request=(source.path, None, 0),
                      deleted=level < depth, forks=1 if level < depth else 0)
        fork.append(b"%d" % (level % 10), None)
        chain.append(fork)
    chain[-1].deadline = deadline
    return chain


DEEP = 3 * sys.getrecursionlimit()


def test_a_chain_deeper_than_the_recursion_limit_reads_whole():
    chain = kept_chain(DEEP)
    store = streams()
    store.restore(Kept(), [(s, True) for s in chain], NOW)
    deepest = store.get(chain[-1].path, NOW)
    read = deepest.read(START, 1 << 30)
    assert read.data == b"".join(b"%d" % (level % 10) for level in range(DEEP + 1))
    assert read.next == deepest.tail == Position(DEEP + 1, DEEP + 1)
    middle = Position(DEEP // 2, DEEP // 2)
    assert deepest.read(middle, 1 << 30).data == read.data[DEEP // 2:]
    assert deepest.next_entry(START) == Entry(START, b"0")


def test_deleting_the_last_fork_of_a_deep_chain_drops_every_deleted_ancestor():
    chain = kept_chain(DEEP)
    journal = Kept()
    store = streams()
    store.restore(journal, [(s, True) for s in chain], NOW)
    with pytest.raises(StreamGone):
        store.get("/c0", NOW)
    store.delete(chain[-1].path, NOW)
    assert len(journal.dropped_paths) == DEEP + 1  # the fork and every ancestor, all of it
    for stream in chain:
        with pytest.raises(NotFound):
            store.get(stream.path, NOW)
    create(store, "/c0")  # each path is free again
    assert len(store) == 1


def test_an_expired_deep_fork_restored_goes_with_its_deleted_ancestors():
    chain = kept_chain(DEEP, deadline=NOW - 1)
    journal = Kept()
    store = streams()
    store.restore(journal, [(s, True) for s in chain], NOW)  # restore sweeps the expired
    assert len(journal.dropped_paths) == DEEP + 1
    assert len(store) == 0


def test_a_chain_is_at_most_max_fork_depth_forks_deep():
    store = streams()
    create(store, "/f0", b"root")
    for level in range(1, MAX_FORK_DEPTH + 1):
        create(store, f"/f{level}", forked_from=f"/f{level - 1}")
    with pytest.raises(ForkTooDeep) as refused:
        create(store, "/too-deep", forked_from=f"/f{MAX_FORK_DEPTH}")
    assert (refused.value.status, refused.value.code) == (400, "fork_too_deep")
    assert store.at("/too-deep") is None
    assert store.get(f"/f{MAX_FORK_DEPTH}", NOW).read(START, 1 << 20).data == b"root"
    create(store, "/sibling", forked_from=f"/f{MAX_FORK_DEPTH - 1}")  # a fork of a shallower one


@pytest.mark.parametrize(("ttl", "expires_at"), [
    (0, None), (None, "2020-01-01T00:00:00Z"), (None, "2025-11-22T08:26:40Z")])  # NOW, exactly
def test_a_creation_that_would_expire_at_once_is_400(ttl, expires_at):
    store = streams()
    with pytest.raises(BadRequest):
        create(store, "/s", b"x", ttl=ttl, expires_at=expires_at)
    assert store.at("/s") is None and store.held == 0


def test_a_creation_that_expires_later_is_made():
    store = streams()
    create(store, "/ttl", ttl=1)
    create(store, "/at", expires_at="2025-11-22T08:26:41Z")
    assert store.exists("/ttl", NOW) and store.exists("/at", NOW)


def test_a_path_is_at_most_max_stream_path_bytes():
    store = streams()
    longest = "/v1/stream/" + "p" * (MAX_STREAM_PATH - len("/v1/stream/"))
    create(store, longest)
    with pytest.raises(TargetTooLong) as refused:
        create(store, longest + "p")
    assert refused.value.status == 414
    with pytest.raises(TargetTooLong):
        create(store, longest + "p", forked_from=longest)
    assert len(store) == 1


def test_a_fork_of_a_closed_stream_starts_open():
    """PROTOCOL.md §4.2, "Closed stream forking": "The resulting fork starts in
    the open state regardless of the source stream's closed status"."""
    store = streams()
    create(store, "/s", b"done", closed=True)
    fork = create(store, "/f", forked_from="/s")
    assert not fork.closed
    append(store, "/f", b"+more")
    assert fork.read(START, 1 << 20).data == b"done+more"
    assert store.get("/s", NOW).closed


def two_streams() -> tuple[Streams, Stream, Stream]:
    """``/a`` with appends of 2 bytes, ``/b`` of 3: offsets of one fall inside the other."""
    store = streams()
    a = create(store, "/a")
    b = create(store, "/b")
    for _ in range(3):
        append(store, "/a", b"aa")
        append(store, "/b", b"bbb")
    return store, a, b


def test_a_stream_takes_the_offsets_it_issued():
    _, a, b = two_streams()
    for stream, size in ((a, 2), (b, 3)):
        for appends in range(4):
            at = Position(appends, appends * size)
            assert stream.position(at.offset) == at
            assert stream.read(at, 1 << 20).next == stream.tail


@pytest.mark.parametrize("offset", [
    "0000000000000001_0000000000000002",  # /a's first tail: inside /b's first append
    "0000000000000002_0000000000000003",  # /b's size with another count
    "0000000000000000_0000000000000001",  # no append ends there
])
def test_an_offset_this_stream_never_issued_is_400(offset):
    _, _, b = two_streams()
    with pytest.raises(BadRequest) as refused:
        b.position(offset)
    assert refused.value.status == 400


def test_a_fork_takes_its_sources_offsets_below_the_fork_and_its_own_after():
    store, a, _ = two_streams()
    fork = create(store, "/f", forked_from="/a", fork_offset=Position(2, 4).offset)
    append(store, "/f", b"f")
    append(store, "/f", b"f")
    for at in (START, Position(1, 2), Position(2, 4), Position(3, 5), Position(4, 6)):
        assert fork.position(at.offset) == at
    with pytest.raises(BadRequest):
        fork.position(Position(3, 6).offset)  # /a's tail, past the fork
    with pytest.raises(BadRequest):
        a.position(Position(3, 5).offset)  # the fork's, not its source's


def test_a_fork_offset_inside_an_append_is_400():
    store, _, _ = two_streams()
    with pytest.raises(BadRequest):
        create(store, "/f", forked_from="/b", fork_offset=Position(1, 2).offset)
    assert store.at("/f") is None
