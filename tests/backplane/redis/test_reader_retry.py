"""A partition's failed read is retried after ``RETRY`` while the reader runs,
and never once it stopped: ``stop`` cancels the retry's timer (on task.Clock,
with a Redis that is never reached)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, task

from pushup.backplane.redis.exceptions import RedisNotSent, RedisTimeout
from pushup.backplane.redis.following import FollowedChannel, Partition, Step
from pushup.backplane.redis.reader import RETRY, LogReader
from pushup.core.model import Origin
from pushup.core.service import Service
from pushup.core.store import Retention, Store

S = 1_000_000  # µs


class Unreachable:
    """Shards whose every command fails at once (never sent, unless told
    another failure); counts the reads."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.reads = 0
        self.failure = failure or RedisNotSent("not connected")

    def evalsha(self, *args: Any, **kwargs: Any) -> defer.Deferred[Any]:
        self.reads += 1
        return defer.fail(self.failure)


def _reader() -> tuple[LogReader, Partition, Unreachable, task.Clock]:
    clock = task.Clock()
    store = Store(Retention(3600 * S, 3600 * S, 1000, 10**9), Origin("n", 1))
    shards = Unreachable()
    p = Partition(0, "p0")
    reader = LogReader(Service(store, clock, 60.0), shards, [p], clock,  # type: ignore[arg-type]
                       maxlen=1000, timeout=2.0, most=1000, on_abroad=lambda *_: None)
    followed = p.channels["c"] = FollowedChannel(0.0)
    followed.move(Step.CONFIRMED)
    return reader, p, shards, clock


def test_a_failed_read_is_tried_again_after_its_delay() -> None:
    reader, p, shards, clock = _reader()
    reader.read_back(p)
    assert shards.reads == 1 and not p.reads.running and not p.ready
    clock.advance(RETRY)
    assert shards.reads == 2
    reader.stop()


def test_a_stopped_reader_leaves_no_retry_armed() -> None:
    reader, p, shards, clock = _reader()
    reader.read_back(p)
    assert len(clock.getDelayedCalls()) == 1  # the retry
    reader.stop()
    assert clock.getDelayedCalls() == []
    clock.advance(RETRY)
    assert shards.reads == 1


def test_reads_failing_while_a_retry_is_armed_arm_no_other() -> None:
    reader, p, shards, clock = _reader()
    reader.read_back(p)
    reader.read_back(p, "a notification skipped entries")  # fails too, at once
    assert shards.reads == 2 and len(clock.getDelayedCalls()) == 1
    clock.advance(RETRY)
    assert shards.reads == 3 and len(clock.getDelayedCalls()) == 1  # failed again: re-armed
    reader.stop()
    assert clock.getDelayedCalls() == []


def _said_reading_failed(failure: Exception) -> tuple[int, int]:
    """(reads, lines said) when every read of 3 partitions fails with
    ``failure``, 5 times each."""
    from twisted.logger import globalLogPublisher

    clock = task.Clock()
    store = Store(Retention(3600 * S, 3600 * S, 1000, 10**9), Origin("n", 1))
    shards = Unreachable(failure)
    partitions = [Partition(i, f"p{i}") for i in range(3)]
    reader = LogReader(Service(store, clock, 60.0), shards, partitions,  # type: ignore[arg-type]
                       clock, maxlen=1000, timeout=2.0, most=1000, on_abroad=lambda *_: None)
    said: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if "failed" in event.get("log_format", "") and "reading" in event["log_format"]:
            said.append(event)

    globalLogPublisher.addObserver(observe)
    try:
        for p in partitions:
            followed = p.channels["c"] = FollowedChannel(0.0)
            followed.move(Step.CONFIRMED)
            reader.read_back(p)
        for _ in range(4):
            clock.advance(RETRY)  # every partition fails again
    finally:
        globalLogPublisher.removeObserver(observe)
        reader.stop()
    return shards.reads, len(said)


def test_reads_failing_again_and_again_on_many_partitions_are_said_once() -> None:
    assert _said_reading_failed(RedisTimeout("no reply within 2 s")) == (15, 1)


def test_reads_never_sent_are_not_said_the_connection_says_it_is_down() -> None:
    # Redis restarted: a read issued before its connection is back is never
    # sent; "lost" and "up" are the connection's lines, not one per read.
    assert _said_reading_failed(RedisNotSent("not connected")) == (15, 0)
