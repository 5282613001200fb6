"""Issue 37: a node following channels of one partition one by one, on the fake
Redis (fake.py) and a task.Clock. Its clients start and stop reading channels
of one partition while messages on several of them interleave, notifications
come late, out of order or never, and the subscriber connection drops: every
client gets each message of its channel once, in order, or ``gap: true`` for
what it misses, never silence; and the node holds nothing of a channel it no
longer follows. (The single-channel machine and the epoch changes:
test_reader.py.)"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from twisted.internet.task import Clock

from pushup.core.model import Draft, Query
from tests.backplane.redis.fake import FakeShards, engine_on, tag_of
from tests.backplane.redis.test_reader import Client, RedisTraffic
from tests.conftest import START

CHANNELS = ("a", "b", "c", "d")  # one partition (partitions=1)
LINGER = 10.0


class ChannelsMachine(RedisTraffic):
    """One partition; its channels followed and let go as clients come and go."""

    @initialize()
    def start(self) -> None:
        clock = Clock()
        clock.advance(START)
        self.fake = FakeShards(clock)
        self.engine = engine_on(self.fake, partitions=1)
        self.engine.interest.linger = LINGER
        self.tag = tag_of("a", 1)
        self.clients: dict[str, Client] = {}
        self.datas = 0

    def _data(self) -> bytes:
        self.datas += 1
        return b'"%d"' % self.datas

    @rule(channels=st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=3, unique=True))
    def another_node_publishes(self, channels: list[str]) -> None:
        self.fake.publish_elsewhere(self.tag, channels, self._data())

    @rule(channels=st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=3, unique=True))
    def this_node_publishes(self, channels: list[str]) -> None:
        self.engine.publish([Draft(tuple(channels), self._data())]).addErrback(lambda _: None)

    @rule(channel=st.sampled_from(CHANNELS))
    def a_client_starts_reading(self, channel: str) -> None:
        if channel not in self.clients:
            self._prepare(channel)  # a cold read: the client polls once it is in
            self.clients[channel] = Client(self.engine, channel)

    def _prepare(self, channel: str) -> None:
        """A request for ``channel``; one that waits too long fails (503), as Redis's
        replies are the machine's to give."""
        cold = self.engine.prepare([channel])
        if cold is not None:
            cold.addErrback(lambda _: None)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def a_client_stops_and_its_channel_is_let_go(self, data: st.DataObject) -> None:
        channel = data.draw(st.sampled_from(sorted(self.clients)))
        del self.clients[channel]
        self.fake.clock.advance(LINGER + 1)
        for name in self.clients:  # the others poll again meanwhile
            self._prepare(name)
        p = self.engine.partition(channel)
        waited = any(channel in names for _, names in p.when_ready)
        self.engine.interest.let_go_of_unneeded()
        if not waited:  # (a request still waiting for its read keeps it)
            assert channel not in p.channels
            assert self.engine.store.channel(channel) is None  # nothing of it held

    @precondition(lambda self: any(p.kind == "message" for p in self.fake.pushes))
    @rule(data=st.data())
    def a_notification_is_lost(self, data: st.DataObject) -> None:
        """Redis's message never reaches the node, its connection staying up."""
        lost = [i for i, p in enumerate(self.fake.pushes) if p.kind == "message"]
        del self.fake.pushes[data.draw(st.sampled_from(lost))]

    @rule()
    def time_passes(self) -> None:
        self.fake.clock.advance(0.25)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def a_client_polls(self, data: st.DataObject) -> None:
        channel = data.draw(st.sampled_from(sorted(self.clients)))
        if self.engine.partition(channel).serves(channel):
            self.clients[channel].poll()

    @invariant()
    def each_channel_is_held_in_the_logs_order_and_none_twice(self) -> None:
        if not hasattr(self, "engine"):
            return
        for channel in CHANNELS:
            got = self.engine.store.query(Query((channel,), 0, None, 1000)).messages
            seqs = [m.seq for m in got]
            assert seqs == sorted(set(seqs)), (channel, seqs)

    def teardown(self) -> None:
        if not hasattr(self, "fake"):
            return
        for _ in range(2):  # once as things are, once after a re-sync
            self.fake.reconnect()
            for _ in range(10):
                self.fake.settle()
                self.fake.clock.advance(0.5)
            for client in self.clients.values():
                client.poll()
            self.fake.drop_subscriber()
        origin = self.fake.origin(self.tag)
        for channel, client in self.clients.items():
            sent = [f"{origin}-{seq}" for seq, f in self.fake.entries(self.tag)
                    if f["k"] == "m" and channel in json.loads(f["c"])]
            missed = [i for i in sent if i not in client.seen]
            assert not missed or client.gaps, f"{channel}: missed {missed} without a gap"


ChannelsMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40,
                                             deadline=None, derandomize=True)
test_channels_followed_and_let_go_get_each_message_once_or_a_gap = ChannelsMachine.TestCase


def _following(*channels: str) -> tuple[FakeShards, Any, str]:
    clock = Clock()
    clock.advance(START)
    fake = FakeShards(clock)
    engine = engine_on(fake, partitions=1)
    for channel in channels:
        engine.prepare([channel])
    fake.settle()
    return fake, engine, tag_of(channels[0], 1)


def test_a_lost_notification_is_found_by_its_channels_next_and_read_back_without_a_gap():
    fake, engine, tag = _following("a", "b")
    reader = Client(engine, "a")
    fake.publish_elsewhere(tag, ["a"], b"1")
    fake.pushes.clear()  # lost: the connection stays up
    fake.publish_elsewhere(tag, ["a"], b"2")  # says its previous entry of a was 1
    fake.settle()
    reader.poll()
    origin = fake.origin(tag)
    assert reader.seen == [f"{origin}-1", f"{origin}-2"] and reader.gaps == 0
    assert engine.stats()["redis"]["missed"] == 1


def test_a_channel_followed_later_joins_behind_the_horizon_with_its_whole_history():
    fake, engine, tag = _following("a")
    for data, channels in ((b"1", ["b"]), (b"2", ["a"]), (b"3", ["b", "a"])):
        fake.publish_elsewhere(tag, channels, data)
    fake.settle()
    origin = fake.origin(tag)
    assert engine.store.horizon_of(origin) == 3  # b's entries passed over, unheard
    assert engine.stats()["redis"]["notified"] == 2  # a's two: b's own never came
    engine.prepare(["b"])
    fake.settle()
    reader = Client(engine, "b")
    reader.poll()
    assert reader.seen == [f"{origin}-1", f"{origin}-3"] and reader.gaps == 0
