"""Who subscribes here: this node's subscriptions, counted per channel and per user.

A subscription is keyed by who makes it (an event stream, or a long-poll
client between its polls) and names its channels and, from the subscriber
token, its user (``sub``) and that user's ``info``. It counts while held and
for ``window`` after it was last released, so a long poll between two polls,
or a page reloading, stays counted; an anonymous poll (nobody could
recognise it again) counts while held only. Each change comes out as values
(``Count``, ``Join``, ``Leave``), per channel, for the roster
(:mod:`pushup.core.roster`) that merges every node's. Pure: time is passed in
(integer microseconds), nothing here reads a clock or sets a timer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Count:
    """``channel`` now has ``subscribers`` subscriptions on this node."""

    channel: str
    subscribers: int


@dataclass(frozen=True, slots=True)
class Join:
    """``user`` (with ``info``, its JSON text or None) now subscribes to ``channel`` here."""

    channel: str
    user: str
    info: str | None


@dataclass(frozen=True, slots=True)
class Leave:
    """``user`` no longer subscribes to ``channel`` here."""

    channel: str
    user: str


Change = Count | Join | Leave


@dataclass(slots=True)
class _Entry:
    user: str | None
    info: str | None
    channels: tuple[str, ...]
    holds: int = 0  # held polls and open streams under this key now
    until: int = 0  # when the key goes, once none is held (µs; set at each release)


@dataclass(slots=True)
class _User:
    keys: int  # this user's keys on the channel
    info: str | None


@dataclass(slots=True)
class _Channel:
    keys: int = 0  # subscriptions: keys, and anonymous ones held
    users: dict[str, _User] = field(default_factory=dict)


class Presence:
    """This node's subscriptions. ``hold``, ``release`` and ``expire`` return
    the membership changes they made, in order (a ``Join`` when a user's
    first subscription to a channel came, a ``Leave`` when its last went);
    the channels whose count moved are noted, and ``take_counts`` says them
    (a ``Count`` each, the count as it is then), so a fan-out's thousands of
    re-polls on one channel are one ``Count``. ``expire`` must be called by
    ``next_deadline`` at the latest for lingering keys to go.

    A subscriber between two polls costs O(1) per poll and no timer of its
    own: ``hold`` of a key it knows only counts one more hold, ``release``
    stamps when the key goes and moves it to the end of the keys released,
    which stay in the order they go in (the window is one, time only moves
    on); ``expire`` looks only at their head, and passes over a key held
    again since (its next release puts it back)."""

    def __init__(self, window: int) -> None:
        self.window = window  # µs a released key stays counted
        self.anonymous = 0  # subscriptions held under no key
        self._entries: dict[str, _Entry] = {}
        self._channels: dict[str, _Channel] = {}
        # keys released, in the order they go (see above); a key held again
        # since its release may still be in it (never deleted per poll:
        # move_to_end, not a delete and an insert, so no churn of the table)
        self._lingering: OrderedDict[str, _Entry] = OrderedDict()
        self._moved: dict[str, None] = {}  # channels whose count moved, in order

    def __len__(self) -> int:
        return len(self._entries) + self.anonymous

    @property
    def channels(self) -> int:
        return len(self._channels)

    def hold(self, key: str, user: str | None, info: str | None,
             channels: tuple[str, ...]) -> list[Join | Leave] | None:
        """A poll or a stream under ``key`` starts. A key that names other
        channels or another user than before is a new subscription (the old
        one goes at once: a client that changed its mind is not in both).
        None when nothing moved (a key known, as before: a re-poll)."""
        entry = self._entries.get(key)
        if entry is not None:
            if entry.channels == channels and entry.user == user:
                entry.holds += 1
                return None
            out = self._remove(key, entry)
        else:
            out = []
        entry = self._entries[key] = _Entry(user, info, channels, 1)
        out += self._add(entry)
        return out

    def release(self, key: str, now: int) -> bool:
        """A poll or stream under ``key`` ended; once none is held, the key
        counts on for the window (``expire`` lets it go). True when it is
        the first key to go (``next_deadline`` moved from None to it)."""
        entry = self._entries.get(key)
        if entry is None or entry.holds == 0:
            return False
        entry.holds -= 1
        if entry.holds:
            return False
        entry.until = now + self.window
        lingering = self._lingering
        first = not lingering
        lingering[key] = entry
        lingering.move_to_end(key)
        return first

    def hold_anonymous(self, channels: tuple[str, ...]) -> None:
        """A poll nobody could recognise again: counted while held only."""
        self.anonymous += 1
        found = self._channels
        moved = self._moved
        for name in channels:
            channel = found.get(name)
            if channel is None:
                channel = found[name] = _Channel()
            channel.keys += 1
            moved[name] = None

    def release_anonymous(self, channels: tuple[str, ...]) -> None:
        self.anonymous -= 1
        found = self._channels
        moved = self._moved
        for name in channels:
            channel = found[name]
            channel.keys -= 1
            moved[name] = None
            if not channel.keys and not channel.users:
                del found[name]

    @property
    def counts_moved(self) -> bool:
        return bool(self._moved)

    def take_counts(self) -> list[Count]:
        """A ``Count`` for each channel whose count moved since the last call."""
        if not self._moved:
            return []
        moved, self._moved = self._moved, {}
        return [Count(name, self.subscribers(name)) for name in moved]

    def next_deadline(self) -> int | None:
        """When the first key released is due to go (µs), if any (it may be
        held again by then: ``expire`` then only passes it over)."""
        for entry in self._lingering.values():
            return entry.until
        return None

    def expire(self, now: int) -> list[Join | Leave]:
        """Let go of every key released more than the window ago and not
        held since."""
        out: list[Join | Leave] = []
        lingering = self._lingering
        while lingering:
            key, entry = next(iter(lingering.items()))
            if entry.holds:  # held again: its next release puts it back
                del lingering[key]
                continue
            if entry.until > now:
                break
            out += self._remove(key, entry)
        return out

    def subscribers(self, channel: str) -> int:
        found = self._channels.get(channel)
        return 0 if found is None else found.keys

    def members(self, channel: str) -> dict[str, str | None]:
        """The users subscribed to ``channel`` here, with their info."""
        found = self._channels.get(channel)
        if found is None:
            return {}
        return {user: held.info for user, held in found.users.items()}

    def state(self) -> State:
        """Everything: per occupied channel, its count and members (a snapshot
        for a peer that lost track of this node)."""
        return {name: (ch.keys, self.members(name)) for name, ch in self._channels.items()}

    # -- the tables ------------------------------------------------------------

    def _add(self, entry: _Entry) -> list[Join | Leave]:
        out: list[Join | Leave] = []
        for name in entry.channels:
            channel = self._channels.get(name)
            if channel is None:
                channel = self._channels[name] = _Channel()
            channel.keys += 1
            self._moved[name] = None
            if entry.user is None:
                continue
            held = channel.users.get(entry.user)
            if held is None:
                channel.users[entry.user] = _User(1, entry.info)
                out.append(Join(name, entry.user, entry.info))
            else:
                held.keys += 1
        return out

    def _remove(self, key: str, entry: _Entry) -> list[Join | Leave]:
        del self._entries[key]
        self._lingering.pop(key, None)
        out: list[Join | Leave] = []
        for name in entry.channels:
            channel = self._channels[name]
            channel.keys -= 1
            self._moved[name] = None
            if entry.user is not None:
                held = channel.users[entry.user]
                held.keys -= 1
                if not held.keys:
                    del channel.users[entry.user]
                    out.append(Leave(name, entry.user))
            if not channel.keys and not channel.users:
                del self._channels[name]
        return out


# -- on the wire between nodes (the engines' replicators carry these) -----------

State = dict[str, tuple[int, dict[str, str | None]]]


def changes_json(changes: list[Change]) -> list[list[object]]:
    """Changes as JSON values: ``["c", channel, n]``, ``["j", channel, user,
    info]``, ``["l", channel, user]``."""
    out: list[list[object]] = []
    for c in changes:
        if isinstance(c, Count):
            out.append(["c", c.channel, c.subscribers])
        elif isinstance(c, Join):
            out.append(["j", c.channel, c.user, c.info])
        else:
            out.append(["l", c.channel, c.user])
    return out


def changes_of(raw: object) -> list[Change]:
    """``changes_json`` read back; ValueError if it is not."""
    if not isinstance(raw, list):
        raise ValueError("changes are a list")
    out: list[Change] = []
    for item in raw:
        if not isinstance(item, list) or len(item) < 3 or not isinstance(item[1], str):
            raise ValueError("a change is [kind, channel, ...]")
        kind, channel = item[0], item[1]
        if kind == "c" and len(item) == 3 and isinstance(item[2], int):
            out.append(Count(channel, item[2]))
        elif kind == "j" and len(item) == 4 and isinstance(item[2], str) \
                and (item[3] is None or isinstance(item[3], str)):
            out.append(Join(channel, item[2], item[3]))
        elif kind == "l" and len(item) == 3 and isinstance(item[2], str):
            out.append(Leave(channel, item[2]))
        else:
            raise ValueError(f"not a change: {item!r:.100}")
    return out


def state_json(state: State) -> dict[str, list[object]]:
    return {name: [count, members] for name, (count, members) in state.items()}


def state_of(raw: object) -> State:
    """``state_json`` read back; ValueError if it is not."""
    if not isinstance(raw, dict):
        raise ValueError("a state is an object")
    out: State = {}
    for name, value in raw.items():
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
                and isinstance(value[1], dict)
                and all(isinstance(u, str) and (i is None or isinstance(i, str))
                        for u, i in value[1].items())):
            raise ValueError(f"not a channel's presence: {name!r:.100}")
        out[name] = (value[0], value[1])
    return out
