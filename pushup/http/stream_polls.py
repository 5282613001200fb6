"""A Durable Stream's held long polls (``live=long-poll``): held by where they
wait, answered together.

Every poll held at one offset of one stream that asks alike (the same
``cursor`` and ``If-None-Match``) waits in one ``Group``, which is one waiter
of the stream: the append that wakes it has one answer built, and every poll
of the group gets that answer through its connection (``answer_held``: the
same bytes, rendered once), as a fan-out of ``/subscribe`` answers its
subscribers. Timeouts are data, as the hub's: one heap of deadlines under one
``Alarm``, so a held poll costs no timer of the reactor. A poll whose client
leaves is forgotten at once (``Held.cancel``). What a group is answered is its
owner's (:mod:`pushup.http.streams`) to say. It parses no HTTP; time is the
injected clock's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

from twisted.internet import defer

from pushup.core.clock import Alarm, Clock, micros
from pushup.core.stream_values import Position
from pushup.core.streams import Stream
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
    deadline, or forgotten when its client leaves."""

    __slots__ = ("client", "deadline", "done", "group", "owner")

    def __init__(self, owner: LongPolls, group: Group, client: HeldClient,
                 deadline: int) -> None:
        self.owner = owner
        self.group = group
        self.client = client
        self.deadline = deadline
        self.done = False

    def cancel(self) -> None:
        """The client left (the front calls this: ``Held.cancel``)."""
        if not self.done:
            self.owner.let_go(self)


class Group:
    """The polls held at ``at`` of ``stream`` that ask alike; one waiter of the
    stream (``woken``) while any of them is held."""

    __slots__ = ("at", "cursor", "if_none_match", "key", "live", "polls", "stream", "woken")

    def __init__(self, key: GroupKey, stream: Stream, at: Position, cursor: str | None,
                 if_none_match: bytes | None, woken: Callable[[Group], None]) -> None:
        self.key = key
        self.stream = stream
        self.at = at
        self.cursor = cursor
        self.if_none_match = if_none_match
        self.polls: list[Poll] = []
        self.live = 0  # polls of ``polls`` not answered yet
        self.woken: Callable[[], None] = lambda: woken(self)


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
        # (deadline, serial, poll): a heap, with the entries of answered polls
        # too until they come up (or the heap is rebuilt without them)
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
            group = self._groups[key] = Group(key, stream, at, cursor, if_none_match,
                                              self._wake)
            stream.waiters.append(group.woken)
        now = micros(self._clock.seconds())
        poll = Poll(self, group, client, now + micros(seconds))
        group.polls.append(poll)
        group.live += 1
        self.held += 1
        self._serial += 1
        deadlines = self._deadlines
        if len(deadlines) > 2 * self.held + 64:  # mostly answered polls' entries: drop them
            deadlines[:] = [entry for entry in deadlines if not entry[2].done]
            heapq.heapify(deadlines)
        heapq.heappush(deadlines, (poll.deadline, self._serial, poll))
        self._alarm.set(poll.deadline, now)
        return Held(poll.cancel)

    def _wake(self, group: Group) -> None:
        if group.live == 0:
            return
        response = self._answer_for(group)
        if response is None:
            group.stream.waiters.append(group.woken)  # nothing for them yet: hold on
            return
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        polls, group.polls = group.polls, []
        group.live = 0
        for poll in polls:
            if not poll.done:
                poll.done = True
                self.held -= 1
                poll.client.answer_held(response)

    def _expire(self, deadline: int) -> None:
        """Answer every poll whose deadline has come (204), then wait for the next."""
        now = max(micros(self._clock.seconds()), deadline)
        deadlines = self._deadlines
        while deadlines and (deadlines[0][0] <= now or deadlines[0][2].done):
            poll = heapq.heappop(deadlines)[2]
            if poll.done:
                continue
            self.let_go(poll)
            poll.client.answer_held(self._caught_up(poll.group))
        self._alarm.set(deadlines[0][0] if deadlines else None, now)

    def let_go(self, poll: Poll) -> None:
        """``poll`` is held no more (timed out, or its client left)."""
        poll.done = True
        self.held -= 1
        group = poll.group
        group.live -= 1
        if group.live == 0:
            self._forget(group)

    def _forget(self, group: Group) -> None:
        """No poll of ``group`` is held any more: it waits on nothing."""
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        group.polls = []
        if group.woken in group.stream.waiters:
            group.stream.waiters.remove(group.woken)
