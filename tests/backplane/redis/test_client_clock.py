"""pushup/backplane/redis/client.py on a ``task.Clock`` with in-memory transports:
what a command's timeout counts, and when a connection is called up.

A reactor turn is modelled as Twisted runs one: its timed calls first
(``clock.advance``), then the bytes its poll found (``dataReceived``). A turn
in which the node is behind is one long ``advance``; a Redis that is stopped
(SIGSTOP) is one whose kernel accepts the connection and that never answers.
The real-process counterparts are in test_client.py and tests/ops/test_logs.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure

from pushup.backplane.redis.client import (
    RedisConnection,
    RedisProtocol,
    RedisTimeout,
)
from tests.real_reactor import failure_of

STEP = 0.25  # seconds a turn lasts when the node keeps up with its work


def connected_protocol(clock: Clock) -> tuple[RedisProtocol, StringTransport]:
    protocol = RedisProtocol(clock)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport


def turns(clock: Clock, seconds: float) -> None:
    """``seconds`` of turns of STEP each, the node keeping up."""
    for _ in range(round(seconds / STEP)):
        clock.advance(STEP)


# -- a command's timeout: Redis did not answer ----------------------------------


def test_a_reply_that_came_in_the_turn_the_timeout_is_due_is_read_not_failed():
    clock = Clock()
    redis, transport = connected_protocol(clock)
    answer = redis.execute("GET", "k", timeout=2.0)
    turns(clock, 2.0)  # the turn's timed calls: the timeout is due
    redis.dataReceived(b"$5\r\nvalue\r\n")  # ... and the same turn's poll has the reply
    clock.advance(STEP)
    assert answer.called and answer.result == b"value"
    assert not transport.disconnecting  # the connection is kept


def test_a_turn_in_which_the_node_was_behind_is_not_counted_against_redis():
    clock = Clock()
    redis, transport = connected_protocol(clock)
    answer = redis.execute("GET", "k", timeout=2.0)
    clock.advance(5.0)  # one turn of the node's own work, three times the timeout
    turns(clock, 1.0)
    redis.dataReceived(b"$5\r\nvalue\r\n")
    assert answer.called and answer.result == b"value"
    assert not transport.disconnecting


def test_a_reply_still_coming_in_when_the_timeout_is_due_is_waited_for():
    clock = Clock()
    redis, transport = connected_protocol(clock)
    big = b"x" * 300
    answer = redis.execute("GET", "big", timeout=2.0)
    reply = b"$300\r\n" + big + b"\r\n"
    turns(clock, 2.0)
    for start in range(0, len(reply), 100):  # a pass each: Redis is sending it
        redis.dataReceived(reply[start:start + 100])
        clock.advance(0.001)
    clock.advance(STEP)
    assert answer.called and answer.result == big
    assert not transport.disconnecting


def test_a_redis_that_answers_nothing_fails_the_command_after_its_timeout_and_drops_it():
    clock = Clock()
    redis, transport = connected_protocol(clock)
    answer = redis.execute("GET", "k", timeout=2.0)
    untimed = redis.execute("GET", "other")
    turns(clock, 1.75)
    assert not answer.called
    turns(clock, 0.5)
    error = failure_of(answer)
    assert isinstance(error, RedisTimeout) and "GET within 2 s" in str(error)
    assert transport.disconnected  # aborted: a half-open connection fails nothing else
    redis.connectionLost(Failure(ConnectionDone()))
    assert not isinstance(failure_of(untimed), RedisTimeout)
    assert not clock.getDelayedCalls()


def test_an_answered_command_leaves_no_timer():
    clock = Clock()
    redis, _ = connected_protocol(clock)
    answer = redis.execute("PING", timeout=2.0)
    turns(clock, 1.0)
    redis.dataReceived(b"+PONG\r\n")
    assert answer.result == b"PONG" and not clock.getDelayedCalls()


# -- up is a Redis that answers ---------------------------------------------------


class Dialled:
    """A RedisConnection on a MemoryReactorClock: each dial is accepted by hand
    (``accept``, as a stopped redis-server's kernel does) and its bytes read and
    answered by the test; ``said`` is what the connection logged, in order."""

    def __init__(self) -> None:
        self.reactor = MemoryReactorClock()
        self.redis = RedisConnection("redis://127.0.0.1:6390", self.reactor,
                                     connect_timeout=2.0)
        self.said: list[str] = []
        self.transport: StringTransport | None = None
        self._protocol: Any = None
        self._dials = 0
        globalLogPublisher.addObserver(self._observe)

    def _observe(self, event: dict[str, Any]) -> None:
        if event.get("log_namespace") == "pushup.backplane.redis.client":
            self.said.append(f"{event['log_level'].name} {event.get('state')}")

    def close(self) -> None:
        globalLogPublisher.removeObserver(self._observe)

    def accept(self) -> None:
        """The dial under way is accepted by the kernel."""
        assert len(self.reactor.tcpClients) == self._dials + 1, "no dial under way"
        factory = self.reactor.tcpClients[self._dials][2]
        self._dials += 1
        self._protocol = factory.buildProtocol(None)
        self.transport = StringTransport()
        self._protocol.makeConnection(self.transport)

    def sent(self) -> bytes:
        assert self.transport is not None
        written = self.transport.value()
        self.transport.clear()
        return written

    def answer(self, reply: bytes) -> None:
        self._protocol.dataReceived(reply)

    def answer_pings(self) -> None:
        """Redis answers: a PONG for each PING sent so far."""
        self.answer(b"+PONG\r\n" * self.sent().count(b"PING\r\n"))

    def drop(self) -> None:
        """The connection's loss, once the client aborted it or Redis closed it."""
        self._protocol.connectionLost(Failure(ConnectionDone()))

    def wait(self, seconds: float) -> None:
        for _ in range(round(seconds / STEP)):
            self.reactor.advance(STEP)


@pytest.fixture
def dialled() -> Iterator[Dialled]:
    made = Dialled()
    made.redis.start()
    yield made
    made.close()


def test_a_connection_is_up_only_once_redis_answered_a_ping(dialled):
    dialled.accept()
    assert dialled.sent() == b"*1\r\n$4\r\nPING\r\n"
    assert not dialled.redis.connected and dialled.said == []
    dialled.answer(b"+PONG\r\n")
    assert dialled.redis.connected and dialled.said == ["info up"]


def test_a_stopped_redis_is_said_down_once_and_never_up_until_it_answers(dialled):
    ups: list[bool] = []
    dialled.redis.on_connect.append(lambda: ups.append(True))
    dialled.accept()
    dialled.answer_pings()
    answer = dialled.redis.execute("GET", "k", timeout=2.0)
    # SIGSTOP: nothing is answered; the command's timeout drops the connection
    dialled.wait(2.5)
    assert isinstance(failure_of(answer), RedisTimeout) and dialled.transport.disconnected
    dialled.drop()
    assert dialled.said == ["info up", "warn lost"]
    for attempt in range(10):  # each reconnect is accepted and its PING never answered
        dialled.wait(1.0)  # the backoff
        dialled.accept()
        assert not dialled.redis.connected
        # (the first unanswered PING is told once; none is "up")
        assert dialled.said == ["info up", "warn lost"] + ["warn unreachable"] * (attempt > 0)
        assert dialled.sent().endswith(b"PING\r\n")
        dialled.wait(2.5)
        assert dialled.transport.disconnected  # dropped for the unanswered PING
        dialled.drop()
    assert dialled.said == ["info up", "warn lost", "warn unreachable"]
    # SIGCONT: the next connection's PING is answered
    dialled.wait(1.0)
    dialled.accept()
    dialled.answer_pings()
    assert dialled.redis.connected and ups == [True, True]
    assert dialled.said == ["info up", "warn lost", "warn unreachable", "info up"]


def test_an_error_to_the_ping_is_not_up(dialled):
    dialled.accept()
    dialled.sent()
    dialled.answer(b"-LOADING Redis is loading the dataset in memory\r\n")
    assert not dialled.redis.connected and dialled.transport.disconnected
    assert dialled.said == ["warn unreachable"]
