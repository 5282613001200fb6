"""What a reader of some channels sees of a store's origins: its view.

A cursor names every origin of the store's horizon, less the *scoped* ones
(a Redis partition's log: a node may follow hundreds, a channel lives in one)
that hold nothing of the reader's channels; and a scoped origin's lost
history is a gap only for the readers it concerns. ``Views`` answers, for a
set of channels, which origins are in view, which losses concern it, and
whether a cursor is exactly the store's end, and reads a query's answer
from the channels' runs. It only reads: the horizon and
losses are :class:`pushup.core.origins.Origins`' and the channels
:class:`pushup.core.channels.Channels`', both owned and moved by the store.
No socket, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from pushup.core.channels import Channels
from pushup.core.cursor import Cursor
from pushup.core.model import Message, Now, Query, Result, parse_origin
from pushup.core.origins import Origins, Position
from pushup.core.runs import merge

Sources = Callable[[str], Iterable[str]]  # channel -> node ids of the scoped origins it reads


class Views:
    """The store's origins as a reader of some channels sees them."""

    def __init__(self, origins: Origins, channels: Channels) -> None:
        self._origins = origins
        self._horizon = origins.horizon
        self._channels = channels
        # channel -> the node ids of the scoped origins its messages come from
        # (the Redis engine's partitions: its own, and where it has messages)
        self._sources: Sources | None = None

    def sources_by(self, sources: Sources) -> None:
        """How to tell which scoped origins a channel's messages come from."""
        self._sources = sources

    def at_end(self, since: Cursor, channels: Iterable[str] = ()) -> bool:
        """Whether ``since`` is exactly the store's end for ``channels``, with
        nothing retired or lost behind it (``Store.at_end``)."""
        horizon = self._horizon
        origins = self._origins
        if origins.retired or len(since.positions) > len(horizon):
            return False
        if origins.scoped:
            return self._at_scoped_end(since, channels)
        for origin, seq in since.positions:
            if horizon.get(origin) != seq:
                return False
        if len(since.positions) != len(horizon):  # an origin at 0 is absent from a cursor
            if sum(1 for seq in horizon.values() if seq > 0) != len(since.positions):
                return False
        if origins.lost:
            held = since.as_dict()
            return not origins.behind_lost(since, lambda o: held.get(o, 0))
        return True

    def concerns(self, channels: Iterable[str],
                 relevant: set[str] | None = None) -> Callable[[str], bool] | None:
        """Which lost origins concern a reader of ``channels``: every unscoped
        one; a scoped one that held their messages or that they come from
        (None: every origin, as none is scoped)."""
        scoped = self._origins.scoped
        if not scoped:
            return None
        names = tuple(channels)
        held = self.relevant(names) if relevant is None else relevant
        sources: set[str] = set()
        if self._sources is not None:
            for name in names:
                sources.update(self._sources(name))

        def concerns(origin: str) -> bool:
            if origin not in scoped or origin in held:
                return True
            parsed = parse_origin(origin)
            return parsed is not None and parsed[0] in sources

        return concerns

    def _at_scoped_end(self, since: Cursor, channels: Iterable[str]) -> bool:
        """:meth:`at_end` where some origins are scoped: ``since`` must name
        every origin in view (unscoped, or holding messages of ``channels``)
        at its horizon; a scoped origin out of view may be named anywhere."""
        horizon = self._horizon
        origins = self._origins
        scoped = origins.scoped
        relevant = self.relevant(channels)
        named = 0
        for origin, seq in since.positions:
            if origin in scoped and origin not in relevant:
                continue
            if horizon.get(origin) != seq:
                return False
            named += 1
        live = origins.live_unscoped + sum(
            1 for o in relevant if o in scoped and horizon.get(o, 0) > 0)
        if named != live:
            return False
        if origins.lost:
            held = since.as_dict()
            return not origins.behind_lost(since, lambda o: held.get(o, 0),
                                           self.concerns(channels, relevant))
        return True

    def relevant(self, channels: Iterable[str]) -> set[str]:
        """The origins holding (or that held) messages of ``channels``."""
        relevant: set[str] = set()
        for name in channels:
            channel = self._channels.find(name)
            if channel is not None:
                relevant.update(channel.runs)
                relevant.update(channel.evicted)
        return relevant

    def in_view(self, channels: Iterable[str]) -> list[tuple[str, int]]:
        """The horizon a cursor for ``channels`` names: every origin, less the
        scoped ones that hold nothing of these channels."""
        scoped = self._origins.scoped
        if not scoped:
            return list(self._horizon.items())
        relevant = self.relevant(channels)
        horizon = self._horizon
        if not self._origins.live_unscoped:
            # (the origins outside the scoped ones all at 0: a cursor names none
            # of them, so only the channels' own are looked at, not the whole
            # horizon: a node following 1,024 Redis partitions walked it per poll)
            return [(o, horizon[o]) for o in relevant if o in horizon]
        return [(o, h) for o, h in horizon.items() if o not in scoped or o in relevant]

    def read(self, q: Query) -> Result:
        """``Store.query`` the long way: merge the channels' runs from
        ``q.since``; the cursor names the origins in view."""
        since = q.since
        if isinstance(since, Now):
            raise TypeError("resolve since=now with Store.end() first")
        at: Position | None = None
        concerns = self.concerns(q.channels) if self._origins.lost else None
        if isinstance(since, Cursor):
            at = self._origins.reader(since)
            gap = self._origins.behind_lost(since, at, concerns) or any(
                self._origins.forgotten(o) for o, _ in since.positions)
        else:
            gap = self._origins.behind_lost(since, at, concerns)
        streams: list[Iterator[Message]] = []
        for name in q.channels:
            channel = self._channels.find(name)
            if channel is None:
                continue
            gap = gap or channel.has_gap(since, at)
            for origin, run in channel.runs.items():
                if at is not None:
                    start = run.bisect_key_right(at(origin))
                else:
                    assert isinstance(since, int)
                    start = run.first_after(since)
                if start < len(run):
                    streams.append(run.islice(start))
        out, left = merge(streams, q.limit, q.until, q.max_bytes)

        # Origins with a message still to come stop just before it.
        pending: dict[str, int] = {}
        for m in left:
            if m.seq <= pending.get(m.origin, m.seq):
                pending[m.origin] = m.seq
        updates = [(o, pending[o] - 1 if o in pending else h)
                   for o, h in self.in_view(q.channels)]
        base = since if isinstance(since, Cursor) else Cursor(())
        return Result(tuple(out), self._origins.tidy(base.advanced(updates)), gap)

    def end(self, channels: Iterable[str] | None = None) -> Cursor:
        """A cursor past everything the store holds or has skipped (``Store.end``)."""
        if channels is None or not self._origins.scoped:
            return self._origins.tidy(Cursor.of(self._horizon))
        return self._origins.tidy(Cursor.of(dict(self.in_view(channels))))
