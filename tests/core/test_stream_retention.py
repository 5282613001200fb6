"""A Durable Stream's retention (issue 39, part 2), as values: the oldest
appends go by size or by age, the newest always stays, an offset before the
earliest kept is 410 ``offset_gone`` naming it, a read from the start begins
there, and no offset is ever issued twice. No clock (``now`` is an argument,
in microseconds)."""

from __future__ import annotations

import pytest

from pushup.core.errors import BadRequest, OffsetGone
from pushup.core.stream import MARKS_PER_AGE
from pushup.core.stream_values import START, Append, Creation
from pushup.core.streams import Streams

S = 1_000_000  # a second, in the core's microseconds


def store() -> Streams:
    ids = iter(range(10**6))
    return Streams(lambda: str(next(ids)), 10**9)


def create(streams: Streams, path: str, age: int | None = None, size: int | None = None,
           now: int = 0) -> None:
    streams.create(path, Creation("text/plain", None, None, False, b"", None, None, 0, age,
                                  size), now)


def append(streams: Streams, path: str, body: bytes, now: int = 0) -> str:
    return streams.append(path, Append("text/plain", body, False), now).tail.offset


def test_by_size_the_oldest_appends_go_and_an_offset_before_the_earliest_is_gone():
    streams = store()
    create(streams, "s", size=250)
    offsets = [append(streams, "s", b"%03d" % i + b"." * 97) for i in range(10)]
    stream = streams.get("s", 0)
    # 1,000 bytes appended: the newest two (200 bytes) are what 250 keeps
    assert stream.earliest.offset == offsets[7]
    assert stream.read(START, 10**6).data == b"008" + b"." * 97 + b"009" + b"." * 97
    assert stream.read(stream.position(offsets[8]), 10**6).data.startswith(b"009")
    with pytest.raises(OffsetGone) as gone:
        stream.position(offsets[3])
    assert (gone.value.status, gone.value.code, gone.value.earliest) == (
        410, "offset_gone", offsets[7])
    # offsets go on from the tail: none issued again
    assert append(streams, "s", b"x") == "0000000000000011_0000000000001001"


def test_the_newest_append_stays_whatever_its_size():
    streams = store()
    create(streams, "s", size=10)
    append(streams, "s", b"a" * 50)
    last = append(streams, "s", b"b" * 50)
    stream = streams.get("s", 0)
    assert stream.read(START, 10**6).data == b"b" * 50
    assert stream.read(START, 10**6).next.offset == last


def test_by_age_an_append_goes_once_older_than_the_age_and_reads_renew_nothing():
    streams = store()
    create(streams, "s", age=10)
    old = append(streams, "s", b"old;", now=0)
    append(streams, "s", b"newer;", now=5 * S)
    assert streams.get("s", 9 * S).read(START, 10**6).data == b"old;newer;"
    # past the age (and its share, 1/16): the first goes when the stream is next asked for
    late = 10 * S + 10 * S // MARKS_PER_AGE + 1
    stream = streams.get("s", late)
    assert stream.read(START, 10**6).data == b"newer;"
    with pytest.raises(OffsetGone):
        stream.position("0000000000000000_0000000000000000")  # -1's own offset, once kept
    assert stream.position(old) == stream.earliest  # the first kept begins where it ended


def test_what_goes_is_no_longer_charged_against_the_node_budget():
    streams = store()
    create(streams, "s", size=100)
    for _ in range(20):
        append(streams, "s", b"." * 100)
    held = streams.held
    for _ in range(20):
        append(streams, "s", b"." * 100)
    assert streams.held == held


def test_a_forked_stream_keeps_everything_its_forks_read():
    streams = store()
    create(streams, "s", size=10)
    append(streams, "s", b"a" * 50)
    streams.create("f", Creation(None, None, None, False, b"", "s"), 0)
    append(streams, "s", b"b" * 50)
    assert streams.get("s", 0).read(START, 10**6).data == b"a" * 50 + b"b" * 50
    assert streams.get("f", 0).read(START, 10**6).data == b"a" * 50


def test_retention_below_one_is_refused():
    with pytest.raises(BadRequest):
        create(store(), "s", size=0)


def test_a_repeated_creation_asks_for_the_same_retention():
    streams = store()
    create(streams, "s", age=60)
    create(streams, "s", age=60)  # the same: idempotent
    from pushup.core.errors import StreamConflict
    with pytest.raises(StreamConflict):
        create(streams, "s", age=61)
