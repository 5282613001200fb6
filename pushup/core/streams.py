"""Durable Streams (protocol v1): append-only byte streams read from an offset.

This module holds every stream a node serves and decides what each request to
one does: create (or fork), append, close, read, delete, expire, and the
idempotent producers' fencing. It keeps its streams in memory, one node's own
(a stream is not a channel and never rides the backplane: docs/api.md, "Durable
Streams"); it never touches a socket and never reads the clock (``now`` is an
argument, in microseconds). :mod:`pushup.http.streams` maps HTTP onto it.

An offset is ``"<appends>_<bytes>"``, two 16-digit decimals: how many appends
and how many stored bytes lie before the position. Both only grow, so offsets
sort lexicographically, and both are functions of the stream's content alone:
the same position has the same offset wherever it is computed.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from pushup.core.errors import BadJSON, BadRequest, NotFound, PushUpError
from pushup.core.model import loads

JSON_TYPE = "application/json"
MAX_SAFE = 2**53 - 1  # the protocol's bound on producer epochs and sequences
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_OFFSET = re.compile(r"([0-9]{1,19})_([0-9]{1,19})")
_MEDIA_TYPE = re.compile(r"[\w.+-]+/[\w.+-]+")
STREAM_OVERHEAD = 512  # bytes a stream is charged besides its data (its state, its path)
PRODUCER_OVERHEAD = 128  # and each producer it has seen, besides its id


class StreamConflict(PushUpError, status=409, code="stream_conflict"):
    """409: the stream exists otherwise, is closed, or a sequence went back."""

    def __init__(self, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.headers = headers


class StreamGone(PushUpError, status=410, code="stream_gone"):
    """410: the stream was deleted while forks still read it."""


class StreamsFull(PushUpError, status=507, code="streams_full"):
    """507: the node holds as many stream bytes as it may (``budget``)."""


class StaleEpoch(PushUpError, status=403, code="stale_producer_epoch"):
    """403: a producer's epoch older than the stream has seen (a zombie)."""

    def __init__(self, current: int) -> None:
        super().__init__(f"producer epoch is stale; the current one is {current}")
        self.current = current


@dataclass(frozen=True, slots=True)
class Position:
    """A place in a stream: appends and stored bytes before it."""

    appends: int
    size: int

    @property
    def offset(self) -> str:
        return f"{self.appends:016d}_{self.size:016d}"


START = Position(0, 0)


def parse_offset(text: str) -> Position:
    """An offset we issue; 400 otherwise (``-1`` and ``now`` are the caller's)."""
    match = _OFFSET.fullmatch(text)
    if match is None:
        raise BadRequest(f"offset {text[:80]!r} is not an offset this stream issued")
    return Position(int(match[1]), int(match[2]))


def media_type(content_type: str) -> str:
    """The part of a Content-Type two streams' types are compared by."""
    return content_type.split(";", 1)[0].strip().lower()


def is_media_type(content_type: str) -> bool:
    return _MEDIA_TYPE.match(content_type.strip()) is not None


def decimal(text: str, name: str, most: int = MAX_SAFE) -> int:
    """A non-negative decimal without sign, point or leading zero; 400 otherwise."""
    if _DECIMAL.fullmatch(text) is None or int(text) > most:
        raise BadRequest(f"{name} must be a non-negative integer, in decimal, "
                         f"without sign or leading zeros (got {text[:40]!r})")
    return int(text)


def expiry_of(text: str) -> int:
    """An RFC 3339 time as Unix microseconds; 400 otherwise."""
    try:
        when = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise BadRequest(f"Stream-Expires-At {text[:60]!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise BadRequest("Stream-Expires-At needs a time zone (Z or +hh:mm)")
    return int(when.timestamp() * 1_000_000)


def json_messages(body: bytes, creating: bool) -> list[bytes]:
    """A JSON body's messages: an array is flattened one level; each message
    is kept in compact form. 400 for bad JSON (as strict as /publish's: no
    NaN, bounded nesting) or an empty array on append."""
    value = loads(body)
    values = value if isinstance(value, list) else [value]
    if not values and not creating:
        raise BadRequest("an append of an empty JSON array adds nothing")
    try:
        return [json.dumps(v, separators=(",", ":"), ensure_ascii=False,
                           allow_nan=False).encode() for v in values]
    except RecursionError:
        raise BadJSON("the JSON body is nested too deeply") from None
    except ValueError as e:
        raise BadJSON(f"the body cannot be kept as JSON: {e}") from None


@dataclass(frozen=True, slots=True)
class Entry:
    """One append as stored: its bytes (JSON: its messages, each with a
    trailing comma) and where it begins."""

    begins: Position
    data: bytes
    messages: tuple[bytes, ...] | None = None

    @property
    def ends(self) -> Position:
        return Position(self.begins.appends + 1, self.begins.size + len(self.data))


def _entry(begins: Position, body: bytes, messages: list[bytes] | None) -> Entry:
    if messages is None:
        return Entry(begins, body)
    return Entry(begins, b"".join(m + b"," for m in messages), tuple(messages))


@dataclass(frozen=True, slots=True)
class Read:
    """What a read returns: ``data`` (JSON streams: the messages), where the
    next read begins, and whether that is the stream's tail."""

    data: bytes
    messages: tuple[bytes, ...] | None
    next: Position
    up_to_date: bool


@dataclass(slots=True)
class Producer:
    epoch: int
    last_seq: int


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

    def _segments(self, at: Position, below: Position | None) -> Iterator[Entry]:
        """The entries at or after ``at`` (the first cut to begin there), up
        to ``below`` (a fork's boundary in its source)."""
        if self.source is not None and at.size < self.forked_at.size:
            yield from self.source._segments(at, self.forked_at)
        entries = self.entries
        for i in range(max(0, bisect_right(self.begins, at.size) - 1), len(entries)):
            entry = entries[i]
            ends = entry.ends
            if below is not None and ends.size > below.size:
                return
            if ends.size <= at.size:
                continue
            if entry.begins.size < at.size and entry.messages is None:
                entry = Entry(at, entry.data[at.size - entry.begins.size:])
            yield entry

    def read(self, at: Position, budget: int) -> Read:
        """Entries from ``at`` while under ``budget`` bytes (at least one)."""
        taken: list[Entry] = []
        used = 0
        more = False
        for entry in self._segments(at, None):
            if taken and used + len(entry.data) > budget:
                more = True
                break
            taken.append(entry)
            used += len(entry.data)
        after = taken[-1].ends if taken else max(at, self.tail, key=lambda p: p.size)
        if self.is_json:
            messages = tuple(m for e in taken for m in e.messages or ())
            return Read(b"", messages, after, not more)
        return Read(b"".join(e.data for e in taken), None, after, not more)

    def next_entry(self, at: Position) -> Entry | None:
        return next(self._segments(at, None), None)

    def append(self, body: bytes, messages: list[bytes] | None) -> Position:
        entry = _entry(self.tail, body, messages)
        self.entries.append(entry)
        self.begins.append(entry.begins.size)
        self.tail = entry.ends
        return self.tail

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()


@dataclass(frozen=True, slots=True)
class Creation:
    """A PUT's values, checked."""

    content_type: str | None  # None: a fork's, inherited
    ttl: int | None
    expires_at: str | None
    closed: bool
    body: bytes
    forked_from: str | None = None
    fork_offset: str | None = None
    fork_sub_offset: int = 0


@dataclass(frozen=True, slots=True)
class Append:
    """A POST's values, checked."""

    content_type: str | None
    body: bytes
    close: bool
    writer_seq: str | None = None
    producer: tuple[str, int, int] | None = None  # id, epoch, seq


@dataclass(frozen=True, slots=True)
class Appended:
    """What an append answers: the tail after it, whether the stream is now
    closed, and for a producer whether it was new (200) or a repeat (204)."""

    tail: Position
    closed: bool
    duplicate: bool = False
    producer_seq: int | None = None


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
        """``budget``: the bytes all streams may hold (data, plus
        ``STREAM_OVERHEAD`` each); past it a create or append is refused 507."""
        self._streams: dict[str, Stream] = {}
        self._uid = uid
        self.budget = budget
        self.held = 0
        self.journal: Journal | None = None

    def restore(self, journal: Journal, streams: Iterable[tuple[Stream, bool]],
                now: int) -> None:
        """Take up the streams ``journal`` kept, each with whether it answers
        at its path (forks linked to their sources already), and tell the
        journal of every change from now on."""
        for stream, mapped in streams:
            self.held += stream.charged
            if mapped:
                self._streams[stream.path] = stream
        self.journal = journal
        self.sweep(now)

    def mapped(self, stream: Stream) -> bool:
        """Whether ``stream`` answers at its path (else forks keep it)."""
        return self._streams.get(stream.path) is stream

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
        same one asked for again; 409 if it differs)."""
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
        self._charge(stream, STREAM_OVERHEAD + sum(len(e.data) for e in stream.entries)
                     + len(asked.body))
        if asked.body and (messages is None or messages):  # ``[]``: an empty JSON stream
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
        if asked.content_type is not None and (
                media_type(asked.content_type) != media_type(source.content_type)):
            raise StreamConflict("a fork's Content-Type must be its source's")
        at = source.tail if asked.fork_offset is None else parse_offset(asked.fork_offset)
        if at.size > source.tail.size or at.appends > source.tail.appends:
            raise BadRequest("Stream-Fork-Offset is past the source stream's tail")
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
            raise StreamConflict("the stream is closed", _closed_headers(stream))
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
        self._charge(stream, len(asked.body) + (
            PRODUCER_OVERHEAD + len(producer[0]) if producer is not None and new_producer else 0))
        if asked.body:
            stream.append(asked.body, messages)
        if producer is not None and state is not None:
            stream.producers[producer[0]] = state
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

    def _remove(self, stream: Stream) -> None:
        """Forget ``stream`` (its forks still read what they hold of it: it
        goes once they do); its source too when that was deleted and this
        was its last fork."""
        if self._streams.get(stream.path) is stream:
            del self._streams[stream.path]
        stream.deleted = True
        stream.wake()
        if stream.forks:
            self._saved(stream)
            return
        self.held -= stream.charged
        if self.journal is not None:
            self.journal.dropped(stream)
        source = stream.source
        if source is not None:
            source.forks -= 1
            if source.forks == 0 and source.deleted:
                self._remove(source)
            else:
                self._saved(source)


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
                raise StreamConflict("a new producer starts at Producer-Seq 0",
                                     _gap_headers(0, seq))
            raise BadRequest("a new Producer-Epoch starts at Producer-Seq 0")
        return Producer(epoch, 0)
    if epoch < known.epoch:
        raise StaleEpoch(known.epoch)
    if seq <= known.last_seq:
        return None
    if seq != known.last_seq + 1:
        raise StreamConflict(f"Producer-Seq {seq} skips ahead of {known.last_seq + 1}",
                             _gap_headers(known.last_seq + 1, seq))
    return Producer(epoch, seq)


def _gap_headers(expected: int, received: int) -> tuple[tuple[bytes, bytes], ...]:
    return ((b"Producer-Expected-Seq", b"%d" % expected),
            (b"Producer-Received-Seq", b"%d" % received))


def _closed_headers(stream: Stream) -> tuple[tuple[bytes, bytes], ...]:
    return ((b"Stream-Closed", b"true"), (b"Stream-Next-Offset", stream.tail.offset.encode()))
