"""Server-sent events: a subscribe that stays open (``Accept: text/event-stream``).

An ``EventStream`` names its position before anything else (an ``id:``), then
writes one event per message, whose ``id`` is the position just after it, so
an ``EventSource`` that reconnects with ``Last-Event-ID`` resumes exactly
there. It reads history a page at a time (a long poll's ``limit`` and
``--max-response-bytes``) and asks for the next page only once the client has
taken the last one; when nothing is left it holds in the service like a long
poll, and a hold that times out becomes a heartbeat comment. Every step after
the first runs on a later reactor turn. It ends after ``until``, when every
channel it follows is closed, when its token expires, and at drain: at once,
or at the time the drain gives it (``end_within``, the drain window spread by
:mod:`pushup.http.stream_drain`), served as before until then. It parses no
HTTP and reads the clock only through the service.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

from pushup.core.clock import DelayedCall
from pushup.core.cursor import PREFIX, Cursor
from pushup.core.errors import BadRequest, Unauthorized
from pushup.core.hub import Waiter
from pushup.core.model import Now, Query
from pushup.core.service import Delivery, Service
from pushup.core.store import Result
from pushup.http.exchange import error_body
from pushup.http.params import MAX_CURSOR_CHARS

HEARTBEAT_S = 15.0  # well under any proxy's idle timeout (HAProxy's here: 150 s)
HEARTBEAT = b": keep-alive\n"  # no blank line: some readers take one for an empty event
DIGEST_BYTES = 6  # per closed channel in an id: 2**48, no collision among 64 names


def max_event_id(max_channels: int) -> int:
    """The longest id a stream issues: the longest cursor, a dot, and the
    digests of every channel a subscribe may name (base64)."""
    return MAX_CURSOR_CHARS + 1 + (max_channels * DIGEST_BYTES * 4 + 2) // 3


def closed_in(event_id: str) -> frozenset[bytes]:
    """The channels an id says its stream saw closed (digests; see ``digest``);
    400 if that part is not one we issue."""
    if not event_id.startswith(PREFIX):
        return frozenset()
    _, _, tail = event_id[len(PREFIX):].partition(".")
    try:
        raw = base64.b64decode(tail + "=" * (-len(tail) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("Last-Event-ID is not an id this service issued") from None
    return frozenset(raw[i:i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES))


def digest(channel: str) -> bytes:
    return hashlib.blake2b(channel.encode(), digest_size=DIGEST_BYTES).digest()


class StreamClient(Protocol):
    """The HTTP front's end of a stream."""

    def send_events(self, data: bytes) -> bool:
        """Write ``data``; False if the client is gone."""

    def end_stream(self) -> None:
        """End the stream and close once what was written is sent."""

    def when_writable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on a later reactor turn, once the client has taken
        what was written (never if the client goes away first)."""


class EventStream:
    """One open stream. ``closed``: digests of channels a reconnect's id says
    were closed (they are left out and never held on); ``expires``: when the
    subscriber token stops being valid (Unix seconds), if there is one.

    The contract, once ``start`` is called (once):

    - The first event names the position (``event: cursor``, or
      ``event: gap`` if history from a ``since`` time is already partly
      evicted); every message event's ``id`` is the position just after it,
      and every id carries the channels this stream saw closed.
    - Every message after the position on the stream's channels is sent, in
      the store's order, once; a page at a time, the next only once the client
      has taken the last (``StreamClient.when_writable``). A gap in history is
      said (``event: gap``) where it falls.
    - With nothing to send it holds in the service (as a long poll of
      ``heartbeat`` seconds, at most until just after ``until``); a hold
      that times out sends a heartbeat comment.
    - It ends, once, with ``end_stream``: after ``event: end`` when ``until``
      is past and nothing before it is left; after ``event: closed`` once
      every channel it follows is closed; after ``event: expired`` when the
      token expires; after a last ``event: cursor`` at the drain (at once,
      or ``end_within``'s delay after it, until when it is served as before).
    - ``stop`` (the client went away, or the stream ended) is final and may
      be called more than once: the hold and the expiry timer are forgotten,
      nothing more is written.
    - Messages sent are counted in ``counters.delivered`` once each.
    - ``on_stop`` is called once, at the first ``stop``.
    """

    def __init__(self, service: Service, query: Query, client: StreamClient, *,
                 closed: frozenset[bytes] = frozenset(), expires: float | None = None,
                 heartbeat: float = HEARTBEAT_S,
                 on_stop: Callable[[EventStream], None] | None = None) -> None:
        self.service = service
        self.client = client
        self.heartbeat = heartbeat
        self.closed = [name for name in query.channels if digest(name) in closed]
        channels = tuple(name for name in query.channels if name not in self.closed)
        self._gap = False  # a time's history is already partly evicted: said at once
        self.query = replace(query, channels=channels, since=self._position(query, channels))
        self.waiter: Waiter | None = None
        self.stopped = False
        self._expires = expires
        self._expiry: DelayedCall | None = None
        self._on_stop = on_stop
        # a drain's time to end this stream (end_within): served as before until then
        self._lingering = False
        self._linger: DelayedCall | None = None

    def _position(self, query: Query, channels: tuple[str, ...]) -> Cursor:
        """``since`` as a cursor: ``now`` is the end; a time is the cursor just
        before the first message after it (what a ``limit=0`` page claims)."""
        if isinstance(query.since, Cursor):
            return query.since
        if isinstance(query.since, Now):
            return self.service.store.end(channels)
        first = self.service.read(replace(query, channels=channels, until=None, limit=0))
        self._gap = first.gap
        return first.cursor

    @property
    def cursor(self) -> Cursor:
        assert isinstance(self.query.since, Cursor)
        return self.query.since

    def has_nothing_to_send(self) -> bool:
        """Whether this stream would end at once with nothing to say: every
        channel it names was closed, or ``until`` is past and nothing before
        it is left. (The HTTP front answers such a request 204, which stops
        an ``EventSource`` for good.)"""
        if not self.query.channels:
            return True
        until = self.query.until
        if until is None or until >= self.service.now():
            return False
        result = self.service.read(self.query)
        return not (result.messages or result.gap)

    def start(self) -> None:
        """Name the position, then stream from a later turn on."""
        if self._expires is not None:
            delay = max(0.0, self._expires - self.service.clock.seconds())
            self._expiry = self.service.clock.callLater(delay, self._expire)
        if self._gap:
            cursor = self.cursor.encode().encode()
            self.client.send_events(self._mark(b"gap", self.cursor, cursor))
        else:
            self.client.send_events(self._mark(b"cursor", self.cursor))
        self.client.when_writable(self._step)

    def stop(self) -> None:
        """The client went away: forget its hold and its timers."""
        first = not self.stopped
        self.stopped = True
        self._forget_waiter()
        for timer in (self._expiry, self._linger):
            if timer is not None and timer.active():
                timer.cancel()
        self._expiry = self._linger = None
        self._lingering = False
        if first and self._on_stop is not None:
            self._on_stop(self)

    def end_within(self, delay: float) -> None:
        """The node drains: end this stream ``delay`` seconds from now, as a
        drain ends it (a last ``event: cursor``), serving it as before until
        then. Call it before ``Service.drain``, which keeps the stream held
        when it is ``lingering``."""
        if self.stopped or self._lingering:
            return
        self._lingering = True
        self._linger = self.service.clock.callLater(delay, self._drained)

    @property
    def lingering(self) -> bool:
        """Whether a drain lets this stream live on until its time (``end_within``)."""
        return self._lingering

    def _ends_at_drain(self) -> bool:
        return self.service.draining and not self._lingering

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        """The service answered the current hold (see ``service.Subscriber``):
        with messages, a timeout, closed channels or the drain.

        ``delivery.result`` answers this stream's own query, so it is the
        next page as it is (the service counted its messages)."""
        self.waiter = None
        if self.stopped:
            return False
        closed = delivery.closed
        if closed:
            self._drop(closed)
        page = self._events(delivery.result)
        if closed:
            page.append(self._mark(b"closed", self.cursor, json.dumps(closed).encode()))
        if self._ends_at_drain() or not self.query.channels:
            if self._ends_at_drain():
                page.append(self._mark(b"cursor", self.cursor))
            self._finish(page)
        elif self.client.send_events(b"".join(page) or HEARTBEAT):
            self.client.when_writable(self._step)
        return True

    # -- the steps -----------------------------------------------------------

    def _step(self) -> None:
        """One page if there is one (the next on a later turn), else hold."""
        if self.stopped:
            return
        page = self._page()
        if page:
            if self.client.send_events(b"".join(page)):
                self.client.when_writable(self._step)
            return
        until = self.query.until
        now = self.service.now()
        if self._ends_at_drain():
            self._finish([self._mark(b"cursor", self.cursor)])
            return
        if until is not None and until < now:
            self._finish([self._mark(b"end", self.cursor, b'"until"')])
            return
        timeout = self.heartbeat
        if until is not None:  # wake just after until, to end the stream
            timeout = min(timeout, (until + 1 - now) / 1e6)
        outcome = self.service.subscribe(self.query, timeout, self,
                                         through_drain=self._lingering)
        if isinstance(outcome, Waiter):
            self.waiter = outcome
        else:  # answered at once (the drain began, or until passed): see next turn
            self.client.when_writable(self._step)

    def _page(self) -> list[bytes]:
        """Events for the next page of what follows the cursor; moves it."""
        result = self.service.read(self.query)
        self.service.counters.delivered += len(result.messages)
        return self._events(result)

    def _events(self, result: Result) -> list[bytes]:
        """Events for ``result``, the page that follows the cursor; moves it.

        A closed channel left the query already: messages are listed with
        the channels the stream still follows."""
        if not (result.messages or result.gap):
            return []
        wanted = frozenset(self.query.channels)
        parts: list[bytes] = []
        position = self.cursor
        if result.gap:  # said at the position before this page's messages
            parts.append(self._mark(b"gap", position if result.messages else result.cursor,
                                    result.cursor.encode().encode()))
        for m in result.messages:
            position = position.advanced([(m.origin, m.seq)])
            parts.append(b"id: %s\ndata: %s\n\n" % (self._id(position), m.json_for(wanted)))
        self.query = replace(self.query, since=result.cursor)
        return parts

    def _drop(self, names: Iterable[str]) -> None:
        """Closed channels leave the query for good (holding on one would re-create it)."""
        for name in names:
            if name in self.query.channels and name not in self.closed:
                self.closed.append(name)
        self.query = replace(self.query, channels=tuple(
            name for name in self.query.channels if name not in self.closed))

    def _drained(self) -> None:
        """The drain's time for this stream: what is left of a page, the
        position, the end (a reconnect elsewhere resumes from there)."""
        self._linger = None
        self._lingering = False
        if self.stopped:
            return
        self._forget_waiter()
        self._finish([*self._page(), self._mark(b"cursor", self.cursor)])

    def _forget_waiter(self) -> None:
        """No longer held for the next message (if it was)."""
        if self.waiter is not None:
            self.service.forget(self.waiter)
            self.waiter = None

    def _expire(self) -> None:
        self._expiry = None
        if self.stopped:
            return
        self._forget_waiter()
        why = error_body(Unauthorized("the subscribe token has expired"))
        self._finish([self._mark(b"expired", self.cursor, why)])

    def _finish(self, parts: list[bytes]) -> None:
        if parts:
            self.client.send_events(b"".join(parts))
        # ended before ``stop`` tells ``on_stop``: the last stream's end may
        # let the drain close every connection there and then
        self.client.end_stream()
        self.stop()

    # -- rendering -----------------------------------------------------------

    def _id(self, cursor: Cursor) -> bytes:
        """A cursor, and after a dot the channels this stream saw closed."""
        text = cursor.encode().encode()
        if not self.closed:
            return text
        digests = b"".join(digest(name) for name in self.closed)
        return text + b"." + base64.urlsafe_b64encode(digests).rstrip(b"=")

    def _mark(self, event: bytes, cursor: Cursor, data: bytes | None = None) -> bytes:
        """A named event carrying the position (``data`` defaults to the id)."""
        ident = self._id(cursor)
        return b"event: %s\nid: %s\ndata: %s\n\n" % (event, ident, ident if data is None else data)

