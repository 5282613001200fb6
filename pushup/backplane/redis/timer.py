"""A deadline on Redis's answer, counted in this node's own time: ``NodeTimer``.

The rule: a command's timeout means "Redis did not answer", never "this node was
too busy to read the answer", so a reactor turn in which the node was behind counts
once, and the sockets are read once more before the deadline is called. It sends
nothing and knows no command (client.py and interest.py arm it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SLICES = 8  # a NodeTimer counts its time in this many timed calls, one after the other
# A timed call armed by a timed call runs after the reactor's next I/O pass (Twisted
# inserts it at the next runUntilCurrent, and polls with no wait first): 0 would do on a
# real reactor; 1 ms keeps that order on a task.Clock, which runs a call due now within
# the same advance.
IO_PASS = 0.001


class NodeTimer:
    """Call ``expire()`` after ``seconds`` of this node's own time, and after one more
    I/O pass: what a deadline on Redis's answer must count.

    The time is counted in ``SLICES`` timed calls, each armed when the one before ran,
    so a reactor turn in which the node was behind (its own queue of work, its CPU
    budget spent) counts as one slice however long it lasted. When the last slice has
    run, the reactor reads its sockets once more before ``expire``: Twisted runs the
    timed calls of a turn before it polls, so an answer that came while the node was
    busy sits unread when the timer is due. ``progress()``, if given, is sampled before
    that pass: while it changes over a pass (bytes from Redis are still coming in),
    another pass is granted, ``SLICES`` at most. ``active()``/``cancel()`` as an
    ``IDelayedCall``'s; ``cancel`` is a no-op once it has expired.
    """

    def __init__(self, clock: Any, seconds: float, expire: Callable[[], object], *,
                 progress: Callable[[], object] | None = None) -> None:
        self._clock = clock
        self._slice = seconds / SLICES
        self._slices_left = SLICES
        self._passes_left = SLICES
        self._expire = expire
        self._progress = progress
        self._seen: object = None
        self._call: Any = clock.callLater(self._slice, self._tick)

    def active(self) -> bool:
        return self._call is not None

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def _tick(self) -> None:
        self._slices_left -= 1
        if self._slices_left > 0:
            self._call = self._clock.callLater(self._slice, self._tick)
            return
        self._seen = self._progress() if self._progress is not None else None
        self._call = self._clock.callLater(IO_PASS, self._after_pass)

    def _after_pass(self) -> None:
        self._passes_left -= 1
        if self._progress is not None and self._passes_left > 0:
            now = self._progress()
            if now != self._seen:
                self._seen = now
                self._call = self._clock.callLater(IO_PASS, self._after_pass)
                return
        self._call = None
        self._expire()
