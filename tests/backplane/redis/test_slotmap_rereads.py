"""The slot map's re-reads run on the single-flight helper: one read at a time,
and asked during one, exactly one more after it (on task.Clock, no Redis)."""

from __future__ import annotations

from typing import Any

from twisted.internet import task
from twisted.internet.defer import Deferred

from pushup.backplane.redis.pool import Pool
from pushup.backplane.redis.slotmap import SlotMap
from pushup.backplane.redis.slots import Topology
from pushup.config import parse_url

SEED = parse_url("redis://127.0.0.1:1")


def _map() -> tuple[SlotMap, list[Deferred[None]]]:
    clock = task.Clock()
    slot_map = SlotMap([SEED], clock, Pool(SEED, clock), name="test")
    reads: list[Deferred[None]] = []

    def read() -> Deferred[None]:  # what a map read does, without asking a Redis
        done: Deferred[None] = Deferred()
        done.addCallback(lambda _: slot_map._apply(Topology.single(SEED)))
        reads.append(done)
        return done

    slot_map._read = read  # type: ignore[method-assign]
    return slot_map, reads


def test_refreshes_asked_during_a_read_make_one_more_read_and_all_fire_after_it() -> None:
    slot_map, reads = _map()
    slot_map.start()
    fired: list[Any] = []
    for _ in range(3):
        slot_map.refresh().addCallback(fired.append)
    assert len(reads) == 1  # one at a time
    reads[0].callback(None)
    assert len(reads) == 2 and fired == []  # the first may predate what prompted the asks
    reads[1].callback(None)
    assert len(reads) == 2 and fired == [None, None, None]
    assert slot_map.known


def test_a_refresh_after_the_reads_ended_reads_again() -> None:
    slot_map, reads = _map()
    slot_map.start()
    reads[0].callback(None)
    fired: list[Any] = []
    slot_map.refresh().addCallback(fired.append)
    assert len(reads) == 2
    reads[1].callback(None)
    assert fired == [None]
