"""pushup/backplane/redis/subscriptions.py on fake nodes (fake_nodes.py) and a
clock: a channel is subscribed on its slot's owner only, again after every
reconnection (``on_synced`` each time Redis confirms it), after a move the map
read shows, after a ``MOVED`` reply and after a ``sunsubscribe`` Redis sent
unasked; its messages reach the subscriber in order. (A real cluster:
test_cluster.py.)"""

from __future__ import annotations

from typing import Any

from pushup.backplane.redis.pool import Pool
from pushup.backplane.redis.slotmap import SlotMap
from pushup.backplane.redis.subscriptions import Subscriptions
from pushup.config import parse_seeds
from tests.backplane.redis.fake_nodes import Cluster


class Listener:
    def __init__(self) -> None:
        self.heard: list[bytes] = []
        self.synced = 0

    def message(self, payload: bytes) -> None:
        self.heard.append(payload)

    def sync(self) -> None:
        self.synced += 1


def subscriptions_on(cluster: Cluster) -> tuple[Subscriptions, SlotMap]:
    urls = parse_seeds("redis://127.0.0.1:7001")
    pool = Pool(urls[0], cluster.reactor)
    pool.running = True
    slot_map = SlotMap(urls, cluster.reactor, pool, name="test")
    subscriptions = Subscriptions(pool, slot_map)
    slot_map.start()
    cluster.pump()
    return subscriptions, slot_map


def subscribe(cluster: Cluster, subscriptions: Subscriptions, channel: bytes) -> Listener:
    listener = Listener()
    subscriptions.subscribe(channel, listener.message, listener.sync)
    cluster.pump()
    return listener


def where(cluster: Cluster, channel: bytes) -> list[int]:
    """The nodes whose connections are subscribed to ``channel``."""
    return sorted(node.port for node in cluster.nodes.values()
                  if any(channel in link.subscribed for link in node.links))


def owned_by(cluster: Cluster, port: int) -> bytes:
    """A channel whose slot that node owns."""
    return next(c for c in (b"n%d" % i for i in range(100)) if cluster.owner_of(c).port == port)


def heard_after(cluster: Cluster, node: Any, channel: bytes, data: bytes,
                listener: Listener) -> list[bytes]:
    """What the listener has heard once ``node`` published ``data`` on ``channel``."""
    node.spublish(channel, data)
    cluster.pump()
    return list(listener.heard)


def test_a_channel_is_subscribed_on_its_owner_and_hears_its_messages_in_order():
    cluster = Cluster([7001, 7002, 7003])
    subscriptions, _ = subscriptions_on(cluster)
    listener = subscribe(cluster, subscriptions, b"pushup:{p1}:n")
    owner = cluster.owner_of(b"pushup:{p1}:n")
    assert where(cluster, b"pushup:{p1}:n") == [owner.port] and listener.synced == 1
    for payload in (b"1", b"2", b"3"):
        owner.spublish(b"pushup:{p1}:n", payload)
    cluster.pump()
    assert listener.heard == [b"1", b"2", b"3"]
    subscriptions.unsubscribe(b"pushup:{p1}:n")
    cluster.pump()
    assert where(cluster, b"pushup:{p1}:n") == []


def test_after_a_reconnection_it_is_subscribed_again_and_told_so():
    cluster = Cluster([7001, 7002])
    subscriptions, _ = subscriptions_on(cluster)
    channel = b"pushup:{p0}:n"
    listener = subscribe(cluster, subscriptions, channel)
    owner = cluster.owner_of(channel)
    cluster.drop(owner.port)
    owner.spublish(channel, b"missed")  # while it is away
    cluster.run(2.0)
    assert where(cluster, channel) == [owner.port]
    assert listener.synced == 2 and listener.heard == []  # told: read what was missed
    assert heard_after(cluster, owner, channel, b"after", listener) == [b"after"]


def test_a_slot_moved_unasked_is_followed_to_its_new_owner():
    cluster = Cluster([7001, 7002])
    subscriptions, _ = subscriptions_on(cluster)
    channel = owned_by(cluster, 7001)
    listener = subscribe(cluster, subscriptions, channel)
    cluster.move(channel, 7002)  # 7001 says sunsubscribe, unasked
    cluster.pump()
    assert where(cluster, channel) == [7002] and listener.synced == 2
    assert heard_after(cluster, cluster.nodes[7002], channel, b"there", listener) == [b"there"]


def test_a_moved_reply_to_ssubscribe_is_followed():
    cluster = Cluster([7001, 7002])
    subscriptions, _ = subscriptions_on(cluster)
    channel = owned_by(cluster, 7001)
    cluster.move(channel, 7002)  # the map this node read is stale
    listener = subscribe(cluster, subscriptions, channel)  # 7001 answers MOVED
    assert cluster.nodes[7001].count("SSUBSCRIBE") == 1
    assert where(cluster, channel) == [7002] and listener.synced == 1
