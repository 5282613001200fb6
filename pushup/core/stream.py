"""One Durable Stream: its appends, the reads of them a fork stitches from its
sources, the positions it issued, and the readers waiting for it to change.

A ``Stream`` is the core's (:mod:`pushup.core.streams` holds every one and
decides what a request does to it); other modules call its named methods,
never write its fields: a reader waits (``wait``, ``stop_waiting``), a store
shared with other nodes takes up what it read (``take_state``, ``add_entry``,
``forget_entries``, ``mark_deleted``, ``renew_deadline``, ``raise_tail``,
``link_source``). It never touches a socket and never reads the clock.
A fork chain is walked by loops, never by recursion.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pushup.core.errors import BadRequest, OffsetGone
from pushup.core.stream_values import (
    JSON_TYPE,
    START,
    Entry,
    Position,
    Producer,
    Read,
    make_entry,
    media_type,
    parse_offset,
)

# The most forks a chain may have below its root stream: a fork of a stream this
# deep is refused 400 ``fork_too_deep`` (docs/api.md, "Fork chains"). One rule for
# every node and engine; a read stitches every level (on Redis, read level by level).
MAX_FORK_DEPTH = 64

# What a fresh read of a stream replaces of the one a cache holds (``take_state``):
# everything but what identifies it (path, uid), its appends and its source link.
_STATE = ("content_type", "ttl", "expires_at", "deadline", "closed", "closed_by",
          "forked_at", "fork_request", "tail", "forks", "deleted", "producers",
          "writer_seq", "charged", "retention_age", "retention_bytes", "earliest",
          "marks")

# Age retention keeps, instead of each append's time, marks of (time, tail): all
# before the tail was appended by then, one mark per 1/MARKS_PER_AGE of the age.
# An append goes once between the age and (1 + 1/MARKS_PER_AGE) of it old, and a
# stream keeps at most MARKS_PER_AGE + 1 marks.
MARKS_PER_AGE = 16


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
    # retention (docs/api.md, "Retention"): what is kept of the appends, and the
    # earliest position kept (an offset before it is 410); marks: (µs, tail appends, size)
    retention_age: int | None = None
    retention_bytes: int | None = None
    earliest: Position = START
    marks: list[tuple[int, int, int]] = field(default_factory=list)
    dropped: int = 0  # appends this object let go of below ``earliest`` (a cache's count)
    # the readers waiting for a change: through wait, stop_waiting and wake only
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
        if at.size < self.earliest.size:
            at = self.earliest
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
        if at.size < self.earliest.size:
            raise OffsetGone(f"offset {offset[:80]!r} is before the earliest this stream's "
                             f"retention keeps ({self.earliest.offset}): read from there, "
                             "or from -1", self.earliest.offset)
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
        if at == stream.tail or at == stream.forked_at or at == stream.earliest:
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

    # -- retention ---------------------------------------------------------------

    @property
    def retains(self) -> bool:
        """Whether this stream lets its oldest appends go (it has a retention)."""
        return self.retention_age is not None or self.retention_bytes is not None

    def mark(self, now: int) -> None:
        """An append was just made at ``now``: the tail is marked as all
        appended by ``now``, in one mark per share of the age
        (``MARKS_PER_AGE``), so an append is marked at most a share late."""
        if self.retention_age is None:
            return
        share = max(1, self.retention_age * 1_000_000 // MARKS_PER_AGE)
        mark = (now, self.tail.appends, self.tail.size)
        if self.marks and self.marks[-1][0] // share == now // share:
            self.marks[-1] = mark
        else:
            self.marks.append(mark)

    def trim(self, now: int) -> list[Entry]:
        """Let go of the appends the retention no longer keeps, the newest
        always kept; ``earliest`` moves to the first kept (never back, so an
        offset is never served again once gone). The appends let go of."""
        if not self.retains or self.source is not None or self.forks or not self.entries:
            return []  # a fork reads its source below its fork point: both keep all
        cut = 0
        if self.retention_age is not None:
            horizon = now - self.retention_age * 1_000_000
            old = [m for m in self.marks if m[0] <= horizon]
            if old:  # every append before the newest old mark's tail is older than the age
                cut = bisect_left(self.begins, old[-1][2])
                self.marks = self.marks[len(old) - 1:]
        if self.retention_bytes is not None:
            kept = self.tail.size - self.begins[cut] if cut < len(self.entries) else 0
            while cut < len(self.entries) - 1 and kept > self.retention_bytes:
                kept -= len(self.entries[cut].data)
                cut += 1
        cut = min(cut, len(self.entries) - 1)  # the newest append stays
        if cut <= 0:
            return []
        gone = self.entries[:cut]
        del self.entries[:cut], self.begins[:cut]
        self.dropped += cut
        self.earliest = self.entries[0].begins
        return gone

    def next_entry(self, at: Position) -> Entry | None:
        return next(self._segments(at), None)

    def append(self, body: bytes, messages: list[bytes] | None) -> Position:
        entry = make_entry(self.tail, body, messages)
        self.entries.append(entry)
        self.begins.append(entry.begins.size)
        self.tail = entry.ends
        return self.tail

    # -- the readers waiting for a change ------------------------------------

    def wait(self, woken: Callable[[], None]) -> None:
        """Call ``woken`` once, at the stream's next change (it grew, closed,
        went, or the node drains)."""
        self.waiters.append(woken)

    def stop_waiting(self, woken: Callable[[], None]) -> None:
        """``woken`` waits no more (a reader left); nothing if it did not."""
        if woken in self.waiters:
            self.waiters.remove(woken)

    @property
    def waited_on(self) -> bool:
        """Whether a reader waits for this stream to change."""
        return bool(self.waiters)

    def wake(self) -> None:
        """Every waiting reader, called once (each waits again if it will)."""
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()

    def hold_wakes(self) -> list[Callable[[], None]]:
        """The waiting readers, taken away until ``resume_wakes`` (a change
        not yet stored wakes nobody)."""
        held, self.waiters = self.waiters, []
        return held

    def resume_wakes(self, held: list[Callable[[], None]]) -> None:
        """``held`` (``hold_wakes``'s) wait again, before those that came since."""
        self.waiters = held + self.waiters

    # -- taking up what a store shared with other nodes holds -----------------

    def take_state(self, fresh: Stream) -> None:
        """``fresh``'s state (a newer version read of this stream), its
        appends and source link kept (readers hold this object)."""
        for name in _STATE:
            setattr(self, name, getattr(fresh, name))
        self.marks = list(fresh.marks)
        self._let_go_below_earliest()

    def _let_go_below_earliest(self) -> None:
        """The appends held below ``earliest`` (another node's retention let
        them go) are let go of here too."""
        cut = bisect_left(self.begins, self.earliest.size)
        if cut:
            del self.entries[:cut], self.begins[:cut]
            self.dropped += cut

    def add_entry(self, entry: Entry) -> None:
        """An append as kept, after the last held (a log read back); one
        below ``earliest`` is counted as let go of, not held."""
        if entry.begins.size < self.earliest.size:
            self.dropped += 1
            return
        self.entries.append(entry)
        self.begins.append(entry.begins.size)

    def forget_entries(self) -> None:
        """Its appends dropped (to be read whole again); its state kept."""
        del self.entries[:], self.begins[:]
        self.dropped = 0

    def mark_deleted(self) -> None:
        """The stream is deleted (by another node, or gone from the store)."""
        self.deleted = True

    def renew_deadline(self, deadline: int) -> None:
        """A sliding TTL renewed elsewhere up to ``deadline`` (never earlier)."""
        if self.deadline is not None:
            self.deadline = max(self.deadline, deadline)

    def raise_tail(self, floor: Position) -> None:
        """Its next append starts past ``floor`` as well as past its tail
        (offsets served of a log the store lost are never issued again)."""
        tail = self.tail
        self.tail = Position(max(floor.appends, tail.appends), max(floor.size, tail.size))

    def link_source(self, source: Stream | None) -> None:
        """A fork's source, as read (None: not held)."""
        self.source = source
