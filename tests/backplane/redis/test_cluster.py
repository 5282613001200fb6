"""pushup/backplane/redis/cluster.py against a real Redis Cluster and a real redis-server.

Tests that leave the cluster usable share one cluster (3 primaries) and one server per
module, and are parametrized over both where the behaviour is the same; those that kill
a primary get a fresh cluster with replicas (the ``redis_cluster`` fixture). Every wait
is for an event, bounded; after each test no timer of ``Shards`` is left behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy.redis_cluster import RedisCluster
from deploy.redis_server import RedisServer
from pushup.backplane.redis.client import RedisError, script_sha
from pushup.backplane.redis.cluster import Shards, ShardsRefused, key_slot
from pushup.config import parse_seeds
from tests.real_reactor import failure_of, reactor, run_until, wait_for

PUBLISH = "return redis.call('SPUBLISH', KEYS[1], ARGV[1])"
INCR_BY = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
WAIT = 20.0  # seconds any one event may take on a busy machine (a failover takes ~2-3 s)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    made = RedisCluster(primaries=3, replicas=0)
    made.start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    made = RedisServer()
    made.start()
    try:
        yield made
    finally:
        made.stop()


@dataclass
class Target:
    """One redis-server or a cluster, as a test needs it: seeds, and who owns a key."""

    seeds: str
    owner: Callable[[str], int]  # the port of the node owning a key
    cli: Callable[..., Any]  # cli(port, *args)
    primaries: list[int]
    addresses: list[str]  # as Shards.primaries() names them


def target_of(cluster: RedisCluster) -> Target:
    primaries = cluster.primaries()
    return Target(cluster.seeds, lambda key: cluster.owner_of(key_slot(key)), cluster.cli,
                  primaries, sorted(f"127.0.0.1:{port}" for port in primaries))


@pytest.fixture(params=["server", "unix", "cluster"])
def redis(request: pytest.FixtureRequest) -> Target:
    if request.param == "cluster":
        return target_of(request.getfixturevalue("cluster"))
    server: RedisServer = request.getfixturevalue("server")
    seeds, address = server.url, f"127.0.0.1:{server.port}"
    if request.param == "unix":
        seeds, address = f"unix://{server.unix_path}", server.unix_path
    return Target(seeds, lambda key: server.port, lambda port, *args: server.cli(*args),
                  [server.port], [address])


@pytest.fixture
def open_shards() -> Iterator[Callable[..., Shards]]:
    """``open_shards(seeds)``: a started Shards, connected unless ``wait=False``."""
    made: list[Shards] = []

    def make(seeds: str, wait: bool = True) -> Shards:
        shards = Shards(parse_seeds(seeds), reactor)
        made.append(shards)
        shards.start()
        if wait:
            run_until(lambda: shards.connected, WAIT, f"Shards on {seeds} to connect")
        return shards

    yield make
    for shards in made:
        wait_for(shards.stop())
    reactor.iterate(0)  # aborted transports close on the next turn
    assert not reactor.getDelayedCalls(), reactor.getDelayedCalls()


@dataclass
class Listener:
    """What ``subscribe`` delivered for one channel."""

    messages: list[bytes] = field(default_factory=list)
    synced: int = 0

    def on_synced(self) -> None:
        self.synced += 1


def listen(shards: Shards, channels: list[str]) -> dict[str, Listener]:
    listeners = {channel: Listener() for channel in channels}
    for channel, listener in listeners.items():
        shards.subscribe(channel, listener.messages.append, listener.on_synced)
    run_until(lambda: all(listener.synced for listener in listeners.values()), WAIT,
              "every subscription to be confirmed")
    return listeners


def channels_on_every_primary(redis: Target, count: int = 12) -> list[str]:
    channels = [f"pushup:{{p{index}}}:n" for index in range(count)]
    assert {redis.owner(channel) for channel in channels} == set(redis.primaries)
    return channels


def publish(redis: Target, channel: str, payload: str, port: int | None = None) -> None:
    """SPUBLISH from a Lua script, as the engine's publish script does."""
    redis.cli(port or redis.owner(channel), "EVAL", PUBLISH, 1, channel, payload)


def error_count(redis: Target, port: int, prefix: str) -> int:
    """How many ``prefix`` error replies (MOVED, ASK) the node on ``port`` has sent."""
    for line in redis.cli(port, "INFO", "errorstats").decode().splitlines():
        if line.startswith(f"errorstat_{prefix}:count="):
            return int(line.split("=")[1])
    return 0


# -- the slot rule ----------------------------------------------------------------------

keys = st.one_of(
    st.text(max_size=20),
    st.builds(lambda a, tag, b: f"{a}{{{tag}}}{b}", st.text(max_size=8), st.text(max_size=8),
              st.text(max_size=8)),
    st.binary(max_size=20))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=keys)
def test_key_slot_is_the_slot_redis_cluster_gives(cluster: RedisCluster, key: str | bytes) -> None:
    assert key_slot(key) == cluster.cli(cluster.ports[0], "CLUSTER", "KEYSLOT", key)


@pytest.mark.parametrize("key", ["{user1000}.following", "foo{}{bar}", "foo{{bar}}zap",
                                 "foo{bar}{zap}", "pushup:{p0}:log", "{}", "}{", ""])
def test_key_slot_on_redis_examples(cluster: RedisCluster, key: str) -> None:
    assert key_slot(key) == cluster.cli(cluster.ports[0], "CLUSTER", "KEYSLOT", key)


# -- commands -----------------------------------------------------------------------------

def test_execute_and_evalsha_reach_the_owner_of_any_key(redis: Target, open_shards):
    shards = open_shards(redis.seeds)
    assert shards.clustered == (len(redis.primaries) > 1)
    assert shards.primaries() == redis.addresses
    keys = [f"pushup:{{p{index}}}:seq" for index in range(12)]
    for index, key in enumerate(keys):
        assert wait_for(shards.execute(key, "SET", key, index)) == b"OK"
    for port in redis.primaries:  # Redis lacks the script: EVALSHA falls back to EVAL
        redis.cli(port, "SCRIPT", "FLUSH")
    for index, key in enumerate(keys):
        assert wait_for(shards.evalsha(script_sha(INCR_BY), INCR_BY, [key], [10])) == index + 10
        assert redis.cli(redis.owner(key), "GET", key) == b"%d" % (index + 10)
    assert wait_for(shards.execute(None, "PING")) == b"PONG"
    assert [(p["address"], p["state"]) for p in wait_for(shards.probe())] == [
        (address, "up") for address in redis.addresses]
    assert sum(p["slots"] for p in wait_for(shards.probe())) == 16384
    error = failure_of(shards.execute(keys[0], "INCR", "pushup:{p0}:no-such-command", 1))
    assert isinstance(error, RedisError) and "wrong number of arguments" in error.message


def test_a_cluster_has_no_database_but_0(cluster: RedisCluster, open_shards):
    shards = open_shards(cluster.seeds + "/1", wait=False)
    error = failure_of(shards.topology_read(), WAIT)
    assert isinstance(error, ShardsRefused) and "drop the /DB from --engine" in str(error)
    assert not shards.connected


def test_a_slot_migrated_mid_use_is_followed_through_ask_and_moved(cluster: RedisCluster,
                                                                   open_shards):
    redis = target_of(cluster)
    shards = open_shards(cluster.seeds)
    key, fresh = "pushup:{p3}:log", "pushup:{p3}:fresh"
    slot, source = key_slot(key), redis.owner(key)
    target = next(port for port in redis.primaries if port != source)
    assert wait_for(shards.execute(key, "SET", key, "before")) == b"OK"
    asks, moves = error_count(redis, source, "ASK"), error_count(redis, source, "MOVED")

    cluster.migrate_slot(slot, target, finish=False)  # MIGRATING: the source has the key
    assert wait_for(shards.execute(key, "GET", key)) == b"before"
    cluster.move_keys(slot, source, target)  # the key is on the target: the source says ASK
    assert wait_for(shards.execute(key, "GET", key)) == b"before"
    assert wait_for(shards.execute(fresh, "SET", fresh, "during")) == b"OK"
    assert error_count(redis, source, "ASK") == asks + 2

    cluster.finish_migration()  # the slot is the target's: the source says MOVED
    assert wait_for(shards.evalsha(script_sha(INCR_BY), INCR_BY, [fresh + "n"], [1])) == 1
    assert error_count(redis, source, "MOVED") == moves + 1
    assert wait_for(shards.execute(fresh, "GET", fresh)) == b"during"
    assert error_count(redis, source, "MOVED") == moves + 1  # the map was updated
    assert redis.cli(target, "GET", key) == b"before"


# -- sharded pub/sub ------------------------------------------------------------------------

def test_subscribers_get_what_lua_scripts_spublish_on_every_primary_in_order(redis: Target,
                                                                            open_shards):
    shards = open_shards(redis.seeds)
    channels = channels_on_every_primary(redis)
    listeners = listen(shards, channels)
    for number in range(20):
        for channel in channels:
            publish(redis, channel, f"{channel}#{number}")
    run_until(lambda: all(len(listener.messages) == 20 for listener in listeners.values()),
              WAIT, "every message")
    for channel, listener in listeners.items():
        assert listener.messages == [f"{channel}#{n}".encode() for n in range(20)]
        assert listener.synced == 1

    shards.unsubscribe(channels[0])
    run_until(lambda: redis.cli(redis.owner(channels[0]), "PUBSUB", "SHARDNUMSUB",
                                channels[0])[1] == 0, WAIT, "SUNSUBSCRIBE")
    publish(redis, channels[1], "after")
    run_until(lambda: listeners[channels[1]].messages[-1] == b"after", WAIT, "a message")
    assert len(listeners[channels[0]].messages) == 20


def test_a_killed_subscriber_connection_is_subscribed_again(redis: Target, open_shards):
    shards = open_shards(redis.seeds)
    channels = channels_on_every_primary(redis)
    listeners = listen(shards, channels)
    for port in redis.primaries:
        assert redis.cli(port, "CLIENT", "KILL", "TYPE", "pubsub") >= 1
    run_until(lambda: all(listener.synced == 2 for listener in listeners.values()), WAIT,
              "every subscription to be confirmed again")
    for channel in channels:
        publish(redis, channel, "again")
    run_until(lambda: all(listener.messages == [b"again"] for listener in listeners.values()),
              WAIT, "a message on every channel")


def test_a_channel_whose_slot_moved_is_subscribed_on_its_new_owner(cluster: RedisCluster,
                                                                    open_shards):
    redis = target_of(cluster)
    shards = open_shards(cluster.seeds)
    channel, other = "pushup:{p5}:n", "pushup:{p6}:n"
    listeners = listen(shards, [channel, other])
    source = redis.owner(channel)
    target = next(port for port in redis.primaries if port != source)
    cluster.migrate_slot(key_slot(channel), target)  # the source pushes a sunsubscribe
    run_until(lambda: listeners[channel].synced == 2, WAIT, "the subscription on the new owner")
    assert redis.cli(target, "PUBSUB", "SHARDNUMSUB", channel)[1] == 1
    publish(redis, channel, "moved", port=target)
    publish(redis, other, "stayed")
    run_until(lambda: listeners[channel].messages == [b"moved"]
              and listeners[other].messages == [b"stayed"], WAIT, "messages on both channels")
    assert listeners[other].synced == 1


def test_after_a_failover_commands_and_subscriptions_reach_the_new_primary(
        redis_cluster: RedisCluster, open_shards):
    redis = target_of(redis_cluster)
    shards = open_shards(redis_cluster.seeds)
    channels = channels_on_every_primary(redis)
    listeners = listen(shards, channels)
    channel = channels[0]
    key = channel.replace(":n", ":log")
    victim = redis.owner(channel)

    redis_cluster.kill(victim)
    run_until(lambda: not shards.connected, WAIT, "the loss")
    states = {p["address"]: p["state"] for p in wait_for(shards.probe())}
    assert states[f"127.0.0.1:{victim}"] == "down"  # the others stay up
    assert sorted(states.values()) == ["down", "up", "up"], states
    promoted = redis_cluster.wait_promoted(victim)
    run_until(lambda: shards.connected and listeners[channel].synced == 2, WAIT,
              "Shards to find the promoted replica")
    assert f"127.0.0.1:{promoted}" in shards.primaries()
    assert f"127.0.0.1:{victim}" not in shards.primaries()
    assert wait_for(shards.execute(key, "SET", key, "after")) == b"OK"
    assert redis_cluster.cli(promoted, "GET", key) == b"after"
    assert {p["state"] for p in wait_for(shards.probe())} == {"up"}
    publish(redis, channel, "after", port=promoted)
    run_until(lambda: listeners[channel].messages == [b"after"], WAIT, "a message")
    assert all(listeners[other].synced == 1 for other in channels
               if redis_cluster.owner_of(key_slot(other)) != promoted)

    # a slot nobody serves: the cluster's own error reaches the caller, untouched
    redis_cluster.cli(promoted, "CLUSTER", "DELSLOTS", key_slot(key))
    error = failure_of(shards.execute(key, "GET", key))
    assert isinstance(error, RedisError) and error.message.startswith("CLUSTERDOWN"), error
