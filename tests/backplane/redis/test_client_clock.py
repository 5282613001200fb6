"""pushup/backplane/redis/client.py on a ``task.Clock`` with in-memory transports:
what a command's timeout counts, and when a connection is called up.

A reactor turn is modelled as Twisted runs one: its timed calls first
(``clock.advance``), then the bytes its poll found (``dataReceived``). A turn
in which the node is behind is one long ``advance``; a Redis that is stopped
(SIGSTOP) is one whose kernel accepts the connection and that never answers.
The real-process counterparts are in test_client.py and tests/ops/test_logs.py.
"""

from __future__ import annotations

from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from pushup.backplane.redis.client import (
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

