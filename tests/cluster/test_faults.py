"""Faults beyond crashes: a member cut off and healed (mesh and Redis), a
one-way cut, a slow link. Every node runs in a network namespace of its own
(netfault.py); clients publish and follow their cursors through the fault,
and one checker (history.py) holds every subscriber to the contract: each
acknowledged message exactly once, in per-channel order, none lost while a
majority of members survive (here every member does, so no gap may excuse a
loss). Small, count-bounded loads; ``make bench ONLY=faults`` runs the same
faults longer and reports what each costs (docs/faults.md).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import pytest

from deploy.redis_server import RedisServer
from tests.cluster.history import Load, under_fault, wait_for
from tests.cluster.netfault import Host, Lab, NetCluster, cut, cut_port, skip_reason, slow

REASON = skip_reason()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.timeout(180)]

LOAD = Load(publishers=2, channels_per_publisher=2, count=120, pace=0.01, subscribers=4,
            before=40, during=100)


def links_up(c: NetCluster) -> bool:
    from deploy.launch import get_json
    return all(p["state"] == "up" and p["queued"] == 0
               for b in c.bases for p in get_json(b + "/stats")[1]["peers"])


@contextlib.contextmanager
def mesh(nodes: int = 3) -> Iterator[tuple[Lab, list[Host], NetCluster]]:
    with Lab() as lab:
        hosts = [lab.add_host(f"n{i}") for i in range(nodes)]
        # a publish cut off from every peer is answered 202 after this, not 2 s
        with NetCluster(hosts, node_args=["--publish-ack-timeout", "0.5"]) as c:
            wait_for(lambda: links_up(c), 30, "every peer link up")
            yield lab, hosts, c


@contextlib.contextmanager
def on_redis(nodes: int) -> Iterator[tuple[Lab, list[Host], NetCluster, RedisServer]]:
    with Lab() as lab:
        redis = RedisServer("--bind", "127.0.0.1", lab.root_addr, "--protected-mode", "no")
        redis.start()
        try:
            hosts = [lab.add_host(f"n{i}") for i in range(nodes)]
            engine = f"redis://{lab.root_addr}:{redis.port}"
            with NetCluster(hosts, engine=engine) as c:
                yield lab, hosts, c, redis
        finally:
            redis.stop()


def assert_kept(costs) -> None:
    assert not costs.problems, "\n".join(costs.problems[:30])
    assert costs.acked > 0 and costs.deliveries > 0, costs.figures()


def test_mesh_member_cut_off_under_load_and_healed_loses_and_duplicates_nothing() -> None:
    with mesh(3) as (_, hosts, c):
        cut_off, others = hosts[0], [h.addr for h in hosts[1:]]
        costs = under_fault(lambda: cut(cut_off, others), c.bases, c.bases, LOAD, tag="cut")
    assert_kept(costs)
    assert costs.unacked > 0, ("the cut member never failed to find a peer: the cut did "
                               f"not hold during the load {costs.figures()}")


def test_mesh_one_way_cut_loses_and_duplicates_nothing() -> None:
    with mesh(3) as (_, hosts, c):
        a, b = hosts[0], hosts[1]
        # every publish finds a peer, so the cut is held for a time, not a count
        costs = under_fault(lambda: cut(a, [b.addr], "out"), c.bases, c.bases,
                            replace(LOAD, min_fault_s=3.0), tag="oneway")
    assert_kept(costs)


def test_mesh_slow_link_while_publishing_loses_and_duplicates_nothing() -> None:
    # 1 KB messages at a rate a 1 Mbit/s link cannot carry to every subscriber
    # of the slow node at once, so its queue fills and TCP resends what tbf drops
    load = Load(publishers=2, channels_per_publisher=2, count=400, pace=0.0, pad=1000,
                subscribers=4, before=20, during=400, min_fault_s=3.0)
    with mesh(3) as (lab, hosts, c):
        costs = under_fault(lambda: slow(lab, hosts[2]), c.bases[:2], c.bases, load,
                            tag="slow")
    assert_kept(costs)


def test_redis_node_cut_from_redis_under_load_and_healed_loses_and_duplicates_nothing() -> None:
    with on_redis(3) as (lab, hosts, c, redis):
        costs = under_fault(lambda: cut_port(hosts[0], lab.root_addr, redis.port), c.bases,
                            c.bases, LOAD, tag="rcut")
    assert_kept(costs)
    assert costs.unacked > 0, ("the cut node never refused a publish: the cut did not "
                               f"hold during the load {costs.figures()}")
