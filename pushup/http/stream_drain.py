"""Event streams ended spread over a drain window, not all in one second.

At a drain a held long poll is answered at once (its client polls again
elsewhere, as it would after any answer), but an event stream that ends
makes its client reconnect: 10,000 streams ended together are 10,000
reconnects on the neighbours in the same second. ``OpenStreams`` knows a
node's open event streams and, at the drain, gives each its time to end
within ``--drain-window``: one per equal slot of the window, jittered within
its slot and shuffled over the streams, so the ends come at an even rate
and no two nodes' (or restarts') schedules line up. Nothing here reads the
clock or a socket: the streams arm their own timers, randomness is injected.
"""

from __future__ import annotations

from collections.abc import Callable
from random import Random

from pushup.http.sse import EventStream


def end_delays(n: int, window: float, rng: Random) -> list[float]:
    """``n`` delays in ``[0, window)``: one uniformly in each of ``n`` equal
    slots, in a random order (the order streams get them)."""
    slot = window / n if n else 0.0
    delays = [(i + rng.random()) * slot for i in range(n)]
    rng.shuffle(delays)
    return delays


class OpenStreams:
    """The node's open event streams (``add`` each; a stream leaves by its
    ``on_stop``, ``discard``), and their ends spread over a window."""

    def __init__(self) -> None:
        self._open: dict[EventStream, None] = {}  # in the order they opened
        self._on_empty: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, stream: object) -> bool:
        return stream in self._open

    def add(self, stream: EventStream) -> None:
        self._open[stream] = None

    def discard(self, stream: EventStream) -> None:
        self._open.pop(stream, None)
        if not self._open:
            waiting, self._on_empty = self._on_empty, []
            for callback in waiting:
                callback()

    def spread(self, window: float, rng: Random) -> int:
        """Give every open stream its time to end within ``window`` seconds
        (``EventStream.end_within``); how many were given one."""
        streams = list(self._open)
        for stream, delay in zip(streams, end_delays(len(streams), window, rng), strict=True):
            stream.end_within(delay)
        return len(streams)

    def when_empty(self, callback: Callable[[], None]) -> None:
        """``callback()`` once no stream is open (now, if none is)."""
        if self._open:
            self._on_empty.append(callback)
        else:
            callback()
