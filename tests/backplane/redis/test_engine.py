"""pushup/backplane/redis/engine.py against a real redis-server on the real reactor:
Redis's log is the cluster's one order and a node's cache a copy of it. Two engines
(two nodes) on one Redis: a publish on either is numbered by the log and reaches
both stores in that order; without Redis nothing is acknowledged; a Redis that comes
back empty is a new epoch, counted, and the old log is marked lost.
(The same on real `pushup serve` processes: tests/cluster/test_redis_engine.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from pushup.backplane import Unconfirmed
from pushup.backplane.redis.engine import RedisEngine
from pushup.backplane.redis.slots import key_slot
from pushup.config import Config
from pushup.core import errors
from pushup.core.cursor import Cursor
from pushup.core.model import Draft, Origin, Query
from pushup.core.service import Service
from pushup.core.store import Retention, Store
from tests.real_reactor import failure_of, reactor, run_until, wait_for

S = 1_000_000  # µs


@pytest.fixture
def engine(redis_server) -> Iterator[Callable[..., RedisEngine]]:
    """``engine(name)``: a started RedisEngine on ``redis_server`` (a node named
    ``name``), loaded; all are stopped at teardown, and no timer may outlive them."""
    made: list[RedisEngine] = []

    def make(name: str, url: str | None = None, partitions: int | None = None,
             loaded: bool = True) -> RedisEngine:
        store = Store(Retention(3600 * S, 3600 * S, 1000, 10**9), Origin(name, 1))
        config = Config(node_id=name, engine=url or redis_server.url)
        if partitions is not None:
            config = replace(config, redis_partitions=partitions)
        made.append(RedisEngine(Service(store, reactor, 60.0), config, reactor))
        if loaded:
            wait_for(made[-1].start(), 10.0)
        return made[-1]

    yield make
    for e in made:
        e.service.drain()  # its sweep's timer goes too
        wait_for(e.stop(0))
    reactor.iterate(0)  # aborted transports close on the next turn
    assert not reactor.getDelayedCalls(), reactor.getDelayedCalls()


def follow(e: RedisEngine, channel: str) -> None:
    """Have node ``e`` hold ``channel``, as a request for it would."""
    cold = e.prepare([channel])
    if cold is not None:
        wait_for(cold, 10.0)


def ids_held(e: RedisEngine, channel: str) -> list[str]:
    follow(e, channel)
    return [m.id for m in e.store.query(Query((channel,), 0, None, 1000)).messages]


def origin(e: RedisEngine, channel: str = "c") -> str:
    """The origin of the partition ``channel`` lives in, as node ``e`` holds it."""
    follow(e, channel)
    return e.partition(channel).origin


def publish(e: RedisEngine, channel: str, *datas: bytes) -> list[str]:
    return [m.id for m in wait_for(e.publish([Draft((channel,), d) for d in datas]))]


def test_the_log_numbers_every_publish_and_both_nodes_hold_it_in_that_order(
        engine, redis_server):
    a, b = engine("a"), engine("b")
    assert origin(a) == origin(b) and origin(a).startswith(a.partition("c").tag + ".")
    first = publish(a, "c", b"1", b"2")
    assert ids_held(a, "c") == first  # stored when acknowledged: the next poll here has it
    second = publish(b, "c", b"3")
    third = publish(a, "c", b"4")
    assert [i.rsplit("-", 1)[1] for i in first + second + third] == ["1", "2", "3", "4"]
    for e in (a, b):
        run_until(lambda e=e: len(ids_held(e, "c")) == 4, 10.0, "the tail")
        assert ids_held(e, "c") == first + second + third
    assert redis_server.cli("XLEN", a.partition("c").keys.log) == 4
    assert int(redis_server.cli("HGET", a.partition("c").keys.meta, "s")) == 4


def test_without_redis_nothing_is_acknowledged(engine, redis_server):
    a = engine("a")
    publish(a, "c", b"1")
    held = ids_held(a, "c")  # a reader of "c" here: the node follows it
    redis_server.kill()
    run_until(lambda: not a.stats()["redis"]["up"], 10.0, "the loss noticed")
    assert isinstance(failure_of(a.publish([Draft(("c",), b"2")])), errors.EngineUnavailable)
    assert isinstance(failure_of(a.probe()), errors.EngineUnavailable)
    assert ids_held(a, "c") == held == [f"{origin(a)}-1"]  # still served from memory


def test_a_redis_back_empty_is_a_new_epoch_and_the_old_log_is_lost(engine, redis_server):
    a = engine("a")
    old = origin(a)
    publish(a, "c", b"1")
    redis_server.kill()
    run_until(lambda: not a.stats()["redis"]["up"], 10.0, "the loss noticed")
    redis_server.restart()  # empty: what it acknowledged is gone
    run_until(lambda: a.stats()["redis"]["up"] and a.ready, 15.0, "Redis back")
    ids = wait_for(a.publish([Draft(("c",), b"2")]), 10.0)
    new = ids[0].origin
    assert new != old and ids[0].seq == 1
    # the publish's answer names the new log; the node moves to it as it resyncs
    run_until(lambda: origin(a) == new, 10.0, "the node on the new log")
    assert a.lost_epochs == 1
    assert a.store.lost_of(old) is not None  # a reader behind it gets its gap


def cold_read(e: RedisEngine, channel: str) -> None:
    """``follow``, retried while ``e``'s connections to a restarted Redis come back."""
    def read() -> bool:
        cold = e.prepare([channel])
        if cold is None:
            return True
        try:
            wait_for(cold, 10.0)
        except errors.EngineUnavailable:
            return False
        return True

    run_until(read, 15.0, "a cold read once Redis is back")


def test_a_cursor_into_a_log_redis_lost_is_a_gap_on_a_node_that_never_read_it(
        engine, redis_server):
    # b is made first: its clock's idea of a new epoch is older than the one a
    # starts; the log's epoch must still be later than the one Redis lost.
    # Neither follows the channel (a only publishes): b's cold read starts it.
    b, a = engine("b"), engine("a")
    sent = wait_for(a.publish([Draft(("c",), d) for d in (b"1", b"2", b"3")]))
    behind = Cursor(((sent[1].origin, sent[1].seq),))  # a reader two messages in
    assert a.stats()["redis"]["followed"] == b.stats()["redis"]["followed"] == 0
    redis_server.kill()
    redis_server.restart()  # empty: the log and its epoch are gone
    cold_read(b, "c")
    assert b.partition("c").origin != sent[0].origin
    answer = b.store.query(Query(("c",), behind, None, 1000))
    assert answer.messages == () and answer.gap is True
    again = b.store.query(Query(("c",), answer.cursor, None, 1000))
    assert again.messages == () and again.gap is False  # told once


def test_stats_name_redis_without_its_password(engine, redis_server):
    a = engine("a")
    stats = a.stats()
    assert stats["engine"] == "redis" and stats["peers"] == []
    assert stats["redis"]["up"] and stats["redis"]["partitions"] == len(a.partitions)
    assert stats["redis"]["url"] == f"redis://127.0.0.1:{redis_server.port}/0"


def test_a_node_with_another_number_of_partitions_does_not_serve(engine, redis_server):
    engine("a", partitions=64)
    b = engine("b", partitions=32, loaded=False)
    refused = failure_of(b.start())
    assert isinstance(refused, errors.EngineUnavailable)
    assert "--redis-partitions 32 differs from this Redis's 64" in str(refused)
    assert not b.ready
    assert redis_server.cli("GET", "pushup:partitions") == b"64"


def channels_in_distinct_partitions(e: RedisEngine, count: int, prefix: str) -> list[str]:
    """``count`` channel names that live in ``count`` different partitions."""
    found: dict[int, str] = {}
    k = 0
    while len(found) < count:
        name = f"{prefix}{k}"
        found.setdefault(e.partition(name).index, name)
        k += 1
    return list(found.values())


def test_a_node_holds_nothing_of_the_partitions_none_of_its_clients_read(engine):
    a, b = engine("a"), engine("b")
    read, *others = channels_in_distinct_partitions(a, 6, "interest")
    follow(b, read)  # b's only reader reads one channel
    for name in others:
        publish(a, name, b"elsewhere")
    mine = publish(a, read, b"here")
    run_until(lambda: ids_held(b, read) == mine, 10.0, "b holds its reader's channel")
    assert b.stats()["redis"]["followed"] == 1
    assert b.store.message_count == 1  # nothing of the five partitions nobody reads here
    assert a.stats()["redis"]["followed"] == 0  # publishing follows nothing


def test_a_cold_read_on_a_node_that_never_followed_finds_the_whole_history(engine):
    a, b = engine("a"), engine("b")
    sent = publish(a, "cold", b"1", b"2", b"3")
    assert b.store.channel("cold") is None
    assert ids_held(b, "cold") == sent  # one read from Redis, then from memory
    assert b.prepare(["cold"]) is None  # warm now: no read


def test_a_partition_nobody_needs_for_the_linger_is_let_go_and_read_again_whole(engine):
    a, b = engine("a"), engine("b", loaded=False)
    b.interest.linger = 0.2  # (30 s in service)
    wait_for(b.start(), 10.0)
    first = publish(a, "brief", b"1")
    assert ids_held(b, "brief") == first
    p = b.partition("brief")
    run_until(lambda: not p.followed, 10.0, "the partition let go after its linger")
    assert b.store.channel("brief") is None and b.store.message_count == 0
    later = publish(a, "brief", b"2")  # published while b follows nothing
    assert ids_held(b, "brief") == first + later


def test_a_message_of_channels_in_two_partitions_reaches_a_reader_of_either_once(engine):
    a, b = engine("a"), engine("b")
    first, second = channels_in_distinct_partitions(a, 2, "pair")
    follow(b, second)  # b's reader reads the second channel only
    [both] = [m.id for m in wait_for(a.publish([Draft((first, second), b"both")]))]
    assert both.startswith(a.partition(first).tag + ".")  # stored in the first's partition
    run_until(lambda: ids_held(b, second) == [both], 10.0, "the reader of the second has it")
    got = b.store.query(Query((first, second), 0, None, 1000)).messages
    assert [m.id for m in got] == [both]  # a reader of both: once


def test_a_subscription_cut_mid_stream_is_read_back_and_misses_nothing(engine, redis_server):
    a, b = engine("a"), engine("b")
    follow(b, "cut")
    sent = publish(a, "cut", b"1")
    assert redis_server.cli("CLIENT", "KILL", "TYPE", "pubsub") >= 1
    sent += publish(a, "cut", b"2", b"3")  # while b's subscription is coming back
    run_until(lambda: ids_held(b, "cut") == sent, 10.0, "b read back what it missed")


def test_on_a_cluster_a_publish_is_acknowledged_once_a_replica_holds_it(engine, redis_cluster):
    """--publish-ack peer (the default) on a Redis Cluster with replicas: 201
    once a replica of the partition's primary holds the append (WAIT); with
    that replica stopped, 202 (stored, not copied) after --publish-ack-timeout."""
    a = engine("a", url=redis_cluster.seeds)
    a.publisher.ack_timeout_ms = 300
    first = wait_for(a.publish([Draft(("acked",), b"1")]), 10.0)
    assert not isinstance(first, Unconfirmed)
    slot = key_slot(a.partition("acked").keys.log)
    primary = redis_cluster.owner_of(slot)
    [replica] = [port for port in redis_cluster.ports
                 if port != primary and redis_cluster.cli(port, "ROLE")[0] == b"slave"
                 and int(redis_cluster.cli(port, "ROLE")[2]) == primary]
    redis_cluster.nodes[replica].pause()
    try:
        second = wait_for(a.publish([Draft(("acked",), b"2")]), 10.0)
    finally:
        redis_cluster.nodes[replica].resume()
    assert isinstance(second, Unconfirmed)
    assert [m.seq for m in second] == [first[0].seq + 1]  # stored all the same


def test_a_node_hears_nothing_of_the_channels_it_does_not_read_in_a_partition_it_follows(
        engine):
    """Issue 37: delivery by interest per channel. Node b reads one channel of a
    partition; a's publishes to forty other channels of that same partition
    reach b neither as notifications nor in its store."""
    a, b = engine("a"), engine("b")
    read, others = "{shared}.read", [f"{{shared}}.other{k}" for k in range(40)]
    follow(b, read)
    assert b.partition(read) is b.partition(others[0])  # one hash tag: one partition
    for name in others:
        publish(a, name, b"elsewhere")
    mine = publish(a, read, b"here")
    run_until(lambda: ids_held(b, read) == mine, 10.0, "b holds its reader's channel")
    assert b.store.message_count == 1  # nothing of the forty
    assert list(b.partition(read).channels) == [read]
    assert b.stats()["redis"]["channels_followed"] == 1
    assert b.stats()["redis"]["notified"] == 1  # Redis told b once: of its own channel


def test_channels_of_one_partition_are_followed_and_let_go_each_on_its_own(engine):
    a = engine("a")
    same = [f"{{kept}}.{k}" for k in range(20)]  # one hash tag: one partition
    for name in same:
        follow(a, name)
    p = a.partition(same[0])
    assert set(p.channels) == set(same)
    a.interest.let_go_of_unneeded()  # the sweep: nobody waits on them, but within the linger
    assert set(p.channels) == set(same)
    a.interest.linger = 0.0
    for name in same[:10]:
        p.channels[name].needed_at = 0.0
    for name in same[10:]:
        p.channels[name].needed_at = 1e18  # needed just now, as far as the sweep sees
    a.interest.let_go_of_unneeded()
    assert set(p.channels) == set(same[10:]) and p.followed


def test_letting_a_partition_go_frees_what_the_node_held_for_its_channels(engine):
    """Issue 35, item 8: channels read once each, their partitions let go: the
    node holds nothing per channel (at small size, counted in the structures
    that held them: the store's channels and their expiry index, the
    partitions' tables, the horizon, the hub)."""
    a, b = engine("a"), engine("b")
    b.interest.linger = 0.0  # let go at the next sweep
    pairs = channels_in_distinct_partitions(a, 20, "pair")
    for first, second in zip(pairs[::2], pairs[1::2], strict=True):  # notes abroad
        wait_for(a.publish([Draft((first, second), b"both")]))
    for round_ in range(2):
        names = [f"once{round_}.{k}" for k in range(300)] + pairs
        for name in names:
            follow(b, name)
            b.service.subscribe(Query((name,), 0, None, 100), 0, None)  # a pull
        assert b.store.channel_count == len(names)
        b.interest.let_go_of_unneeded()
        assert b.stats()["redis"]["followed"] == 0
        assert b.store.channel_count == 0 and b.store.message_count == 0
        assert list(b.store.horizons()) == [b.store.origin_name]
        assert all(not p.channels and not p.abroad and not p.when_ready and not p.waiting
                   for p in b.partitions)
        assert len(b.service.hub) == 0
        # the channels' expiry index keeps no entry of a channel gone (stale
        # ones are dropped once they outnumber the live ones, and a few more)
        assert b.store.expiry_entries <= 64, (round_, b.store.expiry_entries)


def test_a_subscriber_connection_that_stays_up_but_stops_forwarding_is_replaced(
        engine, redis_server):
    """Issue 37: a TCP-healthy subscriber connection that no longer forwards (a
    stalled middlebox, a half-open connection) is found by its liveness PING,
    dropped and subscribed again, and what it missed is read back."""
    from tests.backplane.redis.stalling_proxy import StallingProxy

    proxy = StallingProxy(redis_server.port)
    try:
        a, b = engine("a"), engine("b", url=proxy.url)
        follow(b, "stalled")
        assert proxy.stall_subscribers() == 1
        sent = publish(a, "stalled", b"1")
        run_until(lambda: ids_held(b, "stalled") == sent, 20.0,
                  "b found its subscriber connection dead and read back what it missed")
        assert b.stats()["redis"]["probes_failed"] >= 1
    finally:
        proxy.close()
