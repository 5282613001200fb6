"""Another origin's log, as the core takes it: the entries and the answer.

Every engine that brings this node what another origin ordered (a peer's
batch on the mesh, the Redis log's entries, this node's own publish as Redis
stamped it) hands the core an ordered run of these values through
``Service.follow``, and is told how far the node now holds that origin
(``Applied``) or the sequence it must send again from (``Hole``). Which entry
comes next, and so the gap-free horizon, is decided in one place:
:func:`place`. Values only: no socket, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pushup.core.channels import ChannelOp
from pushup.core.idempotency import Remembered
from pushup.core.model import Message


@dataclass(frozen=True, slots=True)
class Skip:
    """The origin's history up to ``seq`` (the last of it stamped ``ts``) is gone
    everywhere: evicted before it could be sent, trimmed from a log, or lost
    with the log itself. Readers behind it are told of a gap."""

    seq: int
    ts: int


@dataclass(frozen=True, slots=True)
class LoggedOp:
    """Entry ``seq`` of an origin's log, stamped ``ts``, is a channel operation
    (the Redis log's shape: an operation takes a sequence number of its own,
    and carries no message)."""

    seq: int
    ts: int
    op: ChannelOp


@dataclass(frozen=True, slots=True)
class Passed:
    """Entry ``seq`` of an origin's log, stamped ``ts``, carries nothing this
    node stores (the Redis log's note of where a channel has messages)."""

    seq: int
    ts: int


@dataclass(frozen=True, slots=True)
class Quiet:
    """The origin's entries up to ``seq`` carry nothing for this node: none of
    the channels it follows there (the Redis engine follows a partition's log
    channel by channel, and hears only of its own channels' entries). The
    horizon moves up to ``seq`` with no gap: nothing was lost."""

    seq: int


# A ``ChannelOp`` in a run is the mesh's shape: it takes no sequence number
# and applies once the origin is held up to its ``at_seq``. A ``Remembered``
# is a keyed publish's record: kept once its last message is held.
Entry = Message | ChannelOp | LoggedOp | Passed | Quiet | Skip | Remembered


@dataclass(frozen=True, slots=True)
class Applied:
    """The run is in: the node holds the origin up to ``horizon``."""

    horizon: int


@dataclass(frozen=True, slots=True)
class Hole:
    """The run would leave a hole: send again from ``expected``."""

    expected: int


Followed = Applied | Hole


class Place(Enum):
    """Where a numbered entry stands against what the node holds of its origin."""

    HELD = "held"  # at or behind the horizon: applied before, nothing to do
    NEXT = "next"  # the one after the horizon: apply it
    AHEAD = "ahead"  # past the next: what lies between is missing


def place(seq: int, horizon: int) -> Place:
    """The one rule of the gap-free horizon: only the next entry is applied."""
    if seq <= horizon:
        return Place.HELD
    return Place.NEXT if seq == horizon + 1 else Place.AHEAD
