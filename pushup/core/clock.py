"""The core's one clock: what it reads the time from and sets timers on.

The clock is injected, never imported: Twisted's ``IReactorTime`` (the reactor
in a running node, ``task.Clock`` in tests), typed here as ``Clock`` with only
the two methods the core and the HTTP front use. The clock speaks float
seconds; the core's timestamps and deadlines are integer microseconds, and
:func:`micros` is the one conversion between them. Every module of ``core``
and ``http`` that reads a clock takes it as a ``Clock`` from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

MICROS_PER_SECOND = 1_000_000


class DelayedCall(Protocol):
    """What ``Clock.callLater`` returns (Twisted's ``IDelayedCall``, as far as we use it)."""

    def active(self) -> bool: ...

    def cancel(self) -> None: ...

    def getTime(self) -> float: ...  # Twisted's


class Clock(Protocol):
    """The injected clock: Twisted's ``IReactorTime`` (the reactor, or ``task.Clock``)."""

    def seconds(self) -> float: ...

    def callLater(self, delay: float, f: Callable[..., object], /,  # Twisted's
                  *args: object) -> DelayedCall: ...


def micros(seconds: float) -> int:
    """A time or duration in the clock's seconds, as the core's integer microseconds."""
    return round(seconds * MICROS_PER_SECOND)


class Alarm:
    """One timer that fires ``callback(deadline)`` no later than asked."""

    def __init__(self, clock: Clock, callback: Callable[[int], None]) -> None:
        self._clock = clock
        self._callback = callback
        self._call: DelayedCall | None = None
        self._at = 0

    def set(self, deadline: int | None, now: int) -> None:
        """Fire at ``deadline`` (µs) unless already due earlier; None disarms."""
        call = self._call
        if call is not None and call.active():
            if deadline is not None and self._at <= deadline:
                return
            call.cancel()
        self._call = None
        if deadline is not None:
            self._at = deadline
            self._call = self._clock.callLater(max(0, deadline - now) / MICROS_PER_SECOND,
                                               self._fire)

    def _fire(self) -> None:
        self._call = None
        self._callback(self._at)
