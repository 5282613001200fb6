"""The message cache: channels, their messages in order, retention and gaps.

Each channel keeps one run per origin (a ``Run``, in sequence order; an
origin's timestamps strictly increase with its sequence, so a run is also in
timestamp order). A query merges the runs of its channels by ``(timestamp,
id)``, returns each message once, and computes the cursor that comes after
it. Retention (message ttl, the total-bytes cap) evicts the oldest by
``(timestamp, id)`` first: the oldest of the heads of each origin's run, as
there are few origins (one per node and restart) and many messages, so a
message stored costs no global sorted index.

Which origins a returned cursor names, and which history went with a
restart, is :mod:`pushup.core.origins`; which of them a reader of some
channels sees, :mod:`pushup.core.views`; which channels exist and how long
they live, :mod:`pushup.core.channels`. The store owns all of this state:
other modules call its methods and never write its fields.

This module never touches a socket and never reads the clock: every method
that depends on time takes ``now`` (integer microseconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from heapq import merge as merge_sorted
from operator import attrgetter

from pushup.core.changes import NO_CHANGES, Changes
from pushup.core.channels import Channel as Channel  # re-exported: the store's channels
from pushup.core.channels import ChannelOp, Channels
from pushup.core.cursor import Cursor
from pushup.core.idempotency import DEFAULT_WINDOW, Idem, Keys, Remembered, record_of
from pushup.core.image import ChannelImage, StoreImage, channel_of
from pushup.core.model import Draft, Message, Origin, Query
from pushup.core.model import Result as Result  # re-exported: the store's answers
from pushup.core.origins import Origins
from pushup.core.runs import OldestHeads, Run
from pushup.core.views import Sources, Views

_by_time = attrgetter("sort_key")


@dataclass(frozen=True, slots=True)
class Retention:
    """How long and how much the store keeps (times in microseconds)."""

    message_ttl: int
    channel_ttl: int
    max_per_channel: int
    max_bytes: int
    key_window: int = round(DEFAULT_WINDOW * 1e6)  # how long an Idempotency-Key is kept


class Store:
    """Channels and cached messages of every origin, with retention.

    Local publishes get their ids from this node's origin; messages of other
    origins are applied with :meth:`apply`, strictly in sequence order per
    origin, so the horizon (the highest contiguous sequence per origin) is
    what a cursor may safely claim. ``Service.follow`` is the one caller
    that moves another origin's horizon (:meth:`apply`, :meth:`know`,
    :meth:`skip_to`, :meth:`pass_over`).

    The store owns its state: other modules read it through the named reads
    below and change it only through its methods. Every change is noted in
    its journal (``Changes``; ``NO_CHANGES`` until :meth:`journal_to`
    installs one).
    """

    def __init__(self, retention: Retention, origin: Origin) -> None:
        self.retention = retention
        self._origin = origin
        self._channels = Channels(retention.channel_ttl, origin.name)
        self._bytes = 0
        self._by_origin: dict[str, Run] = {}  # origin -> its cached messages (none empty)
        self._heads = OldestHeads(self._by_origin)  # what retention takes first
        self._holders: dict[str, int] = {}  # message id -> channels holding it
        self._changes: Changes = NO_CHANGES
        # Keyed publishes of every origin, for their window (pushup.core.idempotency).
        self.keys = Keys(retention.key_window)
        # How far it holds each origin, which a cursor may name, and what was
        # lost: everywhere, or with a restart. Read through the named reads
        # below; moved only by this module (Service.follow asks it to).
        self._origins = Origins(lambda o: bool(self._by_origin.get(o)))
        self._origins.raise_horizon(origin.name, 0)
        self._horizon = self._origins.horizon
        # What a reader of some channels sees of them (the scoped origins').
        self._views = Views(self._origins, self._channels)

    def sources_by(self, sources: Sources) -> None:
        """How to tell which scoped origins a channel's messages come from (by
        their node id: a Redis partition's tag), so that history lost of one
        is a gap for its readers only."""
        self._views.sources_by(sources)

    def journal_to(self, changes: Changes) -> None:
        """Note every change from now on in ``changes`` (``NO_CHANGES``: none)."""
        self._changes = self._channels.changes = self._origins.changes = changes

    # -- reading -----------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self._origin.node_id

    @property
    def origin_name(self) -> str:
        """This node's origin: ``<node_id>.<epoch>``."""
        return self._origin.name

    @property
    def own_seq(self) -> int:
        """The last sequence number this node's origin handed out."""
        return self._origin.seq

    @property
    def last_ts(self) -> int:
        """The last timestamp this node's origin handed out (µs)."""
        return self._origin.last_ts

    @property
    def message_count(self) -> int:
        return len(self._holders)

    @property
    def bytes(self) -> int:
        """Bytes of message JSON cached."""
        return self._bytes

    @property
    def channel_count(self) -> int:
        return len(self._channels)

    @property
    def expiry_entries(self) -> int:
        """Entries in the channels' expiry index, stale ones included."""
        return self._channels.scheduled

    def horizon_of(self, origin: str) -> int:
        """How far (seq) this store holds ``origin`` without a hole; 0 if unknown."""
        return self._origins.horizon_of(origin)

    def horizons(self) -> dict[str, int]:
        """Every origin's horizon: a copy, in the order the store met them."""
        return self._origins.horizons()

    def lost_of(self, origin: str) -> tuple[int, int] | None:
        """The last (seq, ts) of ``origin``'s history lost everywhere, if any."""
        return self._origins.lost_of(origin)

    def losses(self) -> dict[str, tuple[int, int]]:
        """Every origin's history lost everywhere: a copy."""
        return dict(self._origins.lost)

    def channel(self, name: str) -> Channel | None:
        return self._channels.find(name)

    def channel_names(self) -> list[str]:
        return self._channels.names()

    def get(self, name: str) -> Channel:
        """The channel ``name``; ``NoSuchChannel`` (404) if there is none."""
        return self._channels.get(name)

    def next_deadline(self) -> int | None:
        """When :meth:`expire` next has something to do (µs), if ever."""
        channels = self._channels.next_deadline()
        times = [] if channels is None else [channels]
        oldest = self._oldest()
        if oldest is not None:
            times.append(oldest.ts + self.retention.message_ttl)
        return min(times) if times else None

    def query(self, q: Query) -> Result:
        """Messages after ``q.since`` on ``q.channels``, at most ``q.limit`` (and
        at most ``q.max_bytes`` of message JSON, but always one if any).

        The cursor returned claims, per origin, everything up to the first
        matching message not returned (cut by ``limit`` or ``until``), or the
        whole horizon when none is left; it never moves a position back.
        """
        since = q.since
        if isinstance(since, Cursor) and self.at_end(since, q.channels):
            return Result((), since, False)
        return self._views.read(q)

    def at_end(self, since: Cursor, channels: Iterable[str] = ()) -> bool:
        """Whether ``since`` is exactly this store's end for ``channels``, with
        nothing retired or lost behind it: then a query from it has no message
        and no gap, and its cursor is ``since`` itself (a re-poll that will be
        held; issue 18). Which origins are in view is :mod:`pushup.core.views`."""
        return self._views.at_end(since, channels)

    def end(self, channels: Iterable[str] | None = None) -> Cursor:
        """A cursor past everything this node holds or has skipped, every origin
        (for ``channels``: less the scoped origins that hold nothing of them)."""
        return self._views.end(channels)

    def messages_of(self, origin: str, after: int, most: int) -> list[Message]:
        """Up to ``most`` cached messages of ``origin`` with seq > ``after``."""
        run = self._by_origin.get(origin)
        if run is None:
            return []
        start = run.bisect_key_right(after)
        return list(run.islice(start, start + most))

    # -- writing -----------------------------------------------------------

    def publish(self, drafts: Iterable[Draft], now: int, idem: Idem | None = None,
                ) -> list[Message]:
        """Accept validated drafts from a publisher, in order; returns the
        messages. With ``idem``, the publish is remembered under its key (the
        caller checked that the key is not remembered yet)."""
        messages = []
        for draft in drafts:
            seq, ts = self._origin.next(now)
            m = Message(self._origin.name, seq, ts, draft.channels, draft.data)
            self._insert(m, now)
            messages.append(m)
        if idem is not None and messages:
            self.remember(record_of(idem, messages), now)
        return messages

    def remember(self, record: Remembered, now: int) -> None:
        """Keep a keyed publish's record (ours, a peer's or read back from disk)."""
        if self.keys.remember(record, now):
            self._changes.key(record)

    def know(self, origin: str, scoped: bool = False) -> None:
        """``origin`` is heard of (even with nothing of it held yet): its node's
        older origins are superseded, and a cursor naming one we do not hold
        is told of the gap at once (:mod:`pushup.core.origins`). A ``scoped``
        origin is named by a cursor only for the channels that hold its
        messages (a Redis partition: a channel lives in one of many)."""
        if origin not in self._horizon:
            self._origins.raise_horizon(origin, 0)
        if scoped:
            self._origins.scope(origin)

    def skip_to(self, origin: str, seq: int, ts: int) -> None:
        """``origin``'s history up to ``seq`` (last stamped ``ts``) is gone
        everywhere: the horizon moves past it, readers behind it get a gap."""
        self._origins.skip_to(origin, seq, ts)

    def pass_over(self, origin: str, seq: int) -> None:
        """Entry ``seq`` of ``origin`` carries no message (ValueError if not the next)."""
        self._origins.pass_over(origin, seq)

    def pass_to(self, origin: str, seq: int) -> None:
        """``origin``'s entries up to ``seq`` carry nothing for the channels this
        node follows there: the horizon moves up to it, no gap (``Quiet``)."""
        self._origins.raise_horizon(origin, seq)

    def backfill(self, origin: str, messages: Iterable[Message], channels: tuple[str, ...],
                 now: int) -> int:
        """Messages of ``origin`` at or behind its horizon, read for
        ``channels`` only (a channel newly followed in a partition this node
        follows already): each joins those of its channels in ``channels``
        that do not hold it yet, in sequence order; one held already by
        another channel is the same message (one copy, one more holder). One
        past the message ttl is let go as ``apply`` lets it go. Returns how
        many a channel did not hold (0: nothing was missing)."""
        wanted = set(channels)
        added = 0
        for m in messages:
            names = tuple(n for n in m.channels if n in wanted)
            if not names or m.seq > self._horizon.get(origin, 0):
                continue
            held = self._held_copy(m)
            if held is None:
                self._insert(m, now, into=names)
                added += len(names)
                if m.ts <= now - self.retention.message_ttl:
                    self._evict(m)
            else:
                added += self._join(held, names, now)
        return added

    def _held_copy(self, m: Message) -> Message | None:
        """The store's own copy of ``m`` (the same id), if it holds one."""
        if m.id not in self._holders:
            return None
        mine = self._by_origin[m.origin]
        i = mine.bisect_key_left(m.seq)
        if i < len(mine) and mine[i].seq == m.seq:
            return mine[i]
        return None

    def _join(self, held: Message, names: tuple[str, ...], now: int) -> int:
        """``held`` joins those of ``names`` that do not hold it; how many did not."""
        added = 0
        for name in names:
            channel = self._channels.ensure(name, now)
            if channel.holds(held):
                continue
            run = channel.runs.get(held.origin)
            if run is None:
                run = channel.runs[held.origin] = Run()
            run.add(held)
            channel.count += 1
            added += 1
            self._holders[held.id] += 1
            self._changes.message(held, (name,))
        return added

    def mark_gap(self, name: str, origin: str, seq: int, ts: int, now: int) -> None:
        """Channel ``name``'s history in ``origin`` up to ``seq`` (stamped
        ``ts``) may lack messages this node never read (trimmed, or its
        notifications lost): its readers behind ``seq`` are told of a gap."""
        channel = self._channels.ensure(name, now)
        if seq > channel.evicted.get(origin, 0):
            channel.evicted[origin] = seq
            channel.evicted_ts = max(channel.evicted_ts, ts)
            self._changes.channel(name)

    def drop_channels(self, channels: Iterable[str]) -> None:
        """Stop holding ``channels`` while the store keeps following the
        origins they live in: each channel goes with its messages (one that
        another channel holds stays, with one holder less); no eviction is
        recorded (nothing was lost)."""
        for name in channels:
            channel = self._channels.find(name)
            if channel is None:
                continue
            self._channels.remove(name)
            for run in channel.runs.values():
                for m in list(run):
                    self._release(m)

    def let_go(self, origin: str, channels: Iterable[str]) -> None:
        """Stop holding ``origin`` and ``channels`` (``Service.unfollow``): the
        channels go with their messages, every other message of ``origin``
        leaves the channels holding it, and the origin leaves the horizon; no
        eviction is recorded (nothing was lost)."""
        for name in channels:
            if name in self._channels:
                channel = self._channels.remove(name)
                for run in channel.runs.values():
                    for m in list(run):
                        self._release(m)
        mine = self._by_origin.get(origin)
        for m in list(mine) if mine is not None else ():
            for name in m.channels:
                holder = self._channels.find(name)
                if holder is not None and holder.holds(m):
                    run = holder.runs[origin]
                    run.remove(m)
                    if not run:
                        del holder.runs[origin]
                    holder.count -= 1
            self._forget(m)
        self._origins.forget(origin)

    def apply(self, m: Message, now: int) -> bool:
        """Apply another origin's message; False if already applied.

        A message already past this node's message ttl (a log read late: a
        cold read, a peer's catch-up) moves the horizon and is let go at
        once, as retention would have: never served, and a gap for the
        readers behind it.

        Raises ValueError if it is not the next in its origin's sequence: the
        caller must fetch what is missing first, so the horizon has no holes.
        """
        have = self._horizon.get(m.origin, 0)
        if m.seq <= have:
            return False
        if m.seq != have + 1:
            raise ValueError(f"{m.origin}: expected seq {have + 1}, got {m.seq}")
        self._insert(m, now)
        if m.ts <= now - self.retention.message_ttl:
            self._evict(m)
        return True

    def holders_of(self, m: Message) -> list[str]:
        """The channels that hold ``m`` now (empty once it is gone)."""
        if m.id not in self._holders:
            return []
        return [n for n in m.channels
                if (c := self._channels.find(n)) is not None and c.holds(m)]

    def all_messages(self) -> list[Message]:
        return list(merge_sorted(*self._by_origin.values(), key=_by_time))

    def image(self) -> StoreImage:
        """Everything this store holds, as one value (for a peer's snapshot)."""
        return StoreImage(
            horizon=tuple(self._horizon.items()),
            lost=tuple((o, seq, ts) for o, (seq, ts) in self._origins.lost.items()),
            channels=tuple(ChannelImage(c.name, c.ttl, c.expires_at, tuple(c.evicted.items()),
                                        c.evicted_ts) for c in self._channels.values()),
            messages=tuple((m, tuple(self.holders_of(m))) for m in self.all_messages()),
            keys=tuple(self.keys.records()),
            last_ts=self.last_ts)

    def load(self, image: StoreImage, now: int) -> int:
        """Fill this empty store from ``image`` (channel times kept, a channel
        a message names but the image lacks is created, this node's own
        origin is left as it is); returns the number of messages read.
        Retention is not applied: the caller expires what is due now."""
        for c in image.channels:
            self._channels.adopt(channel_of(c, now))
        for m, held in image.messages:
            names = tuple(n for n in held if n in m.channels)
            if names and m.id not in self._holders:
                self._insert(m, now, renew=False, into=names)
        self._origins.restore(image.horizon, image.lost, keep=self._origin.name)
        for record in image.keys:
            self.remember(record, now)
        self._origin.resume(image.last_ts)
        return len(image.messages)

    # -- channels ------------------------------------------------------------

    def touch(self, names: Iterable[str], now: int) -> bool:
        """Create the channels a subscriber names, if they do not exist.

        Returns whether any was created: the caller must then make sure
        :meth:`expire` runs by :meth:`next_deadline`.
        """
        return self._channels.touch(names, now)

    def create(self, name: str | None, ttl: int | None, now: int) -> Channel:
        """An explicit channel (a fresh name if None): 400, or 409 if it exists."""
        return self._channels.create(name, ttl, now)

    def new_name(self, name: str | None) -> str:
        """The name :meth:`create` would give (see ``Channels.new_name``)."""
        return self._channels.new_name(name)

    def renew(self, name: str, ttl: int | None, now: int) -> Channel:
        return self._channels.renew(name, ttl, now)

    def apply_op(self, op: ChannelOp, now: int) -> Channel | None:
        """Another node's channel operation: the channel as that node left it
        (None once deleted). A delete of a channel we lack does nothing."""
        if op.kind == "delete":
            if op.name in self._channels:
                self.delete(op.name)
            return None
        return self._channels.settle(op, now)

    def delete(self, name: str) -> None:
        """Drop the channel (404 if there is none) and let go of its messages."""
        channel = self._channels.remove(name)
        for run in channel.runs.values():
            for m in run:
                self._release(m)

    def expire(self, now: int, busy: Callable[[str], bool]) -> list[str]:
        """Drop expired messages and channels; returns the channels removed.

        A channel expires ``ttl`` after its last publish (or creation or
        renewal) unless ``busy(name)``: then it is looked at again one ttl on.
        """
        cutoff = now - self.retention.message_ttl
        while (oldest := self._oldest()) is not None and oldest.ts <= cutoff:
            self._evict(oldest)
        removed = []
        for name in self._channels.expired(now, busy):
            self.delete(name)
            removed.append(name)
        return removed

    # -- internals ---------------------------------------------------------

    def _oldest(self) -> Message | None:
        """The message retention takes first: the oldest of the origins' heads."""
        return self._heads.oldest()

    def _insert(self, m: Message, now: int, renew: bool = True,
                into: tuple[str, ...] | None = None) -> None:
        names = m.channels if into is None else into
        self._changes.message(m, names)
        if m.seq > self._horizon.get(m.origin, 0):
            self._origins.raise_horizon(m.origin, m.seq)
        if self._origins.retired:
            self._origins.retired.discard(m.origin)  # e.g. an old message from a snapshot
        channels = self._channels
        for name in names:
            channel = channels.ensure(name, now)
            run = channel.runs.get(m.origin)
            if run is None:
                run = channel.runs[m.origin] = Run()
            run.add(m)
            channel.count += 1
            if renew:
                channel.expires_at = max(channel.expires_at, now + channel.ttl)
        self._holders[m.id] = len(names)
        mine = self._by_origin.get(m.origin)
        if mine is None:
            mine = self._by_origin[m.origin] = Run()
        mine.add(m)
        if mine[0] is m:
            self._heads.moved(m.origin)
        self._bytes += m.size
        for name in names:
            channel = channels.get(name)
            while channel.count > self.retention.max_per_channel:
                oldest = channel.oldest()
                assert oldest is not None
                self._drop_from(channel, oldest)
                self._release(oldest)
        while self._bytes > self.retention.max_bytes:
            oldest = self._oldest()
            assert oldest is not None
            self._evict(oldest)

    def _evict(self, m: Message) -> None:
        """Remove ``m`` from every channel and the cache, recording the gap."""
        for name in m.channels:
            channel = self._channels.find(name)
            if channel is not None and channel.holds(m):
                self._drop_from(channel, m)
        self._forget(m)

    def _drop_from(self, channel: Channel, m: Message) -> None:
        channel.drop(m)
        self._changes.channel(channel.name)
        self._changes.message(m)

    def _release(self, m: Message) -> None:
        """One channel let go of ``m``; forget it when none holds it."""
        left = self._holders.get(m.id, 0) - 1
        if left > 0:
            self._holders[m.id] = left
            self._changes.message(m)  # fewer channels hold it
        elif m.id in self._holders:
            self._forget(m)

    def _forget(self, m: Message) -> None:
        if self._holders.pop(m.id, None) is not None:
            mine = self._by_origin[m.origin]
            was_head = mine[0] is m
            mine.remove(m)
            self._bytes -= m.size
            self._changes.message(m)
            if not mine:
                del self._by_origin[m.origin]
                if self._origins.superseded(m.origin):
                    self._origins.retired.add(m.origin)
            elif was_head:
                self._heads.moved(m.origin)

