"""The message cache: channels, their messages in order, retention and gaps.

Each channel keeps one run per origin (a ``Run``, in sequence order; an
origin's timestamps strictly increase with its sequence, so a run is also in
timestamp order). A query merges the runs of its
channels by ``(timestamp, id)``, returns each message once, and computes the
cursor that comes after it. A global index ordered by ``(timestamp, id)``
drives retention: message ttl and the total-bytes cap evict oldest first.

Which origins a returned cursor names, and which history went with a
restart, is :mod:`pushup.core.origins`.

This module never touches a socket and never reads the clock: every method
that depends on time takes ``now`` (integer microseconds).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter

from sortedcontainers import SortedKeyList

from pushup.core.changes import Changes
from pushup.core.cursor import Cursor
from pushup.core.errors import BadRequest, ChannelExists, NoSuchChannel
from pushup.core.idempotency import DEFAULT_WINDOW, Idem, Keys, Remembered, record_of
from pushup.core.model import Draft, Message, Now, Origin, Query, check_channel_name
from pushup.core.origins import Origins, Position
from pushup.core.runs import Run

_by_time = attrgetter("sort_key")


@dataclass(frozen=True, slots=True)
class Retention:
    """How long and how much the store keeps (times in microseconds)."""

    message_ttl: int
    channel_ttl: int
    max_per_channel: int
    max_bytes: int
    key_window: int = round(DEFAULT_WINDOW * 1e6)  # how long an Idempotency-Key is kept


@dataclass(frozen=True, slots=True)
class Result:
    """An answer to a Query: messages in order, the next cursor, a gap flag."""

    messages: tuple[Message, ...]
    cursor: Cursor
    gap: bool


class Channel:
    """One channel's runs, lifetime and eviction record (owned by Store)."""

    __slots__ = (
        "count",
        "evicted",
        "evicted_ts",
        "expires_at",
        "name",
        "queued_at",
        "runs",
        "ttl",
    )

    def __init__(self, name: str, ttl: int, now: int) -> None:
        self.name = name
        self.ttl = ttl
        self.expires_at = now + ttl
        self.queued_at = -1  # the deadline this channel has in the expiry heap
        self.runs: dict[str, Run] = {}
        self.count = 0
        # Highest evicted sequence per origin, and highest evicted timestamp:
        # what a client must have read past to have no gap.
        self.evicted: dict[str, int] = {}
        self.evicted_ts = 0

    def oldest(self) -> Message | None:
        heads = [run[0] for run in self.runs.values()]
        return min(heads, key=_by_time) if heads else None

    def has_gap(self, since: Cursor | int, position: Position | None = None) -> bool:
        if isinstance(since, Cursor):
            at = since.position if position is None else position
            return any(seq > at(o) for o, seq in self.evicted.items())
        return self.evicted_ts > since


class Store:
    """Channels and cached messages of every origin, with retention.

    Local publishes get their ids from ``origin``; messages of other origins
    are applied with :meth:`apply`, strictly in sequence order per origin, so
    ``horizon`` (the highest contiguous sequence per origin) is what a cursor
    may safely claim.
    """

    def __init__(self, retention: Retention, origin: Origin) -> None:
        self.retention = retention
        self.origin = origin
        self.channels: dict[str, Channel] = {}
        self.horizon: dict[str, int] = {origin.name: 0}
        self.bytes = 0
        self._by_time = SortedKeyList(key=_by_time)
        self._by_origin: dict[str, Run] = {}  # origin -> its cached messages
        # Per origin, the last (seq, ts) of history this node will never have:
        # evicted everywhere before it could be fetched. Any reader behind it
        # is told of a gap, whatever its channels (we do not know theirs).
        self.lost: dict[str, tuple[int, int]] = {}
        self._holders: dict[str, int] = {}  # message id -> channels holding it
        self._deadlines: list[tuple[int, str]] = []  # lazy channel-expiry heap
        self._generated = 0
        self.changes: Changes | None = None  # set by a journal (pushup.backplane.disk)
        # Keyed publishes of every origin, for their window (pushup.core.idempotency).
        self.keys = Keys(retention.key_window)
        # Which origins a cursor may name, and which were lost with a restart.
        self.origins = Origins(self.horizon, lambda o: bool(self._by_origin.get(o)))
        self.origins.note(origin.name)

    # -- reading -----------------------------------------------------------

    @property
    def message_count(self) -> int:
        return len(self._by_time)

    def next_deadline(self) -> int | None:
        """When :meth:`expire` next has something to do (µs), if ever."""
        times = [self._deadlines[0][0]] if self._deadlines else []
        if self._by_time:
            times.append(self._by_time[0].ts + self.retention.message_ttl)
        return min(times) if times else None

    def get(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            raise NoSuchChannel(f"no channel named {name!r}")
        return channel

    def query(self, q: Query) -> Result:
        """Messages after ``q.since`` on ``q.channels``, at most ``q.limit`` (and
        at most ``q.max_bytes`` of message JSON, but always one if any).

        The cursor returned claims, per origin, everything up to the first
        matching message not returned (cut by ``limit`` or ``until``), or the
        whole horizon when none is left; it never moves a position back.
        """
        since = q.since
        if isinstance(since, Now):
            raise TypeError("resolve since=now with Store.end() first")
        at: Position | None = None
        if isinstance(since, Cursor):
            at = self.origins.reader(since)
            gap = self._behind_lost(since, at) or any(
                self.origins.forgotten(o) for o, _ in since.positions)
        else:
            gap = self._behind_lost(since, at)
        heap: list[_Head] = []
        for name in q.channels:
            channel = self.channels.get(name)
            if channel is None:
                continue
            gap = gap or channel.has_gap(since, at)
            for origin, run in channel.runs.items():
                if at is not None:
                    start = run.bisect_key_right(at(origin))
                else:
                    assert isinstance(since, int)
                    start = _first_after(run, since)
                if start < len(run):
                    stream = run.islice(start)
                    m = next(stream)
                    heap.append((m.ts, m.id, len(heap), m, stream))
        heapq.heapify(heap)

        out: list[Message] = []
        last_id = ""
        room = q.max_bytes
        while heap and len(out) < q.limit:
            ts, ident, k, m, stream = heap[0]
            if q.until is not None and ts > q.until:
                break
            if ident != last_id:  # the same message on another channel: once
                if room is not None:
                    room -= m.size
                    if room < 0 and out:  # at least one message, however large
                        break
                out.append(m)
                last_id = ident
            _advance(heap, k, stream)
        while heap and heap[0][1] == last_id:
            _advance(heap, heap[0][2], heap[0][4])

        # Origins with a message still to come stop just before it.
        pending: dict[str, int] = {}
        for _, _, _, m, _ in heap:
            if m.seq <= pending.get(m.origin, m.seq):
                pending[m.origin] = m.seq
        updates = [(o, pending[o] - 1 if o in pending else h) for o, h in self.horizon.items()]
        base = since if isinstance(since, Cursor) else Cursor(())
        return Result(tuple(out), self.origins.tidy(base.advanced(updates)), gap)

    def end(self) -> Cursor:
        """A cursor past everything this node holds or has skipped, every origin."""
        return self.origins.tidy(Cursor.of(self.horizon))

    def messages_of(self, origin: str, after: int, most: int) -> list[Message]:
        """Up to ``most`` cached messages of ``origin`` with seq > ``after``."""
        run = self._by_origin.get(origin)
        if run is None:
            return []
        start = run.bisect_key_right(after)
        return list(run.islice(start, start + most))

    def _behind_lost(self, since: Cursor | int, at: Position | None) -> bool:
        if at is not None:
            return any(at(o) < seq for o, (seq, _) in self.lost.items())
        assert isinstance(since, int)
        return any(ts > since for _, ts in self.lost.values())

    # -- writing -----------------------------------------------------------

    def publish(self, drafts: Iterable[Draft], now: int, idem: Idem | None = None,
                ) -> list[Message]:
        """Accept validated drafts from a publisher, in order; returns the
        messages. With ``idem``, the publish is remembered under its key (the
        caller checked that the key is not remembered yet)."""
        messages = []
        for draft in drafts:
            seq, ts = self.origin.next(now)
            m = Message(self.origin.name, seq, ts, draft.channels, draft.data)
            self._insert(m, now)
            messages.append(m)
        if idem is not None and messages:
            self.remember(record_of(idem, messages), now)
        return messages

    def remember(self, record: Remembered, now: int) -> None:
        """Keep a keyed publish's record (ours, a peer's or read back from disk)."""
        if self.keys.remember(record, now) and self.changes is not None:
            self.changes.key(record)

    def apply(self, m: Message, now: int) -> bool:
        """Apply another origin's message; False if already applied.

        Raises ValueError if it is not the next in its origin's sequence: the
        caller must fetch what is missing first, so the horizon has no holes.
        """
        have = self.horizon.get(m.origin, 0)
        if m.seq <= have:
            return False
        if m.seq != have + 1:
            raise ValueError(f"{m.origin}: expected seq {have + 1}, got {m.seq}")
        self._insert(m, now)
        return True

    def pass_over(self, origin: str, seq: int) -> None:
        """``seq`` of ``origin`` carries no message (a channel operation took it):
        the horizon moves past it. Like :meth:`apply`, strictly in order."""
        have = self.horizon.get(origin, 0)
        if seq <= have:
            return
        if seq != have + 1:
            raise ValueError(f"{origin}: expected seq {have + 1}, got {seq}")
        self.horizon[origin] = seq

    def skip_to(self, origin: str, seq: int, ts: int) -> None:
        """History of ``origin`` up to ``seq`` is gone everywhere: move past it."""
        if seq > self.horizon.get(origin, 0):
            self.raise_horizon(origin, seq)
            self.lost[origin] = (seq, ts)

    def raise_horizon(self, origin: str, seq: int) -> None:
        """We hold (or will never have) ``origin`` up to ``seq``."""
        if origin not in self.horizon:
            self.horizon[origin] = 0
            self.origins.note(origin)
        if seq > self.horizon[origin]:
            self.horizon[origin] = seq
            if self.changes is not None:
                self.changes.origin(origin)

    def restore(self, m: Message, held: Iterable[str], now: int) -> None:
        """Insert a message read back from disk into the channels that held it
        (channel times kept; a channel missing is created)."""
        names = tuple(n for n in held if n in m.channels)
        if names and m.id not in self._holders:
            self._insert(m, now, renew=False, into=names)

    def holders_of(self, m: Message) -> list[str]:
        """The channels that hold ``m`` now (empty once it is gone)."""
        if m.id not in self._holders:
            return []
        return [n for n in m.channels if (c := self.channels.get(n)) is not None and _holds(c, m)]

    def load(self, m: Message, now: int) -> None:
        """Insert a message copied from a peer's snapshot (channel times kept)."""
        if m.id not in self._holders:
            self._insert(m, now, renew=False)

    def adopt_channel(self, channel: Channel) -> None:
        """Take a channel copied from a peer's snapshot, as it is."""
        self.channels[channel.name] = channel
        self._schedule(channel)

    def all_messages(self) -> list[Message]:
        return list(self._by_time)

    def _insert(self, m: Message, now: int, renew: bool = True,
                into: tuple[str, ...] | None = None) -> None:
        names = m.channels if into is None else into
        changes = self.changes
        if changes is not None:
            changes.message(m)
            changes.channels.update(names)
        if m.seq > self.horizon.get(m.origin, 0):
            self.raise_horizon(m.origin, m.seq)
        if self.origins.retired:
            self.origins.retired.discard(m.origin)  # e.g. an old message from a snapshot
        for name in names:
            channel = self._channel(name, now)
            run = channel.runs.get(m.origin)
            if run is None:
                run = channel.runs[m.origin] = Run()
            run.add(m)
            channel.count += 1
            if renew:
                channel.expires_at = max(channel.expires_at, now + channel.ttl)
        self._holders[m.id] = len(names)
        self._by_time.add(m)
        mine = self._by_origin.get(m.origin)
        if mine is None:
            mine = self._by_origin[m.origin] = Run()
        mine.add(m)
        self.bytes += m.size
        for name in names:
            channel = self.channels[name]
            while channel.count > self.retention.max_per_channel:
                oldest = channel.oldest()
                assert oldest is not None
                self._drop_from(channel, oldest)
                self._release(oldest)
        while self.bytes > self.retention.max_bytes:
            self._evict(self._by_time[0])

    def _channel(self, name: str, now: int, ttl: int | None = None) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(name, self.retention.channel_ttl if ttl is None else ttl, now)
            self.channels[name] = channel
            self._schedule(channel)
            if self.changes is not None:
                self.changes.channel(name)
        return channel

    def touch(self, names: Iterable[str], now: int) -> bool:
        """Create the channels a subscriber names, if they do not exist.

        Returns whether any was created: the caller must then make sure
        :meth:`expire` runs by :meth:`next_deadline`.
        """
        created = False
        for name in names:
            if name not in self.channels:
                self._channel(name, now)
                created = True
        return created

    # -- channel lifecycle -------------------------------------------------

    def create(self, name: str | None, ttl: int | None, now: int) -> Channel:
        name = self.new_name(name)
        return self._channel(name, now, check_ttl(ttl, self.retention.channel_ttl))

    def new_name(self, name: str | None) -> str:
        """The name a channel created now gets: ``name`` if valid and free (409
        otherwise), or a fresh one this node makes up."""
        if name is None:
            while name is None or name in self.channels:
                self._generated += 1
                name = f"_{self.origin.name}.{self._generated}"
        check_channel_name(name)
        if name in self.channels:
            raise ChannelExists(f"channel {name!r} exists")
        return name

    def renew(self, name: str, ttl: int | None, now: int) -> Channel:
        channel = self.get(name)
        channel.ttl = check_ttl(ttl, channel.ttl)
        channel.expires_at = now + channel.ttl
        self.reschedule(channel)
        return channel

    def reschedule(self, channel: Channel) -> None:
        """Its expiry moved: make sure the sweep looks at it in time."""
        if self.changes is not None:
            self.changes.channel(channel.name)
        if channel.expires_at < channel.queued_at:
            self._schedule(channel)

    def delete(self, name: str) -> None:
        channel = self.get(name)
        del self.channels[name]
        if self.changes is not None:
            self.changes.channel(name)
        for run in channel.runs.values():
            for m in run:
                self._release(m)

    def expire(self, now: int, busy: Callable[[str], bool]) -> list[str]:
        """Drop expired messages and channels; returns the channels removed.

        A channel expires ``ttl`` after its last publish (or creation or
        renewal) unless ``busy(name)``: then it is looked at again one ttl on.
        """
        cutoff = now - self.retention.message_ttl
        while self._by_time and self._by_time[0].ts <= cutoff:
            self._evict(self._by_time[0])
        removed = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, name = heapq.heappop(self._deadlines)
            channel = self.channels.get(name)
            if channel is None or channel.queued_at != deadline:
                continue  # deleted, or a stale entry
            if channel.expires_at <= now and busy(name):
                channel.expires_at = now + channel.ttl
                if self.changes is not None:
                    self.changes.channel(name)
            if channel.expires_at > now:
                self._schedule(channel)
                continue
            self.delete(name)
            removed.append(name)
        return removed

    # -- internals ---------------------------------------------------------

    def _schedule(self, channel: Channel) -> None:
        channel.queued_at = channel.expires_at
        heapq.heappush(self._deadlines, (channel.expires_at, channel.name))

    def _evict(self, m: Message) -> None:
        """Remove ``m`` from every channel and the cache, recording the gap."""
        for name in m.channels:
            channel = self.channels.get(name)
            if channel is not None and _holds(channel, m):
                self._drop_from(channel, m)
        self._forget(m)

    def _drop_from(self, channel: Channel, m: Message) -> None:
        run = channel.runs[m.origin]
        run.remove(m)
        if not run:
            del channel.runs[m.origin]
        channel.count -= 1
        if m.seq > channel.evicted.get(m.origin, 0):
            channel.evicted[m.origin] = m.seq
        channel.evicted_ts = max(channel.evicted_ts, m.ts)
        if self.changes is not None:
            self.changes.channel(channel.name)
            self.changes.message(m)

    def _release(self, m: Message) -> None:
        """One channel let go of ``m``; forget it when none holds it."""
        left = self._holders.get(m.id, 0) - 1
        if left > 0:
            self._holders[m.id] = left
            if self.changes is not None:
                self.changes.message(m)  # fewer channels hold it
        elif m.id in self._holders:
            self._forget(m)

    def _forget(self, m: Message) -> None:
        if self._holders.pop(m.id, None) is not None:
            _remove(self._by_time, m)
            mine = self._by_origin[m.origin]
            mine.remove(m)
            self.bytes -= m.size
            if self.changes is not None:
                self.changes.message(m)
            if not mine and self.origins.superseded(m.origin):
                self.origins.retired.add(m.origin)


def _remove(items: SortedKeyList, m: Message) -> None:
    """Remove ``m``; evictions take the oldest, so look at the head first."""
    if items[0] is m:
        del items[0]
    else:
        items.remove(m)


def _holds(channel: Channel, m: Message) -> bool:
    run = channel.runs.get(m.origin)
    if run is None:
        return False
    i = run.bisect_key_left(m.seq)
    return i < len(run) and run[i] is m


_Head = tuple[int, str, int, Message, Iterator[Message]]  # (ts, id, stream no., msg, rest)


def _advance(heap: list[_Head], k: int, stream: Iterator[Message]) -> None:
    nxt = next(stream, None)
    if nxt is None:
        heapq.heappop(heap)
    else:
        heapq.heapreplace(heap, (nxt.ts, nxt.id, k, nxt, stream))


def _first_after(run: Run, ts: int) -> int:
    """Index of the first message in ``run`` with a timestamp after ``ts``."""
    lo, hi = 0, len(run)
    if hi and run[0].ts > ts:
        return 0
    while lo < hi:
        mid = (lo + hi) // 2
        if run[mid].ts <= ts:
            lo = mid + 1
        else:
            hi = mid
    return lo


MAX_TTL = 366 * 86400 * 1_000_000


def check_ttl(ttl: int | None, default: int) -> int:
    if ttl is None:
        return default
    if not 0 < ttl <= MAX_TTL:
        raise BadRequest("ttl must be more than 0 and at most 366 days")
    return ttl
