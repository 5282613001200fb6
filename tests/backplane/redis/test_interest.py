"""pushup/backplane/redis/interest.py on the fake Redis (fake.py) and a task.Clock:
a node follows a partition from the first request that needs it until
``LINGER`` seconds after the last, for as long as a client waits on one of its
channels; a cold request waits for one read, and no longer than Redis has to
answer; a reader of a channel follows the partitions holding its messages too.
(On a real redis-server: test_engine.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.task import Clock

from pushup.backplane.redis.interest import LINGER
from pushup.core import errors
from pushup.core.model import Draft, Query
from tests.backplane.redis.fake import FakeShards, engine_on, tag_of
from tests.conftest import START


class Held:
    """A client waiting on a poll (the HTTP layer's end of it)."""

    def respond(self, delivery: Any, hold: bool = False) -> bool:
        return True


@pytest.fixture
def fake() -> Iterator[FakeShards]:
    clock = Clock()
    clock.advance(START)
    yield FakeShards(clock)


def warm(engine: Any, fake: FakeShards, *channels: str) -> None:
    """A request for ``channels``, answered once its partitions are read."""
    cold = engine.prepare(channels)
    fake.settle()
    assert cold is None or cold.called


def test_a_partition_is_followed_until_linger_after_the_last_request_that_needed_it(fake):
    engine = engine_on(fake, partitions=1)
    warm(engine, fake, "c")
    assert len(fake.subscriptions) == 1
    fake.clock.advance(LINGER / 2)
    assert engine.prepare(["c"]) is None  # warm: answered from memory, and needed again
    fake.clock.advance(LINGER)  # the sweep ran twice, LINGER since the last request: not yet
    assert len(fake.subscriptions) == 1
    fake.clock.advance(LINGER / 3 + 1)
    assert fake.subscriptions == {}
    assert engine.stats()["redis"]["followed"] == 0
    cold = engine.prepare(["c"])  # needed again: a cold read
    assert cold is not None and not cold.called
    fake.settle()
    assert cold.called and len(fake.subscriptions) == 1


def test_a_partition_a_client_waits_on_is_never_let_go(fake):
    engine = engine_on(fake, partitions=1)
    warm(engine, fake, "c")
    since = engine.store.query(Query(("c",), 0, None, 10)).cursor
    engine.service.subscribe(Query(("c",), since, None, 10), 3 * LINGER, Held())
    fake.clock.advance(2 * LINGER)
    assert len(fake.subscriptions) == 1
    fake.publish_elsewhere(tag_of("c", 1), ["c"], b"1")
    fake.settle()  # its notification still reaches this node
    assert len(engine.store.query(Query(("c",), 0, None, 10)).messages) == 1


def test_a_cold_request_fails_if_redis_does_not_answer_in_time_and_the_next_is_read(fake):
    engine = engine_on(fake, partitions=1)
    cold = engine.prepare(["c"])
    assert cold is not None
    for _ in range(12):  # 3 s of the node's own time, in turns; Redis has 2 s
        fake.clock.advance(0.25)
    assert isinstance(fake.outcome(cold), errors.EngineUnavailable)
    fake.settle()  # Redis answers at last: the read goes on, the next request is warm
    assert engine.prepare(["c"]) is None


def test_a_reader_of_a_channel_follows_the_partition_holding_its_messages_too(fake):
    engine = engine_on(fake, partitions=8)
    home, there = "a", next(f"b{i}" for i in range(100)
                            if tag_of(f"b{i}", 8) != tag_of("a", 8))
    other = engine_on(fake, name="b", partitions=8)  # another node, whose client reads b
    warm(other, fake, there)
    assert len(fake.subscriptions) == 1
    published = engine.publish([Draft((home, there), b"1")])  # to a's partition, noted in b's
    fake.settle()
    assert published.called
    assert len(fake.subscriptions) == 2  # a's partition too, as b's log said
    assert [m.data_json for m in other.store.query(Query((there,), 0, None, 10)).messages] \
        == [b"1"]
