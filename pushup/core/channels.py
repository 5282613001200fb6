"""Channel lifecycle: which channels exist, how long they live, and the TTL rule.

A channel lives ``ttl`` after its creation, its last publish or its last
renewal; a lazy heap of deadlines tells the store's sweep which to look at.
``Channels`` is owned by the store (:mod:`pushup.core.store`), which keeps
the messages a channel holds; a channel operation another node made travels
as a ``ChannelOp`` value. No socket, no clock: every time is an argument.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from pushup.core.changes import NO_CHANGES, Changes
from pushup.core.cursor import Cursor
from pushup.core.errors import BadRequest, ChannelExists, NoSuchChannel
from pushup.core.model import Message, check_channel_name
from pushup.core.origins import Position
from pushup.core.runs import Run, oldest_head

MAX_TTL = 366 * 86400 * 1_000_000
# Stale entries the expiry heap may keep past its live ones before it is
# rebuilt (a rebuild costs one pass over the live channels).
STALE_SLACK = 64
# The one ttl rule, as a client is told it (a ttl travels in seconds).
TTL_RULE = f"ttl must be a number of seconds, more than 0, at most {MAX_TTL // 1_000_000}"


def check_ttl(ttl: int | None, default: int) -> int:
    """A channel's ttl (µs): ``default`` when none is given; 400 when out of range."""
    if ttl is None:
        return default
    if not 0 < ttl <= MAX_TTL:
        raise BadRequest(TTL_RULE)
    return ttl


def ttl_in_seconds(seconds: object) -> int:
    """A ttl as a client gives it (a JSON number of seconds), in µs, checked by
    the one rule (:func:`check_ttl`)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not -1 < seconds < MAX_TTL:  # also NaN and ±inf
        raise BadRequest(TTL_RULE)
    return check_ttl(round(seconds * 1_000_000), 0)


OpKind = Literal["create", "renew", "delete"]


@dataclass(frozen=True, slots=True)
class ChannelOp:
    """An explicit channel's creation, renewal or deletion, as the cluster sees it.

    ``at_seq`` orders it among its origin's messages: the origin's sequence
    number when it happened (it applies after that message, before the next).
    """

    kind: OpKind
    name: str
    at_seq: int = 0
    ttl: int = 0  # µs (create, renew)
    expires_at: int = 0  # µs since the epoch (create, renew)

    @classmethod
    def of(cls, kind: OpKind, channel: Channel, at_seq: int) -> ChannelOp:
        """The operation that leaves another node's copy of ``channel`` as it is here."""
        return cls(kind, channel.name, at_seq, channel.ttl, channel.expires_at)


class Channel:
    """One channel's runs, lifetime and eviction record.

    Owned by the store: other modules read its fields and never write them
    (a channel built outside a store is a detached description, e.g. the
    answer to a create that another node will apply)."""

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
        return oldest_head(self.runs.values())

    def holds(self, m: Message) -> bool:
        run = self.runs.get(m.origin)
        if run is None:
            return False
        i = run.bisect_key_left(m.seq)
        return i < len(run) and run[i] is m

    def drop(self, m: Message) -> None:
        """Take ``m`` out (the store evicts it), recording the gap it leaves."""
        run = self.runs[m.origin]
        run.remove(m)
        if not run:
            del self.runs[m.origin]
        self.count -= 1
        if m.seq > self.evicted.get(m.origin, 0):
            self.evicted[m.origin] = m.seq
        self.evicted_ts = max(self.evicted_ts, m.ts)

    def has_gap(self, since: Cursor | int, position: Position | None = None) -> bool:
        if isinstance(since, Cursor):
            at = since.position if position is None else position
            return any(seq > at(o) for o, seq in self.evicted.items())
        return self.evicted_ts > since


class Channels:
    """A store's channels by name, with their expiry heap.

    Every change of a channel's existence or lifetime is noted in
    ``changes`` (the store's journal; a no-op unless one is installed).
    ``prefix`` makes the names of channels created without one unique to
    this node (its origin's name).
    """

    def __init__(self, default_ttl: int, prefix: str) -> None:
        self.default_ttl = default_ttl
        self.prefix = prefix
        self.changes: Changes = NO_CHANGES
        self._by_name: dict[str, Channel] = {}
        self._deadlines: list[tuple[int, str]] = []  # lazy: stale entries are skipped
        self._generated = 0

    # -- reading -----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def find(self, name: str) -> Channel | None:
        return self._by_name.get(name)

    def get(self, name: str) -> Channel:
        """The channel named ``name``; 404 (``NoSuchChannel``) if there is none."""
        channel = self._by_name.get(name)
        if channel is None:
            raise NoSuchChannel(f"no channel named {name!r}")
        return channel

    def names(self) -> list[str]:
        return list(self._by_name)

    def values(self) -> Iterable[Channel]:
        return self._by_name.values()

    def next_deadline(self) -> int | None:
        return self._deadlines[0][0] if self._deadlines else None

    @property
    def scheduled(self) -> int:
        """Entries in the expiry heap, stale ones included (at most twice the
        channels, plus ``STALE_SLACK``)."""
        return len(self._deadlines)

    # -- lifecycle ---------------------------------------------------------

    def ensure(self, name: str, now: int, ttl: int | None = None) -> Channel:
        """The channel ``name``, created now (with ``ttl`` or the default) if missing."""
        channel = self._by_name.get(name)
        if channel is None:
            channel = Channel(name, self.default_ttl if ttl is None else ttl, now)
            self._by_name[name] = channel
            self._schedule(channel)
            self.changes.channel(name)
        return channel

    def touch(self, names: Iterable[str], now: int) -> bool:
        """Create the channels a subscriber names, if they do not exist; whether any was."""
        created = False
        for name in names:
            if name not in self._by_name:
                self.ensure(name, now)
                created = True
        return created

    def create(self, name: str | None, ttl: int | None, now: int) -> Channel:
        """An explicit channel: 400 for a bad name or ttl, 409 if it exists."""
        name = self.new_name(name)
        return self.ensure(name, now, check_ttl(ttl, self.default_ttl))

    def new_name(self, name: str | None) -> str:
        """The name a channel created now gets: ``name`` if valid and free (409
        otherwise), or a fresh one this node makes up."""
        if name is None:
            while name is None or name in self._by_name:
                self._generated += 1
                name = f"_{self.prefix}.{self._generated}"
        check_channel_name(name)
        if name in self._by_name:
            raise ChannelExists(f"channel {name!r} exists")
        return name

    def renew(self, name: str, ttl: int | None, now: int) -> Channel:
        """Live ``ttl`` (or its own ttl) from now; 404 if there is no such channel."""
        channel = self.get(name)
        ttl = check_ttl(ttl, channel.ttl)
        self.set_lifetime(channel, ttl, now + ttl)
        return channel

    def settle(self, op: ChannelOp, now: int) -> Channel:
        """Another node created or renewed ``op.name``: the channel as it left it."""
        channel = self._by_name.get(op.name)
        if channel is None:
            channel = self.create(op.name, op.ttl, now)
        self.set_lifetime(channel, op.ttl, op.expires_at)
        return channel

    def set_lifetime(self, channel: Channel, ttl: int, expires_at: int) -> None:
        """The channel's ttl and expiry change: noted, and swept in time."""
        channel.ttl = ttl
        channel.expires_at = expires_at
        self.changes.channel(channel.name)
        if channel.expires_at < channel.queued_at:
            self._schedule(channel)

    def adopt(self, channel: Channel) -> None:
        """Take a channel read back (data directory, peer snapshot) as it is."""
        self._by_name[channel.name] = channel
        self._schedule(channel)

    def remove(self, name: str) -> Channel:
        """Drop ``name`` (404 if there is none); the caller lets go of its messages.
        Its expiry entry goes stale; once stale entries outnumber the live ones
        (and ``STALE_SLACK``), the heap is rebuilt from the live ones: a channel
        gone early (deleted, or let go with its Redis partition) holds nothing
        until its deadline."""
        channel = self.get(name)
        del self._by_name[name]
        self.changes.channel(name)
        if len(self._deadlines) > 2 * len(self._by_name) + STALE_SLACK:
            live = [(c.queued_at, c.name) for c in self._by_name.values()]
            heapq.heapify(live)
            self._deadlines = live
        return channel

    def expired(self, now: int, busy: Callable[[str], bool]) -> Iterator[str]:
        """The channels due to go at ``now``, one at a time (the caller removes
        each before asking for the next). One that is ``busy`` lives one more
        ttl instead."""
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, name = heapq.heappop(self._deadlines)
            channel = self._by_name.get(name)
            if channel is None or channel.queued_at != deadline:
                continue  # deleted, or a stale entry
            if channel.expires_at <= now and busy(name):
                channel.expires_at = now + channel.ttl
                self.changes.channel(name)
            if channel.expires_at > now:
                self._schedule(channel)
                continue
            yield name

    def _schedule(self, channel: Channel) -> None:
        channel.queued_at = channel.expires_at
        heapq.heappush(self._deadlines, (channel.expires_at, channel.name))
