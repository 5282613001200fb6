"""pushup/backplane/redis/stream_cache.py through two in-memory nodes on one fake
Redis (fake.py, fake_streams.py) and a task.Clock: a node's cache of a stream is
what Redis held when it read it; it reads only what it lacks, hears another
node's write on the stream's channel (a long poll held on it is answered), and
forgets a stream that another node deleted or that Redis lost. (The scripts,
and Redis restarted from a snapshot: test_shared_streams.py, test_stream_loss.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.task import Clock

from tests.backplane.redis.fake import FakeShards, node_on
from tests.conftest import START, Response

PLAIN = {"Content-Type": "text/plain"}


@pytest.fixture
def two() -> Iterator[tuple[Any, Any, FakeShards]]:
    """Nodes a and b, each with its own connections to one fake Redis, and b's."""
    clock = Clock()
    clock.advance(START)
    fake_a = FakeShards(clock)
    fake_b = FakeShards(clock, redis=fake_a)
    yield node_on(fake_a, "a"), node_on(fake_b, "b"), fake_b


def ask(node: Any, fake: FakeShards, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> Response:
    conn = node.open(method, path, body, headers)
    fake.settle()
    response = conn.response
    assert response is not None, f"{method} {path} not answered once Redis settled"
    return response


def test_a_stream_written_on_one_node_is_read_on_another_as_redis_holds_it(two):
    a, b, fake = two
    assert ask(a, fake, "PUT", "/v1/stream/s", b"abc", PLAIN).status == 201
    read = ask(b, fake, "GET", "/v1/stream/s?offset=-1")
    assert (read.status, read.body) == (200, b"abc")
    assert ask(a, fake, "POST", "/v1/stream/s", b"def", PLAIN).status in (200, 204)
    reads = fake.log.count("READ")
    again = ask(b, fake, "GET", "/v1/stream/s?offset=-1")
    assert (again.status, again.body) == (200, b"abcdef")
    assert fake.log.count("READ") == reads + 1  # one read, of what b lacked


def test_a_long_poll_held_on_one_node_is_answered_by_another_nodes_append(two):
    a, b, fake = two
    ask(a, fake, "PUT", "/v1/stream/s", b"abc", PLAIN)
    tail = ask(b, fake, "GET", "/v1/stream/s?offset=-1").header("stream-next-offset")
    held = b.open("GET", f"/v1/stream/s?offset={tail}&live=long-poll")
    fake.settle()
    assert held.response is None  # at the tail: held
    ask(a, fake, "POST", "/v1/stream/s", b"def", PLAIN)  # told on the stream's channel
    fake.settle()
    assert held.response is not None and held.response.body == b"def"


def test_a_stream_deleted_through_another_node_or_lost_by_redis_is_forgotten(two):
    a, b, fake = two
    for path in ("/v1/stream/s", "/v1/stream/t"):
        ask(a, fake, "PUT", path, b"abc", PLAIN)
        assert ask(b, fake, "GET", path + "?offset=-1").status == 200
    assert ask(a, fake, "DELETE", "/v1/stream/s").status in (200, 204)
    assert ask(b, fake, "GET", "/v1/stream/s?offset=-1").status == 404
    fake.data.strings.clear()  # Redis lost every stream (a restart empty) ...
    fake.data.hashes.clear()
    fake.data.lists.clear()
    assert ask(b, fake, "GET", "/v1/stream/t?offset=-1").status == 404  # ... b serves none
