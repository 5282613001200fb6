"""Waiting subscriptions: who is held, on which channels, until when.

The hub decides which held subscribers a message, a timeout, a channel
close or a shutdown answers, and hands them back to the caller (removed from
the hub) to be answered. Timeouts are data: one index of deadlines, so the
caller needs a single timer for all of them. It never touches a socket and
never reads the clock.

The deadline index is a binary heap of ``(deadline, serial, waiter)`` whose
entries are dropped lazily: a waiter answered or gone leaves its entry
behind (its ``serial`` no longer matches) until it reaches the top or the
stale entries outnumber the live ones; a waiter discarded (its client gone)
drops its ``target`` at once, so its stale entry holds no connection (issue
26). Holding a poll is one ``heappush``; a fan-out that answers thousands
removes nothing from the index (issue 18: the sorted list this replaces cost
7 % of a re-poll).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from itertools import count

from pushup.core.model import Message, Query


class Waiter:
    """One held subscription. ``target`` is the caller's (e.g. the request)."""

    __slots__ = ("deadline", "query", "serial", "target")

    def __init__(self, query: Query, deadline: int, target: object) -> None:
        self.query = query
        self.deadline = deadline
        self.target = target
        self.serial = 0  # > 0 while held: its entry in the deadline index


class Hub:
    """The set of held subscriptions, indexed by channel and by deadline."""

    def __init__(self) -> None:
        self._by_channel: dict[str, dict[Waiter, None]] = {}
        self._deadlines: list[tuple[int, int, Waiter]] = []  # a heap, stale entries too
        self._held = 0
        self._serials = count(1)

    def __len__(self) -> int:
        return self._held

    def waiting_on(self, channel: str) -> int:
        return len(self._by_channel.get(channel, ()))

    def next_deadline(self) -> int | None:
        heap = self._deadlines
        while heap and heap[0][2].serial != heap[0][1]:
            heapq.heappop(heap)  # answered or gone
        return heap[0][0] if heap else None

    def add(self, waiter: Waiter) -> None:
        serial = waiter.serial = next(self._serials)
        by_channel = self._by_channel
        for name in waiter.query.channels:
            held = by_channel.get(name)
            if held is None:
                held = by_channel[name] = {}
            held[waiter] = None
        heapq.heappush(self._deadlines, (waiter.deadline, serial, waiter))
        self._held += 1

    def discard(self, waiter: Waiter) -> bool:
        """Forget ``waiter`` (e.g. its client went away); False if not held."""
        if not waiter.serial:
            return False
        self._unlink(waiter)
        # Its deadline entry stays until popped: let it hold no connection.
        waiter.target = None
        return True

    def _unlink(self, waiter: Waiter) -> None:
        """Take ``waiter`` off its channels; its deadline entry goes stale."""
        for name in waiter.query.channels:
            held = self._by_channel[name]
            del held[waiter]
            if not held:
                del self._by_channel[name]
        waiter.serial = 0
        self._held -= 1
        heap = self._deadlines
        if len(heap) > 2 * self._held + 1024:  # mostly stale: rebuild from the live ones
            live = [entry for entry in heap if entry[2].serial == entry[1]]
            heapq.heapify(live)
            self._deadlines = live

    def take_matching(self, message: Message) -> list[Waiter]:
        """Remove and return the waiters ``message`` answers."""
        found: dict[Waiter, None] = {}
        for name in message.channels:
            for waiter in self._by_channel.get(name, ()):
                if waiter.query.wants(message):
                    found[waiter] = None
        return self._take(found)

    def take_expired(self, now: int) -> list[Waiter]:
        """Remove and return the waiters whose deadline is at or before ``now``,
        earliest first."""
        due = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, serial, waiter = heapq.heappop(heap)
            if waiter.serial == serial:
                due.append(waiter)
        return self._take(due)

    def take_channel(self, name: str) -> list[Waiter]:
        """Remove and return everyone waiting on ``name`` (it was closed)."""
        return self._take(list(self._by_channel.get(name, ())))

    def take_all(self) -> list[Waiter]:
        """Remove and return every waiter, earliest deadline first."""
        return self._take([w for _, serial, w in sorted(self._deadlines) if w.serial == serial])

    def _take(self, waiters: Iterable[Waiter]) -> list[Waiter]:
        taken = list(waiters)
        for waiter in taken:
            self._unlink(waiter)
        return taken
