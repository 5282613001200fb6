"""Waiting subscriptions: who is held, on which channels, until when.

The hub decides which held subscribers a message, a timeout, a channel
close or a shutdown answers, and hands them back to the caller (removed from
the hub) to be answered. Timeouts are data: one index of deadlines, so the
caller needs a single timer for all of them. It never touches a socket and
never reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count
from operator import attrgetter

from sortedcontainers import SortedKeyList

from pushup.core.model import Message, Query


class Waiter:
    """One held subscription. ``target`` is the caller's (e.g. the request)."""

    __slots__ = ("deadline", "query", "serial", "target")

    def __init__(self, query: Query, deadline: int, target: object) -> None:
        self.query = query
        self.deadline = deadline
        self.target = target
        self.serial = 0

    @property
    def order(self) -> tuple[int, int]:
        return (self.deadline, self.serial)


class Hub:
    """The set of held subscriptions, indexed by channel and by deadline."""

    def __init__(self) -> None:
        self._by_channel: dict[str, dict[Waiter, None]] = {}
        self._by_deadline = SortedKeyList(key=attrgetter("order"))
        self._serials = count(1)

    def __len__(self) -> int:
        return len(self._by_deadline)

    def waiting_on(self, channel: str) -> int:
        return len(self._by_channel.get(channel, ()))

    def next_deadline(self) -> int | None:
        return self._by_deadline[0].deadline if self._by_deadline else None

    def add(self, waiter: Waiter) -> None:
        waiter.serial = next(self._serials)
        for name in waiter.query.channels:
            self._by_channel.setdefault(name, {})[waiter] = None
        self._by_deadline.add(waiter)

    def discard(self, waiter: Waiter) -> bool:
        """Forget ``waiter`` (e.g. its client went away); False if not held."""
        if not waiter.serial:
            return False
        self._by_deadline.remove(waiter)
        self._unlink(waiter)
        return True

    def _unlink(self, waiter: Waiter) -> None:
        """Take ``waiter`` off its channels (not off the deadline index)."""
        for name in waiter.query.channels:
            held = self._by_channel[name]
            del held[waiter]
            if not held:
                del self._by_channel[name]
        waiter.serial = 0

    def take_matching(self, message: Message) -> list[Waiter]:
        """Remove and return the waiters ``message`` answers."""
        found: dict[Waiter, None] = {}
        for name in message.channels:
            for waiter in self._by_channel.get(name, ()):
                if waiter.query.wants(message):
                    found[waiter] = None
        return self._take(found)

    def take_expired(self, now: int) -> list[Waiter]:
        """Remove and return the waiters whose deadline is at or before ``now``."""
        due = []
        for waiter in self._by_deadline:
            if waiter.deadline > now:
                break
            due.append(waiter)
        return self._take(due)

    def take_channel(self, name: str) -> list[Waiter]:
        """Remove and return everyone waiting on ``name`` (it was closed)."""
        return self._take(list(self._by_channel.get(name, ())))

    def take_all(self) -> list[Waiter]:
        return self._take(list(self._by_deadline))

    def _take(self, waiters: Iterable[Waiter]) -> list[Waiter]:
        taken = list(waiters)
        if len(taken) < 64 or len(taken) * 4 < len(self._by_deadline):
            for waiter in taken:
                self.discard(waiter)
            return taken
        # A big fan-out: one pass to rebuild the deadline index beats
        # thousands of removals from it.
        for waiter in taken:
            self._unlink(waiter)
        self._by_deadline = SortedKeyList(
            (w for w in self._by_deadline if w.serial), key=attrgetter("order"))
        return taken
