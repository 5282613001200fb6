"""pushup/backplane/redis/reader.py on the fake Redis (fake.py) and a task.Clock:
a followed partition's copy is its log, in the log's order, whatever order the
replies and notifications come in. A client polling a channel of it gets each
message once, in order, and ``gap: true`` for every message it misses (Redis
lost it, or trimmed it before this node read it), never silence.
(On a real redis-server: test_engine.py.)"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from twisted.internet.task import Clock

from pushup.backplane.redis.client import RedisGone
from pushup.core.cursor import Cursor
from pushup.core.model import Draft, Query
from tests.backplane.redis.fake import FakeShards, engine_on, tag_of
from tests.conftest import START

MAXLEN = 6  # entries the log keeps: a node away for longer finds it trimmed


class Client:
    """A reader of one channel, polling with the cursor each answer gave it."""

    def __init__(self, engine: Any, channel: str) -> None:
        self.engine = engine
        self.channel = channel
        self.since: Cursor | int = 0
        self.seen: list[str] = []  # message ids, in the order received
        self.gaps = 0

    def poll(self) -> None:
        result = self.engine.store.query(Query((self.channel,), self.since, None, 1000))
        for m in result.messages:
            assert m.id not in self.seen, f"{m.id} delivered twice"
            last = next((s for s in reversed(self.seen) if s.startswith(m.origin + "-")), None)
            assert last is None or int(last.rsplit("-", 1)[1]) < m.seq, (last, m.id)
            self.seen.append(m.id)
        self.gaps += result.gap
        self.since = result.cursor


def held(engine: Any, channel: str) -> list[str]:
    return [m.id for m in engine.store.query(Query((channel,), 0, None, 1000)).messages]


class RedisTraffic(RuleBasedStateMachine):
    """What Redis's two connections do, in any order a machine picks (its
    ``fake``): replies, notifications (out of order too), the subscriber
    connection dropped and back. Shared by the reader's machines."""

    fake: FakeShards

    @precondition(lambda self: self.fake.replies)
    @rule()
    def redis_answers(self) -> None:
        self.fake.answer()

    @precondition(lambda self: self.fake.pushes)
    @rule()
    def a_notification_arrives(self) -> None:
        self.fake.push()

    @precondition(lambda self: len(self.fake.pushes) >= 2)
    @rule(data=st.data())
    def notifications_out_of_order(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.fake.pushes) - 2))
        self.fake.reorder(i, i + 1)

    @rule()
    def the_subscriber_connection_drops_and_comes_back(self) -> None:
        self.fake.drop_subscriber()
        self.fake.reconnect()


class ReaderMachine(RedisTraffic):
    """One partition, followed; Redis's replies, notifications, drops, losses and
    other nodes' publishes in any order the machine picks."""

    @initialize()
    def start(self) -> None:
        clock = Clock()
        clock.advance(START)
        self.fake = FakeShards(clock)
        self.engine = engine_on(self.fake, partitions=1, redis_maxlen=MAXLEN)
        self.tag = tag_of("c", 1)
        ready = self.engine.prepare(["c"])
        self.fake.settle()
        assert ready is None or ready.called
        self.client = Client(self.engine, "c")
        self.datas = 0
        self.ever_held: set[str] = set()  # every id this node's copy held at some point

    def _data(self) -> bytes:
        self.datas += 1
        return b'"%d"' % self.datas

    @rule()
    def another_node_publishes(self) -> None:
        self.fake.publish_elsewhere(self.tag, ["c"], self._data(), maxlen=MAXLEN)

    @rule()
    def this_node_publishes(self) -> None:
        self.engine.publish([Draft(("c",), self._data())]).addErrback(lambda _: None)


    @precondition(lambda self: self.fake.replies)
    @rule()
    def a_reply_is_lost(self) -> None:
        self.fake.drop_commands()
        self.fake.reconnect()

    @rule(keep=st.integers(0, 3))
    def redis_loses_the_log(self, keep: int) -> None:
        """An epoch change, maybe mid-read: restarted empty, or a replica that lagged."""
        if keep and len(self.fake.entries(self.tag)) > keep:
            self.fake.lose(self.tag, keep)
        elif not keep:
            self.fake.lose(self.tag)
        self.fake.reconnect()

    @rule()
    def time_passes(self) -> None:
        self.fake.clock.advance(0.25)  # a failed read is tried again after reader.RETRY

    @rule()
    def the_client_polls(self) -> None:
        self.client.poll()

    @invariant()
    def the_copy_is_in_the_logs_order(self) -> None:
        ids = held(self.engine, "c")
        for before, after in zip(ids, ids[1:], strict=False):
            if before.rsplit("-", 1)[0] == after.rsplit("-", 1)[0]:
                assert int(before.rsplit("-", 1)[1]) < int(after.rsplit("-", 1)[1]), ids
        assert set(ids) <= set(self.fake.appended), ids
        self.ever_held.update(ids)

    def _settle(self) -> tuple[str, list[str]]:
        """Every connection up, every reply and notification delivered, every
        retry run: the copy is the log's (its tail past what the log keeps);
        the partition's origin and the messages in its log."""
        self.fake.reconnect()
        for _ in range(20):  # a read failed while Redis was down is tried again
            self.fake.settle()
            self.fake.clock.advance(0.5)
        origin = self.fake.origin(self.tag)  # the node reads the log Redis holds now
        in_log = [f"{origin}-{seq}" for seq, f in self.fake.entries(self.tag) if f["k"] == "m"]
        mine = [i for i in held(self.engine, "c") if i.startswith(origin + "-")]
        assert mine[len(mine) - len(in_log):] == in_log, (mine, in_log)
        return origin, in_log

    def teardown(self) -> None:
        if not hasattr(self, "fake"):
            return
        self._settle()  # no re-sync needed: a notification that skipped entries reads back
        self.fake.drop_subscriber()  # a re-sync: what this node holds is checked
        origin, in_log = self._settle()
        self.client.poll()
        # Missed, and knowably so: this node held it, the client read past it,
        # or the log the client read was replaced by a newer epoch. (Entries
        # Redis lost before any node here read them, in a log it kept on
        # numbering, no node can tell of: their numbers are used again.)
        def knowable(i: str) -> bool:
            log, seq = i.rsplit("-", 1)
            read = [int(s.rsplit("-", 1)[1]) for s in self.client.seen
                    if s.rsplit("-", 1)[0] == log]
            return i in self.ever_held or (bool(read) and (max(read) >= int(seq)
                                                           or log != origin))

        missed = [i for i in self.fake.appended if i not in self.client.seen and knowable(i)]
        assert not missed or self.client.gaps, f"missed {missed} without a gap"
        assert set(in_log) <= set(self.client.seen), "a message in the log never delivered"


ReaderMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                           deadline=None, derandomize=True)
test_the_reader_keeps_each_log_whole_in_order_and_says_each_gap = ReaderMachine.TestCase


def following_c(**settings: Any) -> tuple[FakeShards, Any, str]:
    """A node of one partition following channel ``c`` on a fake Redis:
    the fake, the engine and the partition's tag."""
    clock = Clock()
    clock.advance(START)
    fake = FakeShards(clock)
    engine = engine_on(fake, partitions=1, **settings)
    engine.prepare(["c"])
    fake.settle()
    return fake, engine, tag_of("c", 1)


def test_an_epoch_change_mid_read_is_one_gap_and_the_new_log_read_whole():
    fake, engine, tag = following_c()
    client = Client(engine, "c")
    for data in (b"1", b"2"):
        fake.publish_elsewhere(tag, ["c"], data)
    fake.settle()
    client.poll()
    old = fake.origin(tag)
    assert client.seen == [f"{old}-1", f"{old}-2"]
    fake.drop_subscriber()
    fake.reconnect()
    fake.push()  # re-synced: the read back starts ...
    fake.answer()  # (the log's epoch checked: the same)
    fake.lose(tag)  # ... and Redis restarts empty while it reads
    fake.reconnect()
    fake.publish_elsewhere(tag, ["c"], b"3")  # a new epoch's first message
    fake.settle()
    client.poll()
    new = fake.origin(tag)
    assert new != old and client.seen[2:] == [f"{new}-1"]
    assert client.gaps == 1
    assert engine.lost_epochs == 1


def test_a_log_trimmed_past_what_the_node_held_is_a_gap():
    fake, engine, tag = following_c(redis_maxlen=2)
    client = Client(engine, "c")
    fake.drop_subscriber()  # away: nothing reaches this node ...
    for data in (b"1", b"2", b"3", b"4"):
        fake.publish_elsewhere(tag, ["c"], data, maxlen=2)
    fake.reconnect()  # ... until it re-subscribes and reads the log back
    fake.settle()
    client.poll()
    origin = fake.origin(tag)
    assert client.seen == [f"{origin}-3", f"{origin}-4"] and client.gaps == 1


def test_a_read_that_failed_is_tried_again_and_the_waiting_request_goes_on():
    clock = Clock()
    clock.advance(START)
    fake = FakeShards(clock)
    engine = engine_on(fake, partitions=1)
    fake.publish_elsewhere(tag_of("c", 1), ["c"], b"1")
    fake.fail_next("READ", RedisGone("connection lost"))
    ready = engine.prepare(["c"])
    fake.settle()
    assert ready is not None and not ready.called and held(engine, "c") == []
    clock.advance(0.5)  # reader.RETRY
    fake.settle()
    assert ready.called and len(held(engine, "c")) == 1


def test_a_notification_that_skips_entries_reads_the_log_back_at_once():
    fake, engine, tag = following_c()
    for data in (b"1", b"2"):
        fake.publish_elsewhere(tag, ["c"], data)
    fake.reorder(0, 1)  # the second's notification first: a hole
    fake.push()
    origin = fake.origin(tag)
    assert held(engine, "c") == []  # not applied past the hole ...
    fake.settle()  # ... but read back, with no re-subscription
    assert held(engine, "c") == [f"{origin}-1", f"{origin}-2"]
    assert fake.log.count("READ") == 2  # the first read, and this one
