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

from dataclasses import replace

import pytest

from tests.cluster.history import Costs, Load, under_fault
from tests.cluster.netfault import cut, cut_port, mesh, on_redis, skip_reason, slow

REASON = skip_reason()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.timeout(180)]

LOAD = Load(publishers=2, channels_per_publisher=2, count=120, pace=0.01, subscribers=4,
            before=40, during=100)


def assert_kept(costs: Costs, held: str = "dropped") -> None:
    """The fault held (it dropped or held back packets) and no promise broke."""
    assert costs.fault[held] > 0, f"the fault never acted: {costs.figures()}"
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
    assert_kept(costs, held="overlimits")


def test_redis_node_cut_from_redis_under_load_and_healed_loses_and_duplicates_nothing() -> None:
    with on_redis(3) as (lab, hosts, c, redis):
        costs = under_fault(lambda: cut_port(hosts[0], lab.root_addr, redis.port), c.bases,
                            c.bases, LOAD, tag="rcut")
    assert_kept(costs)
    assert costs.unacked > 0, ("the cut node never refused a publish: the cut did not "
                               f"hold during the load {costs.figures()}")
