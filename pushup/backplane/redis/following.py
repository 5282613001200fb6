"""A partition as this node follows it: its keys, the channels of it this node
follows, each with its follow phase moved by one table, and what the node holds.

The rule: a node follows a partition channel by channel. A channel's phase is
one of ``Follow``'s and changes only by ``FollowedChannel.move`` along
``MOVES`` (h11's ``_state.py``, like ``pushup.http.phase``): asked (its
notifications subscribed to, not yet confirmed by Redis); subscribed
(confirmed, not yet read since); ready (read since its subscription was
confirmed: held whole up to the partition's horizon, served); adrift (was
ready, its subscription lost with a connection or a slot move: still served
as it was, but the horizon must not move past what it may have missed);
rejoined (adrift, subscribed again: a read is owed). A move the table does not
list is a bug and raises ``ValueError``. Whether a read back is under way, and
another owed after it, is the partition's ``SingleFlight``
(``pushup.backplane.links``). Values only: ``interest.py`` follows and lets
go, ``reader.py`` reads.
"""

from __future__ import annotations

import secrets
from enum import IntEnum
from typing import Any, Final

from pushup.backplane.links import SingleFlight
from pushup.backplane.redis.partitions import PartitionKeys


class Follow(IntEnum):
    ASKED = 0  # SSUBSCRIBE sent, not confirmed: nothing of it trusted, not served
    SUBSCRIBED = 1  # confirmed, not read since: what was published before is not held
    READY = 2  # read since its subscription was confirmed: held whole, served
    ADRIFT = 3  # was ready, its subscription lost: served as it was, the horizon held
    REJOINED = 4  # adrift, confirmed again: served as it was, a read owed


class Step(IntEnum):
    """What happens to a followed channel."""

    CONFIRMED = 0  # Redis confirmed its subscription
    LOST = 1  # its subscription went (the connection, a slot move)
    READ = 2  # a read of its stream since the confirmation is in


_F = Follow

# {phase: {what happens: the next phase}}. Missing: cannot happen. (Following a
# channel makes it ASKED; letting it go forgets it, whatever its phase.)
MOVES: Final[dict[Follow, dict[Step, Follow]]] = {
    _F.ASKED: {Step.CONFIRMED: _F.SUBSCRIBED, Step.LOST: _F.ASKED},
    _F.SUBSCRIBED: {Step.CONFIRMED: _F.SUBSCRIBED, Step.LOST: _F.ASKED, Step.READ: _F.READY},
    # a read while ready: after a missed entry, or another channel's first read
    _F.READY: {Step.CONFIRMED: _F.REJOINED, Step.LOST: _F.ADRIFT, Step.READ: _F.READY},
    _F.ADRIFT: {Step.CONFIRMED: _F.REJOINED, Step.LOST: _F.ADRIFT},
    _F.REJOINED: {Step.CONFIRMED: _F.REJOINED, Step.LOST: _F.ADRIFT, Step.READ: _F.READY},
}
SERVED: Final = frozenset({_F.READY, _F.ADRIFT, _F.REJOINED})  # answered from memory
READABLE: Final = frozenset({_F.SUBSCRIBED, _F.READY, _F.REJOINED})  # confirmed: a read counts
UNSURE: Final = frozenset({_F.ADRIFT, _F.REJOINED})  # served, but may have missed entries


def follow_after(phase: Follow, step: Step) -> Follow:
    """The phase after ``step`` in ``phase``; ``ValueError`` if it cannot happen."""
    try:
        return MOVES[phase][step]
    except KeyError:
        raise ValueError(f"a followed channel cannot {step.name} when {phase.name}") from None


class FollowedChannel:
    """One channel of a partition this node follows: its phase (``move`` only),
    the last entry of it this node holds (``last``: a notification whose
    previous entry is later shows one missed) and when a request last needed it."""

    __slots__ = ("_phase", "holds_back", "last", "missed", "moves", "needed_at")

    def __init__(self, now: float) -> None:
        self._phase = Follow.ASKED
        self.moves = 0  # its subscription's confirmations and losses so far
        # how far this node holds it whole: its last entry applied, or the
        # log's end at its last read (a notification whose previous entry is
        # later shows one missed)
        self.last = 0
        self.missed = False  # a notification showed an entry of it never seen
        self.needed_at = now  # the reactor's seconds
        # Followed here because its channel, served already, was found to have
        # messages in this partition too: until its first read the partition's
        # horizon waits (its readers may hold cursors of this partition).
        self.holds_back = False

    @property
    def phase(self) -> Follow:
        return self._phase

    def move(self, step: Step) -> None:
        """Take ``step`` (``MOVES``); ``ValueError`` if it cannot happen now."""
        self._phase = follow_after(self._phase, step)
        if step is not Step.READ:
            self.moves += 1

    @property
    def served(self) -> bool:
        """Answered from memory (``SERVED``)."""
        return self._phase in SERVED


class Partition:
    """One partition: its keys (``keys``), the channels of it this node
    follows (``channels``), its reads (``reads``) and what this node holds of it."""

    def __init__(self, index: int, tag: str) -> None:
        self.index, self.tag = index, tag  # its name (logs, origin, notes abroad)
        self.keys = PartitionKeys(index, tag)
        self.channels: dict[str, FollowedChannel] = {}
        self.reads = SingleFlight()  # its read backs: one at a time, once more after
        self.epoch = ""  # the log's epoch this node read ("": none yet)
        # what the scripts add to Redis's clock, should the log need a new epoch
        self.salt = secrets.randbelow(1296)
        # notifications held back (during a read, or while a channel is unsure):
        # (channel, payload), in the order they came
        self.waiting: list[tuple[str, bytes]] = []
        self.when_ready: list[tuple[Any, tuple[str, ...]]] = []  # (Deferred, channels)
        # its channels that have messages in other partitions -> those partitions
        self.abroad: dict[str, set[int]] = {}

    @property
    def origin(self) -> str:
        """The store's origin for the log's epoch held: ``<tag>.<epoch>``."""
        return f"{self.tag}.{self.epoch}"

    @property
    def followed(self) -> bool:
        """Some channel of it is followed."""
        return bool(self.channels)

    @property
    def ready(self) -> bool:
        """Some channel of it is held whole (the partition has been read)."""
        return any(c.phase is Follow.READY for c in self.channels.values())

    def serves(self, name: str) -> bool:
        """Channel ``name`` is answered from memory (``SERVED``)."""
        followed = self.channels.get(name)
        return followed is not None and followed.served

    @property
    def steady(self) -> bool:
        """No channel of it may have missed entries (none ``UNSURE``, none
        holding it back before its first read): its horizon may move."""
        return not any(c.phase in UNSURE or c.holds_back and c.phase is not Follow.READY
                       for c in self.channels.values())

    def readable(self) -> list[str]:
        """Its channels whose subscription is confirmed (``READABLE``)."""
        return [name for name, c in self.channels.items() if c.phase in READABLE]
