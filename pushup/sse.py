"""Server-sent events: a subscribe that stays open (``Accept: text/event-stream``).

An ``EventStream`` is a long poll that re-subscribes itself: each time the
service answers it, it writes one event per message, whose ``id`` is the
cursor just after that message (so a browser's automatic reconnect, sending
``Last-Event-ID``, resumes exactly there), and holds again from the new
cursor. A hold that times out becomes a comment line: the heartbeat that
keeps proxies from closing an idle stream. It parses no HTTP; the client it
writes to is the HTTP front's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Protocol

from pushup.cursor import EMPTY, Cursor
from pushup.hub import Waiter
from pushup.model import Now, Query
from pushup.service import Service

HEARTBEAT_S = 15.0  # well under any proxy's idle timeout (HAProxy's here: 150 s)
_CLOSED_NONE = b'"closed":[]}'


class StreamClient(Protocol):
    """The HTTP front's end of a stream."""

    def send_events(self, data: bytes) -> bool:
        """Write ``data``; False if the client is gone."""

    def end_stream(self) -> None:
        """Close the stream once what was written is sent."""


class EventStream:
    def __init__(self, service: Service, query: Query, client: StreamClient,
                 heartbeat: float = HEARTBEAT_S) -> None:
        self.service = service
        if isinstance(query.since, Now):  # the end as of now, as a long poll's would be
            query = replace(query, since=service.store.end())
        self.query = query
        self.client = client
        self.heartbeat = heartbeat
        self.waiter: Waiter | None = None
        self.stopped = False

    def start(self) -> None:
        self._hold()

    def stop(self) -> None:
        """The client went away: forget its hold."""
        self.stopped = True
        if self.waiter is not None:
            self.service.forget(self.waiter)
            self.waiter = None

    def respond(self, body: bytes, hold: bool = False) -> bool:
        """The service answered the current hold (see ``service.Subscriber``)."""
        self.waiter = None
        if self.stopped:
            return False
        if not self._write(body):
            return False
        if self.service.draining:
            self.client.end_stream()
        else:
            self._hold()
        return True

    def _hold(self) -> None:
        while not self.stopped:
            outcome = self.service.subscribe(self.query, self.heartbeat, self)
            if isinstance(outcome, Waiter):
                self.waiter = outcome
                return
            if not self._write(outcome) or self.service.draining:
                self.client.end_stream()
                return

    def _write(self, body: bytes) -> bool:
        """Events for what is new after the stream's cursor; moves the cursor."""
        query = self.query
        if isinstance(query.since, Cursor):
            base = query.since
        else:
            base = EMPTY  # a time or `now` was resolved; positions start here
        result = self.service.store.query(query)
        wanted = frozenset(query.channels)
        parts: list[bytes] = []
        if result.gap:
            parts.append(b"event: gap\ndata: %s\n\n" % result.cursor.encode().encode())
        cursor = base
        for m in result.messages:
            cursor = cursor.advanced([(m.origin, m.seq)])
            parts.append(b"id: %s\ndata: %s\n\n" % (cursor.encode().encode(), m.json_for(wanted)))
        if not body.endswith(_CLOSED_NONE):
            closed = json.loads(body).get("closed", [])
            if closed:
                parts.append(b"event: closed\ndata: %s\n\n" % json.dumps(closed).encode())
        if not parts:
            parts.append(b": keep-alive\n\n")
        self.query = replace(query, since=result.cursor)
        return self.client.send_events(b"".join(parts))
