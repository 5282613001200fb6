"""Origins and restarts: which origins a cursor may name, and what it lost.

An origin is ``<node_id>.<epoch>``; a newer epoch of the same node id
supersedes the older ones. A cursor position for an origin the store does not
hold, whose node the store knows at a newer epoch, is history lost with a
restart (a gap, reported once); a superseded origin that holds no message any
more is *retired* and dropped from the cursors the store hands out. So an
issued cursor names at most the origins holding cached messages, the newest
origin of each node id, and origins of nodes this store has not heard of (cut
to ``MAX_ORIGINS``). ``Origins`` also keeps the store's horizon (how far it
holds each origin without a hole) and what of each was lost everywhere, and
moves them only forward. Pure bookkeeping, owned by the store: no socket, no
clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pushup.core.changes import NO_CHANGES, Changes
from pushup.core.cursor import MAX_ORIGINS, Cursor
from pushup.core.model import parse_origin

READ_THROUGH = 1 << 63  # the position of a retired origin a cursor has moved past
Position = Callable[[str], int]  # a cursor's position for an origin, as the store reads it


class Origins:
    """The origins of a store's horizon: how far it holds each, what was lost,
    their nodes' newest epochs, and the superseded ones that hold nothing
    (``holds(origin)`` says whether the store caches any message of it)."""

    def __init__(self, holds: Callable[[str], bool]) -> None:
        self.horizon: dict[str, int] = {}
        # Per origin, the last (seq, ts) of history this node will never have:
        # evicted everywhere before it could be fetched. Any reader behind it
        # is told of a gap, whatever its channels (we do not know theirs).
        self.lost: dict[str, tuple[int, int]] = {}
        self.changes: Changes = NO_CHANGES
        self.holds = holds
        self._parsed: dict[str, tuple[str, int] | None] = {}
        self.newest: dict[str, int] = {}  # node id -> its newest epoch known
        self.retired: set[str] = set()
        # Origins a cursor names only for the channels that hold their messages
        # (a Redis partition's log: a node may hold hundreds, a channel lives in
        # one), and how many origins outside them the horizon holds past 0.
        self.scoped: set[str] = set()
        self.live_unscoped = 0

    def horizon_of(self, origin: str) -> int:
        """How far (seq) the store holds ``origin`` without a hole; 0 if unknown."""
        return self.horizon.get(origin, 0)

    def horizons(self) -> dict[str, int]:
        """Every origin's horizon: a copy, in the order the store met them."""
        return dict(self.horizon)

    def lost_of(self, origin: str) -> tuple[int, int] | None:
        """The last (seq, ts) of ``origin``'s history lost everywhere, if any."""
        return self.lost.get(origin)

    def raise_horizon(self, origin: str, seq: int) -> None:
        """We hold (or will never have) ``origin`` up to ``seq``."""
        if origin not in self.horizon:
            self.horizon[origin] = 0
            self.note(origin)
        have = self.horizon[origin]
        if seq > have:
            if have == 0 and origin not in self.scoped:
                self.live_unscoped += 1
            self.horizon[origin] = seq
            self.changes.origin(origin)

    def forget(self, origin: str) -> None:
        """The store no longer holds ``origin`` at all (a partition it stopped
        following): it leaves the horizon; what was lost of it stays known."""
        seq = self.horizon.pop(origin, None)
        if seq and origin not in self.scoped:
            self.live_unscoped -= 1
        self.retired.discard(origin)

    def scope(self, origin: str) -> None:
        """A cursor names ``origin`` only for the channels holding its messages."""
        if origin not in self.scoped:
            self.scoped.add(origin)
            if self.horizon.get(origin, 0) > 0:
                self.live_unscoped -= 1

    def pass_over(self, origin: str, seq: int) -> None:
        """``seq`` of ``origin`` carries no message: the horizon moves past it,
        strictly in order (ValueError if ``seq`` would leave a hole)."""
        have = self.horizon.get(origin, 0)
        if seq <= have:
            return
        if seq != have + 1:
            raise ValueError(f"{origin}: expected seq {have + 1}, got {seq}")
        if have == 0 and origin not in self.scoped:
            self.live_unscoped += 1
        self.horizon[origin] = seq

    def skip_to(self, origin: str, seq: int, ts: int) -> None:
        """History of ``origin`` up to ``seq`` is gone everywhere: move past it."""
        if seq > self.horizon.get(origin, 0):
            self.raise_horizon(origin, seq)
            self.lost[origin] = (seq, ts)

    def restore(self, horizon: Iterable[tuple[str, int]],
                lost: Iterable[tuple[str, int, int]], keep: str) -> None:
        """Horizons and losses read back (an image); ``keep``'s are left as they are."""
        for origin, seq in horizon:
            if origin != keep:
                self.raise_horizon(origin, seq)
        for origin, seq, ts in lost:
            self.lost[origin] = (seq, ts)

    def behind_lost(self, since: Cursor | int, at: Position | None,
                    concerns: Callable[[str], bool] | None = None) -> bool:
        """Whether a reader at ``since`` (read with ``at``) missed lost history
        (of the origins it ``concerns``: every one if None)."""
        lost = [(o, held) for o, held in self.lost.items() if concerns is None or concerns(o)]
        if at is not None:
            return any(at(o) < seq for o, (seq, _) in lost)
        assert isinstance(since, int)
        return any(ts > since for _, (_, ts) in lost)

    def note(self, origin: str) -> None:
        """``origin`` enters the horizon: learn its node's newest epoch, and
        retire the origins it supersedes that hold nothing."""
        parsed = self._parsed[origin] = parse_origin(origin)
        if parsed is None:
            return
        node, epoch = parsed
        newest = self.newest.get(node, -1)
        if epoch > newest:
            self.newest[node] = epoch
            for o in self.horizon:
                p = self._parsed.get(o)
                if p is not None and p[0] == node and p[1] < epoch and not self.holds(o):
                    self.retired.add(o)
        elif epoch < newest and not self.holds(origin):
            self.retired.add(origin)

    def superseded(self, origin: str) -> bool:
        parsed = self._parsed.get(origin)
        return parsed is not None and self.newest[parsed[0]] > parsed[1]

    def forgotten(self, origin: str) -> bool:
        """A position in an origin we do not hold, though we know its node at a
        newer epoch: its history went with a restart."""
        if origin in self.horizon:
            return False
        parsed = parse_origin(origin)
        return parsed is not None and self.newest.get(parsed[0], -1) > parsed[1]

    def _newest_named(self, cursor: Cursor) -> dict[str, int]:
        named: dict[str, int] = {}
        for o, _ in cursor.positions:
            parsed = self._parsed.get(o) if o in self._parsed else parse_origin(o)
            if parsed is not None and parsed[1] > named.get(parsed[0], -1):
                named[parsed[0]] = parsed[1]
        return named

    def reader(self, since: Cursor) -> Position:
        """How this store reads ``since``: a retired origin the cursor does not
        name, while it names a newer origin of the same node, was read through
        (a cursor we issued dropped it after reporting any gap in it)."""
        held = since.as_dict()
        if not self.retired:
            return lambda o: held.get(o, 0)
        named = self._newest_named(since)

        def position(origin: str) -> int:
            seq = held.get(origin)
            if seq is not None:
                return seq
            if origin in self.retired:
                node, epoch = self._parsed[origin]  # type: ignore[misc]
                if named.get(node, -1) > epoch:
                    return READ_THROUGH
            return 0

        return position

    def tidy(self, cursor: Cursor) -> Cursor:
        """The cursor to hand out: without forgotten origins, without retired
        ones it has moved past, and at most ``MAX_ORIGINS`` long (origins of
        nodes we have not heard of go first: only a forged cursor has many)."""
        named: dict[str, int] | None = None
        known: list[tuple[str, int]] = []
        unknown: list[tuple[str, int]] = []
        for o, seq in cursor.positions:
            if o in self.horizon:
                if o in self.retired:
                    if named is None:
                        named = self._newest_named(cursor)
                    node, epoch = self._parsed[o]  # type: ignore[misc]
                    if named.get(node, -1) > epoch:
                        continue
                known.append((o, seq))
            elif not self.forgotten(o):
                unknown.append((o, seq))
        if len(known) + len(unknown) > MAX_ORIGINS:
            unknown = unknown[: max(0, MAX_ORIGINS - len(known))]
        if len(known) + len(unknown) == len(cursor.positions):
            return cursor
        return Cursor(tuple(sorted(known + unknown)))
