"""Durable Streams shared through Redis (pushup/backplane/redis/streams.py), two
nodes' caches in one process on the real reactor and a real redis-server: what
one node writes wakes the long polls another holds, whenever it hears of it."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import pytest

from deploy.redis_server import RedisServer
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.streams import SharedStreams
from pushup.config import parse_seeds
from pushup.core.stream_values import Append, Creation
from pushup.core.streams import Streams
from tests.real_reactor import reactor, run_until, wait_for

uids = (f"{n:016x}" for n in itertools.count(1))


def now() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def nodes() -> Iterator[Callable[[], tuple[SharedStreams, Streams]]]:
    """``node()``: one node's shared streams (its own Shards) on one redis-server."""
    server = RedisServer()
    server.start()
    made: list[Shards] = []

    def node() -> tuple[SharedStreams, Streams]:
        shards = Shards(parse_seeds(server.url), reactor)
        made.append(shards)
        shards.start()
        run_until(lambda: shards.connected, 5.0, "Shards to connect")
        streams = Streams(lambda: next(uids), 1 << 20)
        return SharedStreams(shards, streams, now, 2.0, reactor), streams

    yield node
    for shards in made:
        wait_for(shards.stop())
    server.stop()


def test_a_write_heard_while_a_request_is_decided_wakes_the_poll_it_then_holds(nodes) -> None:
    """Node A reads the stream, then (its request not yet decided) hears of B's
    append; the request goes on to hold a long poll on what it read before. That
    poll must be woken: A reads the stream again once the request is done."""
    a, a_streams = nodes()
    b, b_streams = nodes()
    created = Creation("text/plain", None, None, False, b"")
    wait_for(b.serve(["p"], lambda: b_streams.create("p", created, now())))
    heard: list[str] = []
    refresh = a.written
    a.written = lambda path: (heard.append(path), refresh(path))  # type: ignore[method-assign]
    stream = wait_for(a.serve(["p"], lambda: a_streams.at("p")))
    run_until(lambda: heard == ["p"], 5.0, "A's subscription to the stream")  # synced

    wait_for(a.lock.acquire())  # a request of A, between its read and its decision
    wait_for(b.serve(["p"], lambda: b_streams.append("p", Append(None, b"new", False), now())))
    run_until(lambda: heard == ["p", "p"], 5.0, "A to hear of B's append")
    woken: list[bytes] = []
    stream.waiters.append(lambda: woken.append(bytes(stream.entries[-1].data)))
    a.lock.release()  # the request decided: it holds a poll
    run_until(lambda: woken == [b"new"], 5.0, "the poll to be woken")
