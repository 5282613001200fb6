"""Flow control on one HTTP connection: how far reading runs ahead of the
answers, whether the client takes what is written, and the connection's timer.

Reading pauses once ``PIPELINE_BYTES`` of requests are read ahead of the one
being answered, and resumes once they are answered. The transport tells
(Twisted's push-producer calls) when the client stops taking output; from then
``send_timeout`` runs, and an event stream's next page waits until it takes it
again. One timer per connection, armed for the earliest deadline. ``Flow``
keeps that state for its ``HTTPProtocol``, which decides what a deadline
means: nothing here parses or writes HTTP.
"""

from __future__ import annotations

from collections.abc import Callable

from pushup.core.clock import Clock, DelayedCall
from pushup.http.seams import Connection

PIPELINE_BYTES = 64 * 1024  # requests read ahead of the one being answered


class Flow:
    """One connection's flow: reading paused for read-ahead, output not taken
    since ``blocked_since``, a stream waiting to write, and the timer that
    calls ``on_timer`` (at most one armed, at the earliest deadline asked)."""

    def __init__(self, clock: Clock, on_timer: Callable[[], None]) -> None:
        self._clock = clock
        self._on_timer = on_timer
        self.input_paused = False  # read-ahead past PIPELINE_BYTES: resumed once answered
        self.blocked_since: float | None = None  # output not taken by the client
        self._on_writable: Callable[[], None] | None = None  # a stream waits for the client
        self._timer: DelayedCall | None = None

    # -- reading ahead -----------------------------------------------------------

    def read_ahead(self, queued_bytes: int, conn: Connection) -> None:
        """Pause reading if ``queued_bytes`` of requests wait for their answers."""
        if queued_bytes > PIPELINE_BYTES and not self.input_paused:
            self.input_paused = True
            conn.pauseProducing()  # read on once the queue is answered

    def read_on(self, conn: Connection) -> None:
        """Every request read is answered: resume reading if it was paused."""
        if self.input_paused:
            self.input_paused = False
            conn.resumeProducing()

    # -- output the client takes ---------------------------------------------------

    def output_blocked(self, send_timeout: float) -> None:
        """The client stopped taking output: it has ``send_timeout`` to take it."""
        if self.blocked_since is None:
            self.blocked_since = self._clock.seconds()
            self.arm(self.blocked_since + send_timeout)

    def output_taken(self, closing: bool, writable: Callable[[Callable[[], None]], None],
                     ) -> None:
        """The client takes output again: a stream waiting writes on a later
        turn (through ``writable``); a ``closing`` connection's output left
        has ``send_timeout`` again."""
        self.blocked_since = self._clock.seconds() if closing else None
        if self._on_writable is not None:  # an event stream's next page
            callback, self._on_writable = self._on_writable, None
            self._clock.callLater(0, writable, callback)

    def when_writable(self, callback: Callable[[], None],
                      writable: Callable[[Callable[[], None]], None]) -> None:
        """``writable(callback)`` on a later turn, once the transport has taken
        what was written; never if it does not."""
        if self.blocked_since is None:
            self._clock.callLater(0, writable, callback)
        else:
            self._on_writable = callback

    def closing(self, send_timeout: float) -> None:
        """The connection closes once its output is taken: within ``send_timeout``."""
        if self.blocked_since is None:
            self.blocked_since = self._clock.seconds()
        self.arm(self.blocked_since + send_timeout)

    # -- the timer -----------------------------------------------------------------

    def arm(self, at: float) -> None:
        """Make sure the timer fires no later than ``at``."""
        timer = self._timer
        if timer is not None and timer.active():
            if timer.getTime() <= at:
                return
            timer.cancel()
        clock = self._clock
        self._timer = clock.callLater(max(0.0, at - clock.seconds()), self._fire)

    def arm_unless_armed(self, at: float) -> None:
        """Arm for ``at`` unless a deadline is armed already (or firing)."""
        if self._timer is None:
            self.arm(at)

    def stop(self) -> None:
        """Disarm the timer: it calls nothing more until armed again."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def lost(self) -> None:
        """The connection is gone: disarm, and let go of ``on_timer`` (the
        protocol's own method: held, it would keep the protocol in a cycle
        only a full collection frees)."""
        self.stop()
        self._on_timer = _nothing
        self._on_writable = None

    def _fire(self) -> None:
        self._timer = None
        self._on_timer()


def _nothing() -> None:
    """A lost connection's timer: it calls nothing."""
