"""A Durable Stream read as server-sent events (``live=sse``, protocol §5.8).

A ``Feed`` writes a ``data`` event per read (text as it is, JSON as an array,
other types in base64), each followed by its ``control`` event (the next
offset, the cursor, up-to-date, closed), then holds on the stream until it
grows. It ends once the stream is closed and sent whole, deleted, when the
node drains, or after ``SSE_LIFETIME_S``. It parses no HTTP; time is the
injected clock's.
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

