"""A partition as this node follows it: its keys, its follow phase moved by one
table, and what the node holds while it follows.

The rule: a partition's follow phase is one of ``Follow``'s and changes only
by ``Partition.move`` along ``MOVES`` (h11's ``_state.py``, like
``pushup.http.phase``): not followed; followed (subscribed to its
notifications, not yet read whole since); ready (read once since it was
followed: held whole, kept in the log's order). A move the table does not
list is a bug and raises ``ValueError``. Whether a read back is under way,
and another owed after it, is the partition's ``SingleFlight``
(``pushup.backplane.links``), the same machine the slot map's re-reads run
on. Values only: ``interest.py`` follows and lets go, ``reader.py`` reads.
"""

from __future__ import annotations

import secrets
from enum import IntEnum
from typing import Any, Final

from pushup.backplane.links import SingleFlight
from pushup.backplane.redis.partitions import PartitionKeys


class Follow(IntEnum):
    UNFOLLOWED = 0  # not subscribed: this node holds nothing of it it can trust
    FOLLOWED = 1  # subscribed, and read back after every (re)subscription; not yet read whole
    READY = 2  # read once since it was followed: held whole


class Step(IntEnum):
    """What happens to a partition's following."""

    FOLLOW = 0  # a request needs it: subscribed to its notifications
    READ = 1  # a read back of its log is done: what the node holds is the log
    LET_GO = 2  # no request needed it for the linger: unsubscribed


_F = Follow

# {phase: {what happens: the next phase}}. Missing: cannot happen.
MOVES: Final[dict[Follow, dict[Step, Follow]]] = {
    _F.UNFOLLOWED: {Step.FOLLOW: _F.FOLLOWED},
    _F.FOLLOWED: {Step.READ: _F.READY, Step.LET_GO: _F.UNFOLLOWED},
    # a read after a resubscription, a hole or a new epoch: still held whole
    _F.READY: {Step.READ: _F.READY, Step.LET_GO: _F.UNFOLLOWED},
}


def follow_after(phase: Follow, step: Step) -> Follow:
    """The phase after ``step`` in ``phase``; ``ValueError`` if it cannot happen."""
    try:
        return MOVES[phase][step]
    except KeyError:
        raise ValueError(f"a partition cannot {step.name} when {phase.name}") from None


class Partition:
    """One partition: its keys (``keys``), its follow phase (``phase``, moved by
    ``move`` only), its reads (``reads``) and what this node holds of it."""

    def __init__(self, index: int, tag: str) -> None:
        self.index, self.tag = index, tag  # its name (logs, origin, notes abroad)
        self.keys = PartitionKeys(index, tag)
        self._phase = Follow.UNFOLLOWED
        self.reads = SingleFlight()  # its read backs: one at a time, once more after
        self.epoch = ""  # the log's epoch this node holds ("": none yet)
        # what the scripts add to Redis's clock, should the log need a new epoch
        self.salt = secrets.randbelow(1296)
        self.waiting: list[bytes] = []  # notifications that came during the read
        self.when_ready: list[Any] = []  # Deferreds of requests waiting for it
        self.needed_by: set[str] = set()  # channels whose polls made this node follow it
        self.needed_at = 0.0  # when a request last needed it (the reactor's seconds)
        # its channels that have messages in other partitions -> those partitions
        self.abroad: dict[str, set[int]] = {}

    @property
    def origin(self) -> str:
        """The store's origin for the log's epoch held: ``<tag>.<epoch>``."""
        return f"{self.tag}.{self.epoch}"

    @property
    def phase(self) -> Follow:
        """Where its following is (``MOVES``)."""
        return self._phase

    def move(self, step: Step) -> None:
        """Take ``step`` (``MOVES``); ``ValueError`` if it cannot happen now."""
        self._phase = follow_after(self._phase, step)

    @property
    def followed(self) -> bool:
        """Subscribed to (``FOLLOWED`` or ``READY``)."""
        return self._phase is not Follow.UNFOLLOWED

    @property
    def ready(self) -> bool:
        """Read whole since it was followed (``READY``)."""
        return self._phase is Follow.READY
