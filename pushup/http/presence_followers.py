"""The polls and streams presence counts, and those that follow it (``presence=1``).

A ``Counted`` poll is counted while held; a ``Poll`` that follows presence is
answered at once when membership changed since its position (else held, and
woken by the desk when a change comes), its answer rendered with its
``presence`` list; a ``Stream`` is an event stream's client, counted while
open, that sends ``event: presence`` for each change of its channels when it
follows. Each tells the desk (:mod:`pushup.http.presence`) once when it
ends. Nothing here reads a socket or the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from pushup.core.cursor import Cursor
from pushup.core.hub import Waiter
from pushup.core.model import Now, Query, dumps
from pushup.core.roster import Event, Roster
from pushup.core.service import Delivery, Service
from pushup.http.exchange import Response
from pushup.http.sse import StreamClient


class Who:
    """Who a subscribe is: its user and info (from the token, or ``user=``
    on a node without subscriber tokens) and the key its subscription is
    counted under (None: recognisable by nothing, counted while held only)."""

    __slots__ = ("info", "key", "user")

    def __init__(self, key: str | None, user: str | None, info: str | None) -> None:
        self.key = key
        self.user = user
        self.info = info


ANONYMOUS = Who(None, None, None)  # most polls: nobody asked for presence


class PresenceDesk(Protocol):
    """The desk (pushup.http.presence.PresenceDesk), as its polls and streams use it."""

    service: Service
    roster: Roster
    polls: dict[str, set[Poll]]  # presence=1 polls held, by channel
    streams: dict[str, set[Stream]]  # presence=1 streams, by channel

    def release(self, who: Who, channels: tuple[str, ...]) -> None: ...

    def position(self, cursor: Cursor | int | Now) -> tuple[Cursor | int | Now, int | None,
                                                          dict[str, int]]: ...

    def render(self, delivery: Delivery, events: list[Event],
               held: dict[str, int]) -> bytes: ...


class HeldAnswer(Protocol):
    """What a ``presence=1`` poll is answered through (the HTTP protocol)."""

    def respond(self, delivery: Delivery, hold: bool = False) -> bool: ...

    def answer_held(self, response: Response) -> bool: ...


def member_json(user: str, info: str | None) -> bytes:
    head = b'{"user":' + dumps(user)
    return head + (b"}" if info is None else b',"info":' + info.encode() + b"}")


def event_json(event: Event) -> bytes:
    """``{"channel":…,"event":"member_added","user":…,"info":{…}}`` (info when there is one)."""
    assert event.user is not None
    head = b'{"channel":' + dumps(event.channel) + b',"event":"' + event.name.encode() + b'"'
    return head + b"," + member_json(event.user, event.info)[1:]


class Counted:
    """A long poll that does not follow presence: counted while it is held."""

    __slots__ = ("channels", "client", "desk", "done", "waiter", "who")

    def __init__(self, desk: PresenceDesk, client: HeldAnswer, who: Who,
                 channels: tuple[str, ...]) -> None:
        self.desk = desk
        self.client = client
        self.who = who
        self.channels = channels
        self.waiter: Waiter | None = None
        self.done = False

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        if not self.done:
            self.done = True
            self.desk.release(self.who, self.channels)
        return self.client.respond(delivery, hold)

    def gone(self) -> None:
        if self.waiter is not None:
            self.desk.service.forget(self.waiter)
            self.waiter = None
        self.end()

    def end(self) -> None:
        if not self.done:
            self.done = True
            self.desk.release(self.who, self.channels)


class Poll:
    """One long poll, counted while held (and for the window after)."""

    def __init__(self, desk: PresenceDesk, client: HeldAnswer, who: Who,
                 query: Query, timeout: float, follow: bool) -> None:
        self.desk = desk
        self.client = client
        self.who = who
        self.follow = follow
        self.timeout = timeout
        since, self.seq, self.held = desk.position(query.since)
        self.query = query if since is query.since else replace(query, since=since)
        self.waiter: Waiter | None = None
        self.done = False

    def start(self) -> Delivery | Waiter | bytes:
        service = self.desk.service
        if self.follow:
            events = self.desk.roster.since(self.query.channels, self.seq)
            if events:
                query = self._resolved()
                self._end()
                return self.desk.render(Delivery(query, service.read(query)), events,
                                        self.held)
        outcome = service.subscribe(self.query, self.timeout, self)
        if isinstance(outcome, Delivery):
            self._end()
            if self.follow:
                return self.desk.render(outcome, [], self.held)
            return outcome
        self.waiter = outcome
        self.query = outcome.query  # since=now resolved
        if self.follow:
            for name in self.query.channels:
                self.desk.polls.setdefault(name, set()).add(self)
        return outcome

    def _resolved(self) -> Query:
        if isinstance(self.query.since, Now):
            return replace(self.query, since=self.desk.service.store.end(self.query.channels))
        return self.query

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        """The service answers (see ``service.Subscriber``)."""
        self.waiter = None
        self._end()
        if not self.follow:
            return self.client.respond(delivery, hold)
        events = self.desk.roster.since(self.query.channels, self.seq)
        return self.client.answer_held(
            Response(200, self.desk.render(delivery, events, self.held)))

    def wake(self) -> None:
        """The roster changed on a channel of this held ``presence=1`` poll."""
        if self.waiter is None or self.done:
            return
        self.desk.service.forget(self.waiter)
        self.respond(Delivery(self.query, self.desk.service.read(self.query)))

    def gone(self) -> None:
        """The client went away before its answer."""
        if self.waiter is not None:
            self.desk.service.forget(self.waiter)
            self.waiter = None
        self._end()

    def _end(self) -> None:
        if self.done:
            return
        self.done = True
        if self.follow:
            for name in self.query.channels:
                held = self.desk.polls.get(name)
                if held is not None:
                    held.discard(self)
                    if not held:
                        del self.desk.polls[name]
        self.desk.release(self.who, self.query.channels)


class Stream:
    """An event stream's client, counted while it is open; with ``follow``,
    it is sent each membership change of its channels as ``event: presence``
    (all of them as they stand first)."""

    def __init__(self, desk: PresenceDesk, client: StreamClient, who: Who,
                 channels: tuple[str, ...], follow: bool) -> None:
        self.desk = desk
        self.client = client
        self.who = who
        self.channels = channels
        self.follow = follow
        self.seq: int | None = None
        self.done = False
        if follow:
            for name in channels:
                desk.streams.setdefault(name, set()).add(self)

    def send_since(self) -> None:
        if self.done:
            return
        events = self.desk.roster.since(self.channels, self.seq)
        self.seq = self.desk.roster.seq
        if events and not self.client.send_events(b"".join(
                b"event: presence\ndata: " + event_json(e) + b"\n\n" for e in events)):
            self.end()

    def send_events(self, data: bytes) -> bool:
        first = self.follow and self.seq is None
        sent = self.client.send_events(data)
        if first and sent:  # after the stream names its position
            self.send_since()
        return sent

    def end_stream(self) -> None:
        self.end()
        self.client.end_stream()

    def when_writable(self, callback: Callable[[], None]) -> None:
        self.client.when_writable(callback)

    def end(self) -> None:
        """The stream ended (or its client went): once."""
        if self.done:
            return
        self.done = True
        for name in self.channels:
            held = self.desk.streams.get(name)
            if held is not None:
                held.discard(self)
                if not held:
                    del self.desk.streams[name]
        self.desk.release(self.who, self.channels)

