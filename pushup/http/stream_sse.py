"""A Durable Stream read as server-sent events (``live=sse``, protocol §5.8).

A ``Feed`` writes a ``data`` event per read (text as it is, JSON as an array,
other types in base64), each followed by its ``control`` event (the next
offset, the cursor, up-to-date, closed), then holds on the stream until it
grows. It ends once the stream is closed and sent whole, deleted, when the
node drains, or after ``SSE_LIFETIME_S``. It parses no HTTP; time is the
injected clock's.

A ``WholeEvents`` stands between the front and an event stream another node
serves (the mesh hands it on): it writes it to the reader only up to the end
of its last whole control event, so the reader holds each data event with its
control event, as a ``Feed`` writes them, wherever the relaying node's reads
of the serving node fell.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Protocol

from pushup.core.clock import Clock, DelayedCall
from pushup.core.model import dumps
from pushup.core.stream import Stream
from pushup.core.stream_values import JSON_TYPE, Position, media_type
from pushup.http import stream_headers as h

# How much of another node's event stream ``WholeEvents`` holds back at most, in
# read budgets: one data event of a budget's text, all line ends (each byte a
# "data:" line of its own), and its control event. Past it, written as it is.
EVENT_BOUND_BUDGETS = 6
SSE_LIFETIME_S = 60.0  # an SSE response ends after this (protocol §10.2), the client resumes
_LINES = re.compile(rb"\r\n|\r|\n")
Headers = tuple[tuple[bytes, bytes], ...]


class StreamClient(Protocol):
    """The HTTP front's end of an SSE response (``protocol.HTTPProtocol``)."""

    def open_stream(self, content_type: bytes = ..., fields: Headers = ...) -> None: ...

    def send_events(self, data: bytes) -> bool: ...

    def end_stream(self) -> None: ...

    def when_writable(self, callback: Callable[[], None]) -> None: ...


class Feed:
    """One SSE response: a ``data`` event per read, each followed by its
    ``control`` event, then held on the stream until it grows; it ends once
    the stream is closed and sent whole, deleted, or after ``SSE_LIFETIME_S``."""

    def __init__(self, stream: Stream, at: Position, client: StreamClient, *,
                 clock: Clock, budget: int, cursor: Callable[[], str],
                 draining: Callable[[], bool], fields: Headers) -> None:
        """``budget``: the most bytes of one ``data`` event; ``cursor``: the
        next ``streamCursor``; ``draining``: whether the node stops (the
        response then ends); ``fields``: headers besides SSE's own."""
        self.stream = stream
        self.at = at
        self.client = client
        self.clock = clock
        self.budget = budget
        self.cursor = cursor
        self.draining = draining
        self.fields = fields
        kind = media_type(stream.content_type)
        self.base64 = not (kind.startswith("text/") or kind == JSON_TYPE)
        self.ended = False
        self.sent_control = False
        self.timer: DelayedCall | None = None

    def start(self) -> None:
        fields = ((h.CACHE_CONTROL, b"no-cache"), *self.fields,
                  *(((h.SSE_DATA_ENCODING, b"base64"),) if self.base64 else ()))
        self.client.open_stream(b"text/event-stream", fields)
        self.timer = self.clock.callLater(SSE_LIFETIME_S, self.end)
        self.pump()

    def pump(self) -> None:
        if self.ended:
            return
        stream = self.stream
        if stream.deleted:
            self.end()
            return
        read = stream.read(self.at, self.budget)
        has_data = bool(read.data or read.messages)
        final = stream.closed and read.up_to_date and read.next == stream.tail
        events = b""
        if has_data:
            payload = (b"[" + b",".join(read.messages) + b"]" if read.messages is not None
                       else base64.b64encode(read.data) if self.base64 else read.data)
            lines = _LINES.split(payload.decode("utf-8", "replace").encode())
            # "data:" then the line; a space between only before a line that
            # begins with one (a reader drops one space after the colon)
            events = b"event: data\n" + b"".join(
                (b"data: " if line[:1] == b" " else b"data:") + line + b"\n"
                for line in lines) + b"\n"
        if has_data or not self.sent_control or final:
            self.at = read.next
            events += self._control(read.next, read.up_to_date, final)
        if events:
            # one write: a reader never holds a data event without its control
            # event (a data line may read "event: control" and fool one that
            # stops at the first blank line after it, as the suite's does)
            self.client.send_events(events)
        if final or self.draining():
            self.end()
        elif not read.up_to_date:
            self.client.when_writable(self.pump)
        else:
            stream.wait(self.pump)

    def _control(self, after: Position, up_to_date: bool, final: bool) -> bytes:
        self.sent_control = True
        control: dict[str, object] = {"streamNextOffset": after.offset}
        if final:
            control["streamClosed"] = True
            control["upToDate"] = True
        else:
            control["streamCursor"] = self.cursor()
            if up_to_date:
                control["upToDate"] = True
        return b"event: control\ndata:" + dumps(control) + b"\n\n"

    def end(self) -> None:
        if not self.ended:
            self.stop()
            self.client.end_stream()

    def stop(self) -> None:
        """The client went (or we end): forget the hold and the timer."""
        self.ended = True
        self.stream.stop_waiting(self.pump)
        if self.timer is not None and self.timer.active():
            self.timer.cancel()



class WholeEvents:
    """The front's end of an event stream another node serves, written to
    the reader (``client``) only up to the end of its last whole control
    event; the rest waits for the next piece. Each write of a ``Feed`` ends
    with a control event, so the reader gets them as the serving node wrote
    them, not where the relaying node's reads cut them (a reader that stops
    at the first blank line after a line ``event: control``, which a data
    line may hold, then never holds a data event without its control
    event). At most ``bound`` bytes wait; past that they are written as they
    are. ``end_stream`` writes what waits first."""

    def __init__(self, client: StreamClient, bound: int) -> None:
        self.client = client
        self.bound = bound
        self.waiting = b""
        self.scanned = 0  # where in ``waiting`` the first event not yet whole begins

    def open_stream(self, content_type: bytes = b"text/event-stream",
                    fields: Headers = ()) -> None:
        self.client.open_stream(content_type, fields)

    def send_events(self, data: bytes) -> bool:
        """Write what ``data`` completes; False if the client is gone (True
        while all of it waits: the client is asked at the next write)."""
        held = self.waiting + data if self.waiting else data
        cut = self._through_last_control(held)
        if not cut:
            if len(held) <= self.bound:
                self.waiting = held
                return True
            cut = self.scanned = len(held)
        self.waiting = held[cut:]
        self.scanned -= cut
        return self.client.send_events(held[:cut])

    def _through_last_control(self, held: bytes) -> int:
        """The end of the last whole control event in ``held`` (0: none);
        moves ``scanned`` past the whole events."""
        at, cut = self.scanned, 0
        while (end := held.find(b"\n\n", at)) >= 0:
            if held.startswith(b"event: control\n", at):
                cut = end + 2
            at = end + 2
        self.scanned = at
        return cut

    def end_stream(self) -> None:
        if self.waiting:
            self.client.send_events(self.waiting)
            self.waiting = b""
        self.client.end_stream()

    def when_writable(self, callback: Callable[[], None]) -> None:
        self.client.when_writable(callback)
