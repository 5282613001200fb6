"""Durable Streams (protocol v1): every stream a node serves, and what each
request to one does: create (or fork), append, close, read, delete, expire,
and the idempotent producers' fencing.

It keeps its streams in memory, one node's own (a stream is not a channel and
never rides the backplane: docs/api.md, "Durable Streams"), and tells a
``Journal`` (``--data-dir``) of each change before it is answered. It never
touches a socket and never reads the clock (``now`` is an argument, in
microseconds). Its values are :mod:`pushup.core.stream_values`';
:mod:`pushup.http.streams` maps HTTP onto it.

A fork chain is walked by loops, never by recursion: a chain a journal kept
from before ``MAX_FORK_DEPTH`` bounded new ones may be of any depth.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pushup.core.errors import (
    BadRequest,
    ForkTooDeep,
    NotFound,
    PushUpError,
    SequenceGap,
    StaleEpoch,
    StreamClosed,
    StreamConflict,
    StreamGone,
    StreamsFull,
    TargetTooLong,
)
from pushup.core.stream_values import (
    JSON_TYPE,
    START,
    Append,
    Appended,
    Creation,
    Entry,
    Position,
    Producer,
    Read,
    expiry_of,
    json_messages,
    make_entry,
    media_type,
    parse_offset,
)

# What ``Streams.budget`` charges: what CPython holds, estimated from
# tracemalloc's count (3.11, the interpreted core; the compiled one holds
# less) and rounded up, so the streams never hold more than the budget.
# A stream's state (the Stream, its lists, id, map slot, a first producer's
# dict: ~660 measured), besides its strings (``stream_cost``):
STREAM_OVERHEAD = 768
# an append's Entry, offsets, index slot, its bytes' header and a JSON
# append's tuple (~175; ~220), besides its bytes (``append_cost``):
ENTRY_OVERHEAD = 256
# each message of a JSON append, held again as its own bytes: their header
# and tuple slot (41), besides the message's bytes:
MESSAGE_OVERHEAD = 48
# each producer a stream has seen, besides its id (~140):
PRODUCER_OVERHEAD = 160
# The most forks a chain may have below its root stream: a fork of a stream this
# deep is refused 400 ``fork_too_deep`` (docs/api.md, "Fork chains"). One rule for
# every node and engine; a read stitches every level (on Redis, read level by level).
MAX_FORK_DEPTH = 64
# The longest path a stream is created at, in bytes as sent (``/v1/stream/`` and
# percent-escapes included): a 201's Location echoes it, and clients refuse a long
# header line (Node's, the protocol's own client, take 16 KiB of headers in all).
MAX_STREAM_PATH = 1024


@dataclass(eq=False)
class Stream:
    """One stream. A fork reads its source (``source``) below ``forked_at``,
    then its own entries."""

    path: str
    uid: str
    content_type: str
    ttl: int | None = None
    expires_at: str | None = None
    deadline: int | None = None  # microseconds
    closed: bool = False
    closed_by: tuple[str, int, int] | None = None
    source: Stream | None = None
    forked_at: Position = START
    fork_request: tuple[str, str | None, int] | None = None  # as asked, for a repeat PUT
    entries: list[Entry] = field(default_factory=list)
    begins: list[int] = field(default_factory=list)  # each entry's begins.size, to bisect
    tail: Position = START
    forks: int = 0
    deleted: bool = False
    producers: dict[str, Producer] = field(default_factory=dict)
    writer_seq: str | None = None
    charged: int = 0  # bytes counted against ``Streams.budget`` for this stream
    waiters: list[Callable[[], None]] = field(default_factory=list)

    @property
    def is_json(self) -> bool:
        return media_type(self.content_type) == JSON_TYPE

    def touch(self, now: int) -> None:
        """A read or a write: a sliding TTL starts again."""
        if self.ttl is not None:
            self.deadline = now + self.ttl * 1_000_000

    def _segments(self, at: Position) -> Iterator[Entry]:
        """The entries at or after ``at`` (the first cut to begin there): a
        fork's sources' first, each up to where the stream above forked it."""
        levels: list[tuple[Stream, Position | None]] = [(self, None)]
        stream = self
        while stream.source is not None and at.size < stream.forked_at.size:
            levels.append((stream.source, stream.forked_at))
            stream = stream.source
        for stream, below in reversed(levels):
            yield from stream._own_segments(at, below)

    def _own_segments(self, at: Position, below: Position | None) -> Iterator[Entry]:
        """This stream's own entries at or after ``at``, up to ``below`` (a
        fork's boundary in it)."""
        entries = self.entries
        start = at.size
        limit = None if below is None else below.size
        for i in range(max(0, bisect_right(self.begins, start) - 1), len(entries)):
            entry = entries[i]
            begins = entry.begins.size
            ends = begins + len(entry.data)  # not entry.ends: no Position made per entry
            if limit is not None and ends > limit:
                return
            if ends <= start:
                continue
            if begins < start and entry.messages is None:
                entry = Entry(at, entry.data[start - begins:])
            yield entry

    def position(self, offset: str) -> Position:
        """The position ``offset`` names: one this stream issued, where one
        of its appends begins or ends (below a fork's boundary, its
        source's); 400 otherwise (``-1`` and ``now`` are the caller's)."""
        at = parse_offset(offset)
        if at.size > self.tail.size:
            raise BadRequest("offset is past the stream's tail")
        if not self.issued(at):
            raise BadRequest(f"offset {offset[:80]!r} is not an offset this stream issued "
                             "(none of its appends begins or ends there)")
        return at

    def issued(self, at: Position) -> bool:
        """Whether ``at`` is where one of this stream's appends begins or
        ends. Another stream's offset is one only where both streams have
        the same count of appends and bytes before it: a position of this
        stream then, whose bytes are this stream's."""
        stream = self
        while stream.source is not None and at.size < stream.forked_at.size:
            stream = stream.source
        if at == stream.tail or at == stream.forked_at:
            return True
        i = bisect_right(stream.begins, at.size) - 1
        return i >= 0 and stream.entries[i].begins == at

    def depth(self) -> int:
        """How many forks lie between this stream and its chain's root,
        counted up to ``MAX_FORK_DEPTH`` (a deeper chain counts as that)."""
        depth = 0
        stream = self
        while stream.source is not None and depth < MAX_FORK_DEPTH:
            depth += 1
            stream = stream.source
        return depth

    def read(self, at: Position, budget: int) -> Read:
        """Entries from ``at`` while under ``budget`` bytes (at least one)."""
        taken: list[Entry] = []
        used = 0
        more = False
        for entry in self._segments(at):
            size = len(entry.data)
            if taken and used + size > budget:
                more = True
                break
            taken.append(entry)
            used += size
        after = taken[-1].ends if taken else max(at, self.tail, key=lambda p: p.size)
        if self.is_json:
            messages = tuple(m for e in taken for m in e.messages or ())
            return Read(b"", messages, after, not more)
        return Read(b"".join([e.data for e in taken]), None, after, not more)

    def next_entry(self, at: Position) -> Entry | None:
        return next(self._segments(at), None)

    def append(self, body: bytes, messages: list[bytes] | None) -> Position:
        entry = make_entry(self.tail, body, messages)
        self.entries.append(entry)
        self.begins.append(entry.begins.size)
        self.tail = entry.ends
        return self.tail

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()


class Journal(Protocol):
    """Where streams are kept across restarts (``--data-dir``): told of every
    change before it is answered. A read's renewal of a TTL is not a change."""

    def saved(self, stream: Stream, entries: Sequence[Entry], mapped: bool) -> None:
        """``stream``'s state as it is now, ``entries`` appended to it, and
        whether it answers at its path (else only its forks read it)."""

    def dropped(self, stream: Stream) -> None:
        """``stream`` is gone, data and all."""


class Streams:
    """Every stream of this node, by path."""

    def __init__(self, uid: Callable[[], str], budget: int) -> None:
        """``budget``: the bytes all streams may hold (``stream_cost`` each,
        ``append_cost`` each append, ``PRODUCER_OVERHEAD`` and its id each
        producer); past it a create or append is refused 507."""
        self._streams: dict[str, Stream] = {}
        self._uid = uid
        self.budget = budget
        self.held = 0
        self.producers = 0  # the producers the streams held keep (/stats)
        self.journal: Journal | None = None

    def restore(self, journal: Journal, streams: Iterable[tuple[Stream, bool]],
                now: int) -> None:
        """Take up the streams ``journal`` kept, each with whether it answers
        at its path (forks linked to their sources already), and tell the
        journal of every change from now on."""
        for stream, mapped in streams:
            self.held += stream.charged
            self.producers += len(stream.producers)
            if mapped:
                self._streams[stream.path] = stream
        self.journal = journal
        self.sweep(now)

    def mapped(self, stream: Stream) -> bool:
        """Whether ``stream`` answers at its path (else forks keep it)."""
        return self._streams.get(stream.path) is stream

    def at(self, path: str) -> Stream | None:
        """The stream answering at ``path``, as held (expired or deleted too)."""
        return self._streams.get(path)

    def place(self, path: str, stream: Stream | None) -> None:
        """``stream`` answers at ``path`` now (None: nothing does), as a store
        shared with other nodes says (``Journal`` not told: it said so)."""
        if stream is None:
            self._streams.pop(path, None)
        else:
            self._streams[path] = stream

    def _saved(self, stream: Stream, entries: Sequence[Entry] = ()) -> None:
        if self.journal is not None:
            self.journal.saved(stream, entries, self.mapped(stream))

    def _charge(self, stream: Stream, size: int) -> None:
        if self.held + size > self.budget:
            raise StreamsFull(f"this node holds {self.held} bytes of streams, its most is "
                              f"{self.budget}: delete streams or give them a TTL")
        self.held += size
        stream.charged += size

    def __len__(self) -> int:
        return len(self._streams)

    def get(self, path: str, now: int) -> Stream:
        """The live stream at ``path``: 404 if none (or expired), 410 if deleted."""
        stream = self._streams.get(path)
        if stream is not None and stream.deadline is not None and now >= stream.deadline:
            self._remove(stream)
            stream = None
        if stream is None:
            raise NotFound(f"no stream at {path[:200]}")
        if stream.deleted:
            raise StreamGone(f"the stream at {path[:200]} was deleted")
        return stream

    def exists(self, path: str, now: int) -> bool:
        try:
            self.get(path, now)
        except PushUpError:
            return False
        return True

    def wake_all(self) -> None:
        """Every stream's held readers, woken (the node drains)."""
        for stream in list(self._streams.values()):
            stream.wake()

    def sweep(self, now: int) -> None:
        """Drop every expired stream (their forks keep what they read)."""
        for stream in [s for s in self._streams.values()
                       if s.deadline is not None and now >= s.deadline]:
            self._remove(stream)

    # -- create ----------------------------------------------------------------

    def create(self, path: str, asked: Creation, now: int) -> tuple[Stream, bool]:
        """The stream at ``path`` and whether this created it (else it is the
        same one asked for again; 409 if it differs). 400 for a stream that
        would be gone before it is read (``Stream-TTL: 0``, an expiry now or
        past); 414 for a path longer than ``MAX_STREAM_PATH``."""
        check_path(path)
        if asked.ttl == 0:
            raise BadRequest("Stream-TTL: 0 would expire the stream at once; give at least 1 "
                             "(seconds), or no TTL")
        if asked.expires_at is not None and expiry_of(asked.expires_at) <= now:
            raise BadRequest(f"Stream-Expires-At {asked.expires_at[:60]!r} is not in the "
                             "future: the stream would expire at once")
        existing = self._streams.get(path)
        if existing is not None and existing.deadline is not None and now >= existing.deadline:
            self._remove(existing)
            existing = None
        if existing is not None:
            if existing.deleted:
                raise StreamConflict("a stream deleted while forks still read it keeps "
                                     "its path until they are gone")
            if not _same(existing, asked):
                raise StreamConflict(f"a stream exists at {path[:200]} with another "
                                     "configuration")
            return existing, False
        stream = (self._fork(path, asked, now) if asked.forked_from is not None else
                  Stream(path, self._uid(), asked.content_type or "application/octet-stream",
                         asked.ttl, asked.expires_at))
        _set_deadline(stream, now)
        messages = json_messages(asked.body, True) if asked.body and stream.is_json else None
        stored = bool(asked.body) and (messages is None or bool(messages))  # ``[]``: empty
        self._charge(stream, stream_cost(stream)
                     + sum(append_cost(e.data, e.messages) for e in stream.entries)
                     + (append_cost(asked.body, messages) if stored else 0))
        if stored:
            stream.append(asked.body, messages)
        stream.closed = asked.closed
        if stream.source is not None:
            stream.source.forks += 1
            self._saved(stream.source)
        self._streams[path] = stream
        self._saved(stream, stream.entries)
        return stream, True

    def _fork(self, path: str, asked: Creation, now: int) -> Stream:
        source_path = asked.forked_from or ""
        source = self._streams.get(source_path)
        if source is not None and source.deleted:
            raise StreamConflict("the source stream was deleted (forks still read it)")
        try:
            source = self.get(source_path, now)
        except StreamGone:
            raise StreamConflict("the source stream was deleted") from None
        if source.depth() >= MAX_FORK_DEPTH:
            raise ForkTooDeep(f"the source stream is a fork {MAX_FORK_DEPTH} forks below its "
                              "root already, the most a chain may be: fork a stream "
                              "nearer the root")
        if asked.content_type is not None and (
                media_type(asked.content_type) != media_type(source.content_type)):
            raise StreamConflict("a fork's Content-Type must be its source's")
        at = source.tail if asked.fork_offset is None else parse_offset(asked.fork_offset)
        if at.size > source.tail.size or at.appends > source.tail.appends:
            raise BadRequest("Stream-Fork-Offset is past the source stream's tail")
        if not source.issued(at):
            raise BadRequest("Stream-Fork-Offset is not an offset the source stream issued "
                             "(none of its appends begins or ends there)")
        ttl, expires = asked.ttl, asked.expires_at
        if ttl is None and expires is None:
            ttl, expires = source.ttl, source.expires_at
        fork = Stream(path, self._uid(), asked.content_type or source.content_type,
                      ttl, expires, source=source, forked_at=at, tail=at,
                      fork_request=(source_path, asked.fork_offset, asked.fork_sub_offset))
        if asked.fork_sub_offset:
            head = source.next_entry(at)
            whole = (len(head.messages) if head is not None and head.messages is not None
                     else len(head.data) if head is not None else 0)
            if asked.fork_sub_offset > whole:
                raise BadRequest("Stream-Fork-Sub-Offset is past the next append's end")
            assert head is not None
            if head.messages is not None:
                fork.append(b"", list(head.messages[:asked.fork_sub_offset]))
            else:
                fork.append(head.data[:asked.fork_sub_offset], None)
        return fork

    # -- append and close ------------------------------------------------------

    def append(self, path: str, asked: Append, now: int) -> Appended:
        stream = self.get(path, now)
        producer = asked.producer
        if stream.closed:
            if producer is not None and stream.closed_by == producer:
                return Appended(stream.tail, True, duplicate=True, producer_seq=producer[2])
            if not asked.body:
                return Appended(stream.tail, True)  # closing again: idempotent
            raise StreamClosed("the stream is closed", stream.tail.offset)
        if asked.body and asked.content_type is not None and (
                media_type(asked.content_type) != media_type(stream.content_type)):
            raise StreamConflict(f"this stream's Content-Type is {stream.content_type}")
        state = None
        if producer is not None:
            state = _fence(stream, producer)
            if state is None:
                known = stream.producers[producer[0]]
                return Appended(stream.tail, stream.closed, duplicate=True,
                                producer_seq=known.last_seq)
        if asked.writer_seq is not None and stream.writer_seq is not None and (
                asked.writer_seq.encode() <= stream.writer_seq.encode()):
            raise StreamConflict(f"Stream-Seq {asked.writer_seq[:40]!r} is not after "
                                 f"{stream.writer_seq[:40]!r}")
        messages = json_messages(asked.body, False) if asked.body and stream.is_json else None
        new_producer = producer is not None and producer[0] not in stream.producers
        self._charge(stream, (append_cost(asked.body, messages) if asked.body else 0) + (
            PRODUCER_OVERHEAD + len(producer[0]) if producer is not None and new_producer else 0)
            + max(0, len(asked.writer_seq or "") - len(stream.writer_seq or "")))
        if asked.body:
            stream.append(asked.body, messages)
        if producer is not None and state is not None:
            stream.producers[producer[0]] = state
            self.producers += new_producer
        if asked.writer_seq is not None:
            stream.writer_seq = asked.writer_seq
        if asked.close:
            stream.closed = True
            stream.closed_by = producer
        stream.touch(now)
        self._saved(stream, stream.entries[-1:] if asked.body else ())
        stream.wake()
        return Appended(stream.tail, stream.closed,
                        producer_seq=None if producer is None else producer[2])

    # -- delete ----------------------------------------------------------------

    def delete(self, path: str, now: int) -> None:
        stream = self.get(path, now)
        if stream.forks:
            stream.deleted = True  # forks still read it: 410 until they go
            self._saved(stream)
            stream.wake()
            return
        self._remove(stream)

    def drop(self, stream: Stream) -> None:
        """Forget ``stream``, which no path answers with: a fork a shared
        store created but then gave its path to another (its source counts
        it no more; a deleted source whose last fork it was goes too)."""
        self._remove(stream)

    def _remove(self, stream: Stream) -> None:
        """Forget ``stream`` (its forks still read what they hold of it: it
        goes once they do); its source too when that was deleted and this
        was its last fork, and so on up the chain."""
        while True:
            if self._streams.get(stream.path) is stream:
                del self._streams[stream.path]
            stream.deleted = True
            stream.wake()
            if stream.forks:
                self._saved(stream)
                return
            self.held -= stream.charged
            self.producers -= len(stream.producers)
            if self.journal is not None:
                self.journal.dropped(stream)
            source = stream.source
            if source is None:
                return
            source.forks -= 1
            if source.forks or not source.deleted:
                self._saved(source)
                return
            stream = source


def check_path(path: str) -> None:
    """414 when a stream may not be created at ``path``: longer than
    ``MAX_STREAM_PATH`` (a PUT is refused so before it goes anywhere)."""
    if len(path) > MAX_STREAM_PATH:
        raise TargetTooLong(f"a stream's path is at most {MAX_STREAM_PATH} bytes (this one is "
                            f"{len(path)})")


def stream_cost(stream: Stream) -> int:
    """What ``stream`` is charged besides its appends and producers: its
    state and the strings it keeps (its path, Content-Type and
    Stream-Expires-At; a fork, its source's path as asked)."""
    source = "" if stream.fork_request is None else stream.fork_request[0]
    return (STREAM_OVERHEAD + len(stream.path) + len(stream.content_type)
            + len(stream.expires_at or "") + len(source))


def append_cost(data: bytes, messages: Sequence[bytes] | None) -> int:
    """What an append is charged: its bytes, or a JSON append's messages held
    twice (joined, each with its comma, and each on its own), and what
    keeping it costs besides (``ENTRY_OVERHEAD``, ``MESSAGE_OVERHEAD``)."""
    if messages is None:
        return ENTRY_OVERHEAD + len(data)
    return ENTRY_OVERHEAD + sum(2 * len(m) + 1 + MESSAGE_OVERHEAD for m in messages)


def _same(stream: Stream, asked: Creation) -> bool:
    """Whether a PUT asks for the stream that is there."""
    wanted_type = asked.content_type or (stream.content_type if asked.forked_from
                                         else "application/octet-stream")
    if stream.fork_request is not None:
        source, offset, sub = stream.fork_request
        if asked.forked_from != source or asked.fork_sub_offset != sub or (
                asked.fork_offset is not None and asked.fork_offset != offset):
            return False
        ttl, expires = stream.ttl, stream.expires_at
        if asked.ttl is not None or asked.expires_at is not None:
            ttl, expires = asked.ttl, asked.expires_at
        return (media_type(wanted_type) == media_type(stream.content_type)
                and (ttl, expires) == (stream.ttl, stream.expires_at)
                and asked.closed == stream.closed)
    return (asked.forked_from is None
            and media_type(wanted_type) == media_type(stream.content_type)
            and asked.ttl == stream.ttl and asked.expires_at == stream.expires_at
            and asked.closed == stream.closed)


def _set_deadline(stream: Stream, now: int) -> None:
    if stream.expires_at is not None:
        stream.deadline = expiry_of(stream.expires_at)
    else:
        stream.touch(now)


def _fence(stream: Stream, producer: tuple[str, int, int]) -> Producer | None:
    """A producer's state after this append, or None for a repeat (already
    stored); 403, 400 or 409 when it may not append (protocol §5.2.1)."""
    name, epoch, seq = producer
    known = stream.producers.get(name)
    if known is None or epoch > known.epoch:
        if seq != 0:
            if known is None:
                raise SequenceGap("a new producer starts at Producer-Seq 0", 0, seq)
            raise BadRequest("a new Producer-Epoch starts at Producer-Seq 0")
        return Producer(epoch, 0)
    if epoch < known.epoch:
        raise StaleEpoch(known.epoch)
    if seq <= known.last_seq:
        return None
    if seq != known.last_seq + 1:
        raise SequenceGap(f"Producer-Seq {seq} skips ahead of {known.last_seq + 1}",
                          known.last_seq + 1, seq)
    return Producer(epoch, seq)


# -- a stream as kept (--data-dir, the Redis engine) -------------------------------

def state_of(stream: Stream, mapped: bool) -> dict[str, Any]:
    """``stream``'s state but its appends, as JSON values (``--data-dir``, Redis)."""
    return {
        "path": stream.path, "content_type": stream.content_type, "ttl": stream.ttl,
        "expires_at": stream.expires_at, "deadline": stream.deadline,
        "closed": stream.closed, "closed_by": stream.closed_by,
        "source": None if stream.source is None else stream.source.uid,
        "forked_at": [stream.forked_at.appends, stream.forked_at.size],
        "fork_request": stream.fork_request,
        "tail": [stream.tail.appends, stream.tail.size], "forks": stream.forks,
        "deleted": stream.deleted, "mapped": mapped,
        "producers": {name: [p.epoch, p.last_seq] for name, p in stream.producers.items()},
        "writer_seq": stream.writer_seq, "charged": stream.charged,
    }


def stream_of(uid: str, state: dict[str, Any]) -> Stream:
    """The stream ``state_of`` gave (no appends yet, no source linked)."""
    closed_by = state["closed_by"]
    fork_request = state["fork_request"]
    return Stream(
        state["path"], uid, state["content_type"], state["ttl"], state["expires_at"],
        state["deadline"], state["closed"],
        None if closed_by is None else (closed_by[0], closed_by[1], closed_by[2]),
        None, Position(*state["forked_at"]),
        None if fork_request is None else (fork_request[0], fork_request[1], fork_request[2]),
        tail=Position(*state["tail"]), forks=state["forks"], deleted=state["deleted"],
        producers={name: Producer(epoch, seq) for name, (epoch, seq)
                   in state["producers"].items()},
        writer_seq=state["writer_seq"], charged=state["charged"])


def entry_of(begins: Position, data: bytes, lengths: str | None) -> Entry:
    """An append as kept: its bytes and, JSON, each message's length (JSON)."""
    if lengths is None:
        return Entry(begins, data)
    messages = []
    at = 0
    for length in json.loads(lengths):
        messages.append(data[at:at + length])
        at += length + 1  # the comma after each
    return Entry(begins, data, tuple(messages))
