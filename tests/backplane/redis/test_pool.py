"""pushup/backplane/redis/pool.py on fake nodes (fake_nodes.py) and a clock: a
primary's command and subscriber connections open when it is named, are up
once Redis answered a PING, come back by themselves after a loss, and close
when it is dropped; the listeners hear each change. (A real cluster:
test_cluster.py.)"""

from __future__ import annotations

from pushup.backplane.redis.client import RedisNotSent
from pushup.backplane.redis.pool import ASK_TIMEOUT, Pool
from pushup.config import parse_url
from tests.backplane.redis.fake_nodes import Cluster


def pool_on(cluster: Cluster) -> tuple[Pool, list[str]]:
    pool = Pool(parse_url("redis://127.0.0.1:7001"), cluster.reactor)
    heard: list[str] = []
    pool.on_commands_up.append(lambda: heard.append("commands up"))
    pool.on_commands_lost.append(lambda: heard.append("commands lost"))
    pool.on_subscriber_up.append(lambda p: heard.append(f"subscriber up {p.address}"))
    pool.on_subscriber_lost.append(lambda p: heard.append(f"subscriber lost {p.address}"))
    pool.running = True
    return pool, heard


def test_a_primary_named_is_connected_twice_and_up_once_each_answered_a_ping():
    cluster = Cluster([7001])
    cluster.nodes[7001].frozen = True  # accepts the dials, answers nothing
    pool, heard = pool_on(cluster)
    primary = pool.primary("127.0.0.1:7001")
    cluster.pump()
    assert len(cluster.nodes[7001].links) == 2 and heard == []
    assert not primary.commands.connected
    cluster.nodes[7001].frozen = False
    cluster.pump()
    assert sorted(heard) == ["commands up", "subscriber up 127.0.0.1:7001"]
    assert pool.primary("127.0.0.1:7001") is primary  # named again: the same connections
    assert len(cluster.nodes[7001].links) == 2


def test_a_connection_lost_comes_back_and_the_listeners_hear_both():
    cluster = Cluster([7001])
    pool, heard = pool_on(cluster)
    primary = pool.primary("127.0.0.1:7001")
    cluster.pump()
    heard.clear()
    cluster.drop(7001)
    assert sorted(heard) == ["commands lost", "subscriber lost 127.0.0.1:7001"]
    heard.clear()
    cluster.run(1.0)  # client.py's backoff: MIN_DELAY, doubling
    assert sorted(heard) == ["commands up", "subscriber up 127.0.0.1:7001"]
    assert primary.commands.connected and primary.subscriber.connected


def test_when_up_waits_for_the_command_connection_and_gives_up_after_ask_timeout():
    cluster = Cluster([7001, 7002])
    cluster.nodes[7002].down = True
    pool, _ = pool_on(cluster)
    up = pool.when_up(pool.primary("127.0.0.1:7001"))
    late = pool.when_up(pool.primary("127.0.0.1:7002"))
    cluster.pump()
    assert up.called and up.result is None
    cluster.run(ASK_TIMEOUT + 0.5)
    failures: list[object] = []
    late.addErrback(lambda f: failures.append(f.value))
    assert len(failures) == 1 and isinstance(failures[0], RedisNotSent)


def test_a_dropped_primary_is_closed_and_not_dialled_again():
    cluster = Cluster([7001])
    pool, _ = pool_on(cluster)
    pool.primary("127.0.0.1:7001")
    cluster.pump()
    pool.drop("127.0.0.1:7001")
    cluster.run(3.0)
    assert cluster.nodes[7001].links == [] and pool.primaries == {}
    assert len(cluster.reactor.tcpClients) == 2  # its two first dials, no more
