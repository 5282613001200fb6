"""pushup/backplane/redis/slotmap.py on fake nodes (fake_nodes.py) and a clock:
the map is read from a seed at start, one read at a time however often a read
is asked for (one more after, never one per ask), noted at once on ``MOVED``,
read every second while a primary is unreachable and not once all are up.
(A real cluster, MOVED and failovers: test_cluster.py, tests/cluster/.)"""

from __future__ import annotations

from twisted.internet.defer import Deferred

from pushup.backplane.redis.pool import Pool
from pushup.backplane.redis.slotmap import ShardsRefused, SlotMap
from pushup.backplane.redis.slots import key_slot
from pushup.config import parse_seeds
from tests.backplane.redis.fake_nodes import Cluster


def map_on(cluster: Cluster, seeds: str = "redis://127.0.0.1:7001",
           first_read: list[Deferred[None]] | None = None) -> SlotMap:
    """A started map (``first_read`` gets its ``read_once``, asked before it started)."""
    urls = parse_seeds(seeds)
    pool = Pool(urls[0], cluster.reactor)
    pool.running = True
    slot_map = SlotMap(urls, cluster.reactor, pool, name="test")
    if first_read is not None:
        first_read.append(slot_map.read_once())
    slot_map.start()
    cluster.pump()
    return slot_map


def reads(cluster: Cluster) -> int:
    return sum(node.count("CLUSTER", "SLOTS") for node in cluster.nodes.values())


def test_the_map_is_read_from_a_seed_and_every_primary_connected():
    cluster = Cluster([7001, 7002, 7003])
    slot_map = map_on(cluster)
    assert slot_map.read_once().called and slot_map.connected and slot_map.clustered
    assert slot_map.primaries() == ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
    for key in (b"a", b"b", b"{p1}x"):
        assert slot_map.owner_of(key) == cluster.owner_of(key).address


def test_reads_asked_during_a_read_are_one_more_read():
    cluster = Cluster([7001, 7002])
    slot_map = map_on(cluster)
    before = reads(cluster)
    for node in cluster.nodes.values():
        node.frozen = True  # the read asked now waits for its answer ...
    done = [slot_map.refresh() for _ in range(3)]  # ... and two more are asked meanwhile
    cluster.pump()
    assert reads(cluster) == before and not any(d.called for d in done)
    for node in cluster.nodes.values():
        node.frozen = False
    cluster.pump()
    assert reads(cluster) == before + 2  # the one under way, and one after it
    assert all(d.called for d in done)


def test_moved_is_noted_at_once_and_the_map_read_again():
    cluster = Cluster([7001, 7002])
    slot_map = map_on(cluster)
    key = next(k for k in (b"k%d" % i for i in range(100))
               if cluster.owner_of(k).port == 7001)
    before = reads(cluster)
    cluster.move(key, 7002)
    slot_map.moved(key_slot(key), "127.0.0.1:7002")
    assert slot_map.owner_of(key) == "127.0.0.1:7002"
    cluster.pump()
    assert reads(cluster) == before + 1 and slot_map.owner_of(key) == "127.0.0.1:7002"


def test_while_a_primary_is_unreachable_the_map_is_read_every_second_and_then_not():
    cluster = Cluster([7001, 7002])
    slot_map = map_on(cluster)
    cluster.nodes[7002].down = True
    cluster.pump()
    before = reads(cluster)
    cluster.run(3.5)
    assert not slot_map.connected and reads(cluster) - before == 3  # MAX_DELAY apart
    cluster.nodes[7002].down = False
    cluster.run(2.0)
    assert slot_map.connected
    settled = reads(cluster)
    cluster.run(5.0)
    assert reads(cluster) == settled


def test_a_cluster_with_a_database_other_than_0_is_refused():
    cluster = Cluster([7001])
    read: list[Deferred[None]] = []
    slot_map = map_on(cluster, "redis://127.0.0.1:7001/2", read)
    refused: list[object] = []
    read[0].addErrback(lambda f: refused.append(f.value))
    assert len(refused) == 1 and isinstance(refused[0], ShardsRefused)
    assert not slot_map.running
