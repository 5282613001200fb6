"""A Durable Stream's held long polls (``live=long-poll``): held by where they
wait, answered together.

Every poll held at one offset of one stream that asks alike (the same
``cursor`` and ``If-None-Match``) waits in one ``Group``, which is one waiter
of the stream: the append that wakes it has one answer built, and every poll
of the group gets that answer through its connection (``answer_held``: the
same bytes, rendered once), as a fan-out of ``/subscribe`` answers its
subscribers. Timeouts are data, as the hub's: one heap of deadlines under one
``Alarm``, so a held poll costs no timer of the reactor. A poll whose client
leaves is forgotten at once (``Held.cancel``), in O(1), and its connection
with it; no poll or group is ever in a reference cycle, so what one leaves
is freed by reference counting, not by a full collection a serving node
almost never runs (``cli.tune_gc``). What a group is answered is its
owner's (:mod:`pushup.http.streams`) to say. It parses no HTTP; time is the
injected clock's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

from twisted.internet import defer

from pushup.core.clock import Alarm, Clock, micros
from pushup.core.stream import Stream
from pushup.core.stream_values import Position
from pushup.http.exchange import Held, Response

GroupKey = tuple[str, Position, str | None, bytes | None]


class HeldClient(Protocol):
    """The connection of a held poll (``protocol.HTTPProtocol``)."""

    def answer_held(self, response: Response) -> bool:
        """Answer the held request; False if it is not held any more."""


class Later:
    """A held poll answered through a Deferred (``Pending``), for a read whose
    ``Held`` would reach its connection only later (``--engine redis``: after
    Redis answers), so an append meanwhile is not lost; its client's leaving
    is not seen (the poll is answered into the closed connection)."""

    def __init__(self) -> None:
        self.answer: defer.Deferred[Response | Held] = defer.Deferred()

    def answer_held(self, response: Response) -> bool:
        if self.answer.called:
            return False
        self.answer.callback(response)
        return True


class Poll:
    """One held long poll: answered once, by its group's wake-up or its
    deadline, or forgotten when its client leaves. Once it is held no more
    it lets go of its group and its client (``group`` and ``client`` None):
    the deadline heap may keep its entry a while, never its connection."""

    __slots__ = ("client", "deadline", "group", "owner")

    def __init__(self, owner: LongPolls, group: Group, client: HeldClient,
                 deadline: int) -> None:
        self.owner = owner
        self.group: Group | None = group
        self.client: HeldClient | None = client
        self.deadline = deadline

    def cancel(self) -> None:
        """The client left (the front calls this: ``Held.cancel``)."""
        if self.group is not None:
            self.owner.let_go(self)


class Group:
    """The polls held at ``at`` of ``stream`` that ask alike; one waiter of the
    stream (``wake``) while any of them is held.

    Its polls are a dict, so one leaves in O(1) however many share the
    group. The waiter is the bound method ``wake``, made when it is handed to
    the stream and never kept here: a group is in no reference cycle, and is
    freed by reference counting once forgotten (a serving node's collector
    almost never runs the full collection a cycle would wait for: ``cli.tune_gc``)."""

    __slots__ = ("at", "cursor", "if_none_match", "key", "owner", "polls", "stream")

    def __init__(self, owner: LongPolls, key: GroupKey, stream: Stream, at: Position,
                 cursor: str | None, if_none_match: bytes | None) -> None:
        self.owner = owner
        self.key = key
        self.stream = stream
        self.at = at
        self.cursor = cursor
        self.if_none_match = if_none_match
        self.polls: dict[Poll, None] = {}  # held now, in the order they came

    def wake(self) -> None:
        """The stream grew, closed or went (one of its ``waiters``)."""
        self.owner.woken(self)


class LongPolls:
    """Every long poll this node holds on its streams.

    ``answer_for(group)``: what the group's polls are answered now that their
    stream was woken, or None to hold them on; ``caught_up(group)``: the 204
    a poll of it gets at its deadline."""

    def __init__(self, clock: Clock, answer_for: Callable[[Group], Response | None],
                 caught_up: Callable[[Group], Response]) -> None:
        self._clock = clock
        self._answer_for = answer_for
        self._caught_up = caught_up
        self._groups: dict[GroupKey, Group] = {}
        # (deadline, serial, poll): a heap, with the entries of polls held no
        # more too until they come up, or until they outnumber the held ones
        # (then the heap is rebuilt without them: amortized O(1) a poll)
        self._deadlines: list[tuple[int, int, Poll]] = []
        self._serial = 0
        self._alarm = Alarm(clock, self._expire)
        self.held = 0  # polls held now (/stats ``stream_long_polls``)

    def hold(self, client: HeldClient, stream: Stream, at: Position, cursor: str | None,
             if_none_match: bytes | None, seconds: float) -> Held:
        """A poll held at ``at`` until the stream grows, closes or goes (its
        group's answer), or ``seconds`` pass (``caught_up``)."""
        key = (stream.uid, at, cursor, if_none_match)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(self, key, stream, at, cursor, if_none_match)
            stream.wait(group.wake)
        now = micros(self._clock.seconds())
        poll = Poll(self, group, client, now + micros(seconds))
        group.polls[poll] = None
        self.held += 1
        self._serial += 1
        self._compact()
        heapq.heappush(self._deadlines, (poll.deadline, self._serial, poll))
        self._alarm.set(poll.deadline, now)
        return Held(poll.cancel)

    def woken(self, group: Group) -> None:
        """``group``'s stream was woken: answer its polls, or hold them on."""
        if not group.polls:
            return  # forgotten meanwhile
        response = self._answer_for(group)
        if response is None:
            group.stream.wait(group.wake)  # nothing for them yet: hold on
            return
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        polls, group.polls = group.polls, {}
        self.held -= len(polls)
        clients = []
        for poll in polls:  # all let go first: an answer that ends a connection
            clients.append(poll.client)  # cancels nothing of this group
            poll.client = poll.group = None
        for client in clients:
            assert client is not None
            client.answer_held(response)

    def _expire(self, deadline: int) -> None:
        """Answer every poll whose deadline has come (204), then wait for the next."""
        now = max(micros(self._clock.seconds()), deadline)
        deadlines = self._deadlines
        while deadlines and (deadlines[0][0] <= now or deadlines[0][2].group is None):
            poll = heapq.heappop(deadlines)[2]
            group, client = poll.group, poll.client
            if group is None or client is None:
                continue
            self.let_go(poll)
            client.answer_held(self._caught_up(group))
        self._alarm.set(deadlines[0][0] if deadlines else None, now)

    def let_go(self, poll: Poll) -> None:
        """``poll`` is held no more (timed out, or its client left): O(1)."""
        group = poll.group
        assert group is not None
        del group.polls[poll]
        poll.client = poll.group = None
        self.held -= 1
        if not group.polls:
            self._forget(group)
        self._compact()

    def _compact(self) -> None:
        """Drop the heap's entries of polls held no more once they outnumber
        the held ones (by 64: a few are not worth a rebuild)."""
        deadlines = self._deadlines
        if len(deadlines) > 2 * self.held + 64:
            deadlines[:] = [entry for entry in deadlines if entry[2].group is not None]
            heapq.heapify(deadlines)

    def _forget(self, group: Group) -> None:
        """No poll of ``group`` is held any more: it waits on nothing."""
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        # equal to the one handed to the stream (same group, same method)
        group.stream.stop_waiting(group.wake)
