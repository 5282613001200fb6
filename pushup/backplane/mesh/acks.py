"""Publishes waiting for a peer to hold them, answered in sequence order.

A publish of this node's messages up to sequence ``seq`` waits here until a
peer reports that it holds them (``confirm``), until no peer is left that
could (``give_up``) or until its deadline passes; the last two answer it as
``Unconfirmed`` (a 202, not a 201). This module holds no socket: the mesh
(:mod:`pushup.backplane.mesh.mesh`) feeds it what its peer links report.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from twisted.internet import defer

from pushup.backplane import Unconfirmed
from pushup.core.clock import Clock, DelayedCall
from pushup.core.model import Message


class Acks:
    """Publishes awaiting a peer's confirmation, oldest first.

    A later publish has a higher last sequence number *and* a later deadline,
    so one deque in arrival order is sorted by both: a confirmation answers a
    prefix of it, a timeout answers a prefix of it, and each costs O(1) per
    publish answered. One timer, for the oldest deadline, serves them all.
    """

    def __init__(self, clock: Clock, timeout: float) -> None:
        self.clock = clock
        self.timeout = timeout
        self.unconfirmed = 0  # publishes answered Unconfirmed (for /stats)
        self._waiting: deque[tuple[int, float, defer.Deferred[list[Message]],
                                   list[Message]]] = deque()
        self._timer: DelayedCall | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    def wait(self, messages: list[Message]) -> defer.Deferred[list[Message]]:
        """A Deferred that fires with ``messages`` once a peer holds the last
        of them, or with them as ``Unconfirmed`` when that cannot be had."""
        d: defer.Deferred[list[Message]] = defer.Deferred()
        self._waiting.append((messages[-1].seq, self.clock.seconds() + self.timeout,
                              d, messages))
        if self._timer is None:
            self._timer = self.clock.callLater(self.timeout, self._expire)
        return d

    def confirm(self, after: int) -> None:
        """A peer holds our messages up to ``after``: answer who waited for them."""
        waiting = self._waiting
        # An answer may bring the next publish at once (keep-alive): it is
        # appended with a higher sequence, so this loop never reaches it.
        while waiting and waiting[0][0] <= after:
            _, _, d, messages = waiting.popleft()
            d.callback(messages)

    def give_up(self) -> None:
        """No peer can confirm anything now: answer everyone as unconfirmed."""
        while self._waiting:
            self._unconfirmed(self._waiting.popleft())

    def _expire(self) -> None:
        self._timer = None
        now = self.clock.seconds()
        waiting = self._waiting
        while waiting and waiting[0][1] <= now:
            self._unconfirmed(waiting.popleft())
        if waiting:
            self._timer = self.clock.callLater(max(0.0, waiting[0][1] - now), self._expire)

    def _unconfirmed(self, entry: tuple[int, float, Any, list[Message]]) -> None:
        self.unconfirmed += 1
        entry[2].callback(Unconfirmed(entry[3]))

    def stop(self) -> None:
        """Answer everyone (as unconfirmed) and drop the timer."""
        self.give_up()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
