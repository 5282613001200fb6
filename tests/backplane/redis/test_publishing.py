"""pushup/backplane/redis/publishing.py on the fake Redis (fake.py) and a task.Clock:
a message goes to its first channel's partition once its other channels'
partitions hold a note of it; a batch over several partitions is one append
each, answered in the drafts' order, and with an Idempotency-Key a retry
appends only what is missing; 503 when nothing left this node, 504 when an
append was sent and no reply came. (The scripts themselves, on a real
redis-server: test_scripts.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet.task import Clock

from pushup.backplane import Unconfirmed
from pushup.backplane.redis.client import RedisGone, RedisNotSent
from pushup.core import errors
from pushup.core.idempotency import Idem, Replayed
from pushup.core.model import Draft
from tests.backplane.redis.fake import FakeShards, engine_on, tag_of
from tests.conftest import START


@pytest.fixture
def fake() -> Iterator[FakeShards]:
    clock = Clock()
    clock.advance(START)
    yield FakeShards(clock)


def elsewhere(engine: Any, channel: str) -> str:
    """A channel in another of the 8 partitions than ``channel``'s."""
    return next(f"x{i}" for i in range(100) if tag_of(f"x{i}", 8) != tag_of(channel, 8))


def kinds(fake: FakeShards, engine: Any, channel: str) -> list[str]:
    """The kinds of the entries in the log of ``channel``'s partition (of 8)."""
    return [f["k"] for _, f in fake.entries(tag_of(channel, 8))]


def published(fake: FakeShards, d: Any) -> Any:
    result = fake.outcome(d)
    assert not isinstance(result, Exception), result
    return result


def test_the_other_channels_partitions_are_noted_before_the_message_is_appended(fake):
    engine = engine_on(fake, partitions=8)
    other = elsewhere(engine, "a")
    fake.fail_next("PUBLISH", RedisNotSent("not connected"))  # the note's append
    assert isinstance(fake.outcome(engine.publish([Draft(("a", other), b"1")])),
                      errors.EngineUnavailable)
    fake.settle()
    assert kinds(fake, engine, "a") == [] and kinds(fake, engine, other) == []
    for data in (b"1", b"2"):
        published(fake, engine.publish([Draft(("a", other), data)]))
    assert kinds(fake, engine, other) == ["f"]  # noted once, however often published
    assert kinds(fake, engine, "a") == ["m", "m"]


def test_a_batch_over_partitions_is_answered_in_draft_order_and_a_retry_appends_what_is_missing(
        fake):
    engine = engine_on(fake, partitions=8)
    other = elsewhere(engine, "a")
    drafts = [Draft(("a",), b"1"), Draft((other,), b"2"), Draft(("a",), b"3")]
    idem = Idem("k1", "fingerprint")
    fake.fail_next("PUBLISH", RedisNotSent("not connected"))  # the first partition's
    assert isinstance(fake.outcome(engine.publish(drafts, idem)), errors.EngineUnavailable)
    fake.settle()
    appended = len(fake.appended)
    assert appended == 1  # the other partition's part is in Redis: no 201 was sent
    messages = published(fake, engine.publish(drafts, idem))
    assert not isinstance(messages, Replayed)
    assert [m.channels for m in messages] == [("a",), (other,), ("a",)]
    assert [m.id for m in messages][1] == fake.appended[0]  # the part appended before
    assert len(fake.appended) == appended + 2
    again = published(fake, engine.publish(drafts, idem))
    assert isinstance(again, Replayed) and [m.id for m in again] == [m.id for m in messages]
    assert len(fake.appended) == appended + 2


def test_a_reply_lost_is_504_and_the_retry_with_its_key_is_the_first_attempts_answer(fake):
    engine = engine_on(fake, partitions=1)
    idem = Idem("k2", "body")
    fake.fail_next("PUBLISH", RedisGone("connection lost"), ran=True)
    assert isinstance(fake.outcome(engine.publish([Draft(("a",), b"1")], idem)),
                      errors.OutcomeUnknown)
    fake.settle()
    retried = published(fake, engine.publish([Draft(("a",), b"1")], idem))
    assert isinstance(retried, Replayed) and [m.id for m in retried] == fake.appended
    other_body = engine.publish([Draft(("a",), b"2")], Idem("k2", "another body"))
    fake.settle()
    assert isinstance(fake.outcome(other_body), errors.KeyReused)
    assert len(fake.appended) == 1


def test_a_create_of_an_explicit_channel_that_exists_is_refused(fake):
    engine = engine_on(fake, partitions=1)
    assert published(fake, engine.create_channel("room", 60)).name == "room"
    again = engine.create_channel("room", 60)
    fake.settle()
    assert isinstance(fake.outcome(again), errors.ChannelExists)


def test_publish_ack_peer_waits_for_a_replica_and_says_unconfirmed_when_none_holds_it(fake):
    fake.replicas = 1
    engine = engine_on(fake, partitions=1, publish_ack="peer")
    assert not isinstance(published(fake, engine.publish([Draft(("a",), b"1")])), Unconfirmed)
    fake.acks = 0  # the replica did not take it within --publish-ack-timeout
    assert isinstance(published(fake, engine.publish([Draft(("a",), b"2")])), Unconfirmed)
    assert fake.log.count("WAIT") == 2 and fake.log.count("ROLE") == 1  # ROLE asked once
