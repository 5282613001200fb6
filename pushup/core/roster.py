"""The cluster's presence: every node's subscriptions merged, and what changed.

Each node reports, per channel, its number of subscriptions and its members
(:mod:`pushup.core.presence` makes those values; a peer's arrive by the
engine). The roster sums the counts and takes the union of the members, so a
user with tabs on three nodes is one member, and it turns the changes into
events, per channel: ``channel_occupied`` / ``channel_vacated`` when the
cluster's count leaves or reaches 0, ``member_added`` / ``member_removed``
when a user's first node comes or its last goes. Member events are numbered
(``seq``, this roster's own) and the latest kept per channel, so a follower
reads those after the position it holds, or, from a position this roster
cannot answer, the channel as it stands. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pushup.core.presence import Change, Count, Join, Leave

OCCUPIED = "channel_occupied"
VACATED = "channel_vacated"
ADDED = "member_added"
REMOVED = "member_removed"
KEPT_PER_CHANNEL = 256  # member events kept for followers, per channel


@dataclass(frozen=True, slots=True)
class Event:
    """One change of the cluster's presence (``user`` and ``info`` on member events)."""

    name: str
    channel: str
    user: str | None = None
    info: str | None = None


@dataclass(slots=True)
class _NodeChannel:
    subscribers: int = 0
    members: dict[str, str | None] = field(default_factory=dict)


@dataclass(slots=True)
class _Member:
    nodes: int
    info: str | None


@dataclass(slots=True)
class _View:
    subscribers: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    # the latest member events, oldest first: KEPT_PER_CHANNEL to twice that (a
    # list, not a deque: an empty deque is ~600 bytes, and most channels are small)
    log: list[tuple[int, Event]] = field(default_factory=list)
    floor: int = 0  # the seq of the newest member event no longer in ``log``


@dataclass(frozen=True, slots=True)
class Occupancy:
    """A channel as ``GET /presence`` shows it."""

    subscribers: int
    members: tuple[tuple[str, str | None], ...]  # (user, info), at most the cap
    truncated: bool


class Roster:
    """Every node's presence, merged. ``apply`` takes one node's changes;
    ``replace`` one node's whole state (a snapshot); ``forget`` drops a node
    (it died, or left). Each returns the cluster's events, in order."""

    def __init__(self) -> None:
        self.seq = 0  # the last member event's number
        self._nodes: dict[str, dict[str, _NodeChannel]] = {}
        self._views: dict[str, _View] = {}

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted(self._nodes))

    @property
    def channels(self) -> int:
        return len(self._views)

    def apply(self, node: str, changes: Iterable[Change]) -> list[Event]:
        held = self._nodes.setdefault(node, {})
        out: list[Event] = []
        for change in changes:
            name = change.channel
            mine = held.get(name)
            if mine is None:
                mine = held[name] = _NodeChannel()
            if isinstance(change, Count):
                self._count(name, change.subscribers - mine.subscribers, out)
                mine.subscribers = change.subscribers
            elif isinstance(change, Join):
                if change.user not in mine.members:
                    mine.members[change.user] = change.info
                    self._join(name, change.user, change.info, out)
            elif isinstance(change, Leave):
                if mine.members.pop(change.user, False) is not False:
                    self._leave(name, change.user, out)
            if not mine.subscribers and not mine.members:
                del held[name]
        return out

    def replace(self, node: str,
                state: dict[str, tuple[int, dict[str, str | None]]]) -> list[Event]:
        """``node``'s whole state is ``state``: the difference is applied."""
        held = self._nodes.get(node, {})
        changes: list[Change] = []
        for name, mine in held.items():
            count, members = state.get(name, (0, {}))
            changes += [Leave(name, user) for user in mine.members if user not in members]
            if name not in state:
                changes.append(Count(name, 0))
        for name, (count, members) in state.items():
            changes.append(Count(name, count))
            changes += [Join(name, user, info) for user, info in members.items()]
        # a leave before the joins: a user's info that changed is said once, as a join
        return self.apply(node, changes)

    def forget(self, node: str) -> list[Event]:
        out = self.replace(node, {})
        self._nodes.pop(node, None)
        return out

    def state_of(self, node: str) -> dict[str, tuple[int, dict[str, str | None]]]:
        return {name: (ch.subscribers, dict(ch.members))
                for name, ch in self._nodes.get(node, {}).items()}

    # -- reading ---------------------------------------------------------------

    def occupancy(self, channel: str, cap: int) -> Occupancy:
        view = self._views.get(channel)
        if view is None:
            return Occupancy(0, (), False)
        members: list[tuple[str, str | None]] = []
        for user, member in view.members.items():
            if len(members) == cap:
                break
            members.append((user, member.info))
        return Occupancy(view.subscribers, tuple(members), len(view.members) > cap)

    def since(self, channels: Iterable[str], seq: int | None) -> list[Event]:
        """The member events of ``channels`` after ``seq``; where this roster
        cannot say (``seq`` None, or older than what it keeps), the channel as
        it stands: every member as added, after every member it keeps as
        removed who is not back. A follower keeping a set ends up right
        either way."""
        out: list[tuple[int, Event]] = []
        for name in channels:
            view = self._views.get(name)
            if view is None:
                continue
            if seq is not None and seq >= view.floor and seq <= self.seq:
                out += [(n, e) for n, e in view.log if n > seq]
                continue
            gone = {e.user: (n, e) for n, e in view.log
                    if e.name == REMOVED and e.user not in view.members}
            out += gone.values()
            out += [(self.seq, Event(ADDED, name, user, m.info))
                    for user, m in view.members.items()]
        out.sort(key=lambda pair: pair[0])
        return [e for _, e in out]

    # -- the tables ------------------------------------------------------------

    def _view(self, name: str) -> _View:
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = _View()
        return view

    def _count(self, name: str, delta: int, out: list[Event]) -> None:
        if not delta:
            return
        view = self._view(name)
        before = view.subscribers
        view.subscribers += delta
        if not before and view.subscribers:
            out.append(Event(OCCUPIED, name))
        elif before and not view.subscribers:
            out.append(Event(VACATED, name))
            self._tidy(name, view)

    def _join(self, name: str, user: str, info: str | None, out: list[Event]) -> None:
        view = self._view(name)
        member = view.members.get(user)
        if member is not None:
            member.nodes += 1
            return
        view.members[user] = _Member(1, info)
        self._log(view, Event(ADDED, name, user, info), out)

    def _leave(self, name: str, user: str, out: list[Event]) -> None:
        view = self._views[name]
        member = view.members[user]
        member.nodes -= 1
        if member.nodes:
            return
        del view.members[user]
        self._log(view, Event(REMOVED, name, user, member.info), out)
        self._tidy(name, view)

    def _log(self, view: _View, event: Event, out: list[Event]) -> None:
        self.seq += 1
        log = view.log
        log.append((self.seq, event))
        if len(log) > 2 * KEPT_PER_CHANNEL:
            cut = len(log) - KEPT_PER_CHANNEL
            view.floor = log[cut - 1][0]
            del log[:cut]
        out.append(event)

    def _tidy(self, name: str, view: _View) -> None:
        """A channel nobody follows is forgotten (its log with it: a
        follower's next read is a snapshot, of nobody)."""
        if not view.subscribers and not view.members:
            del self._views[name]
