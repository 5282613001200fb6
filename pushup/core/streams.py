"""Durable Streams (protocol v1), the core's stream service: every stream a
node serves, and what each request to one does: create (or fork), append,
close, read, delete, expire, and the idempotent producers' fencing.

``Streams`` owns the streams and their waiting readers (as ``Service`` owns
``Store`` and ``Hub``): the HTTP layer and the engines call its named methods
and :class:`pushup.core.stream.Stream`'s, never write their fields. It keeps
its streams in memory and tells a ``Journal`` (``--data-dir``, or the Redis
engine that shares them) of each change before it is answered. It never
touches a socket and never reads the clock (``now`` is an argument, in
microseconds); it returns values and raises :mod:`pushup.core.errors`, which
:mod:`pushup.http.streams` renders. Its values are
:mod:`pushup.core.stream_values`'; a stream as kept, :mod:`pushup.core.stream_state`'s.

A fork chain is walked by loops, never by recursion: a chain a journal kept
from before ``MAX_FORK_DEPTH`` bounded new ones may be of any depth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

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
from pushup.core.stream import MAX_FORK_DEPTH, Stream
from pushup.core.stream_budget import PRODUCER_OVERHEAD, append_cost, stream_cost
from pushup.core.stream_values import (
    Append,
    Appended,
    Creation,
    Entry,
    Position,
    Producer,
    expiry_of,
    json_messages,
    media_type,
    parse_offset,
)

# The longest path a stream is created at, in bytes as sent (``/v1/stream/`` and
# percent-escapes included): a 201's Location echoes it, and clients refuse a long
# header line (Node's, the protocol's own client, take 16 KiB of headers in all).
MAX_STREAM_PATH = 1024


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
        self._swept = 0  # when expired streams were last dropped (``sweep_due``)

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

    def keep_with(self, journal: Journal) -> None:
        """Tell ``journal`` of every change from now on (a store shared with
        other nodes, which writes them before the answer)."""
        self.journal = journal

    def charge_afresh(self) -> None:
        """Count against ``budget`` only what is charged from now on: a store
        shared with other nodes holds the bytes, so the budget caps one
        request's writes."""
        self.held = 0

    @contextmanager
    def wakes_held(self, streams: Iterable[Stream]) -> Iterator[None]:
        """Within the block, no reader of ``streams`` is woken: a change is
        not served before a store shared with other nodes took it (the
        store wakes each written stream after)."""
        held = [(stream, stream.hold_wakes()) for stream in streams]
        try:
            yield
        finally:
            for stream, waiters in held:
                stream.resume_wakes(waiters)

    def holds(self, path: str, now: int) -> bool:
        """Whether a stream is at ``path`` here (live, or deleted while its
        forks read it), expired ones not counted."""
        stream = self._streams.get(path)
        return stream is not None and (stream.deadline is None or now < stream.deadline)

    def figures(self, shared: bool) -> dict[str, int]:
        """/stats ``streams``: how many answer at a path, the bytes charged
        against ``budget`` and the producers they keep; ``shared`` (a store
        shared with other nodes holds them, the budget caps one write): how
        many this node has cached only."""
        if shared:
            return {"count": len(self._streams)}
        return {"count": len(self._streams), "bytes": self.held, "budget": self.budget,
                "producers": self.producers}

    def tails(self, now: int) -> dict[str, Position]:
        """Every live stream's tail, by path (a subscription's backfill)."""
        return {path: stream.tail for path, stream in self._streams.items()
                if not stream.deleted and (stream.deadline is None or now < stream.deadline)}

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
        if stream.retention_age is not None and self._let_go(stream, now):
            self._saved(stream)  # its earliest offset moved
        return stream

    def _let_go(self, stream: Stream, now: int) -> bool:
        """What ``stream``'s retention no longer keeps goes (``Stream.trim``)
        and is no longer charged; whether any went."""
        gone = stream.trim(now)
        if gone:
            freed = min(stream.charged, sum(append_cost(e.data, e.messages) for e in gone))
            stream.charged -= freed
            self.held -= freed
        return bool(gone)

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

    def sweep_due(self, now: int) -> None:
        """``sweep``, unless it ran in the last 10 s: an expired stream goes
        within ~10 s of its deadline though nobody asks for it."""
        if now - self._swept > 10_000_000:
            self._swept = now
            self.sweep(now)

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
        for value, what in ((asked.retention_age, "age"), (asked.retention_bytes, "size")):
            if value is not None and value < 1:
                raise BadRequest(f"a retention {what} must be at least 1")
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
        if asked.forked_from is None:
            stream.retention_age, stream.retention_bytes = (asked.retention_age,
                                                            asked.retention_bytes)
        messages = json_messages(asked.body, True) if asked.body and stream.is_json else None
        stored = bool(asked.body) and (messages is None or bool(messages))  # ``[]``: empty
        self._charge(stream, stream_cost(stream)
                     + sum(append_cost(e.data, e.messages) for e in stream.entries)
                     + (append_cost(asked.body, messages) if stored else 0))
        if stored:
            stream.append(asked.body, messages)
            stream.mark(now)
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
            stream.mark(now)
            self._let_go(stream, now)
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
            and asked.closed == stream.closed
            and (asked.retention_age, asked.retention_bytes) == (stream.retention_age,
                                                                 stream.retention_bytes))


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
