"""`--only faults`: the network faults of tests/cluster/test_faults.py, longer,
with what each one costs.

The same four faults, each on a fresh cluster whose nodes run in network
namespaces of their own (tests/cluster/netfault.py): a member of a 3-node mesh
cut off from its peers and healed; one node of three on Redis cut from Redis
and healed; a one-way cut (node 1's packets to node 2 dropped); node 3's link
slowed to 1 Mbit/s (tc tbf) while 1 KB messages are published on the others.
Full size, a partition lasts 35 s (past the 30 s a silent peer link is given
before it is closed) under 3 publishers; --quick, the tests' sizes.

Each fault reports the history checker's figures (tests/cluster/history.py):
messages published and acknowledged (201), deliveries, those delivered more
than a second after their 201, the largest delivery lag (over all, and for
messages acknowledged during the fault), gaps, the time from the heal until
every subscriber held every message acknowledged before it, and every broken
promise (`problems`, first 20; `kept` is true when there is none). A broken
promise is a finding, not a failed run: the run's exit status says only
whether the figures were produced. Needs root, ip, nft and tc; without them
the result says why (`skipped`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tests.cluster.history import Costs, Load, under_fault
from tests.cluster.netfault import NetCluster, cut, cut_port, mesh, on_redis, skip_reason, slow

from .scenarios import Context

QUICK = Load(publishers=2, channels_per_publisher=2, count=120, pace=0.01, subscribers=4,
             before=40, during=100)
FULL = Load(publishers=3, channels_per_publisher=3, count=1000, pace=0.02, subscribers=8,
            before=300, during=600, min_fault_s=35.0, settle_s=120.0)


def pids(c: NetCluster, *more: int) -> list[int]:
    """The processes a fault's run started (the record lists them)."""
    return [p.pid for p in c.nodes if p is not None] + list(more)


def member_cut(load: Load, started: list[int]) -> Costs:
    with mesh(3) as (_, hosts, c):
        started += pids(c)
        return under_fault(lambda: cut(hosts[0], [h.addr for h in hosts[1:]]), c.bases,
                           c.bases, load, tag="cut")


def redis_cut(load: Load, started: list[int]) -> Costs:
    with on_redis(3) as (lab, hosts, c, redis):
        started += pids(c, redis.pid)
        return under_fault(lambda: cut_port(hosts[0], lab.root_addr, redis.port), c.bases,
                           c.bases, load, tag="rcut")


def one_way(load: Load, started: list[int]) -> Costs:
    with mesh(3) as (_, hosts, c):
        started += pids(c)
        return under_fault(lambda: cut(hosts[0], [hosts[1].addr], "out"), c.bases, c.bases,
                           replace(load, min_fault_s=max(load.min_fault_s, 3.0)), tag="oneway")


def slow_link(load: Load, started: list[int]) -> Costs:
    heavy = replace(load, pace=0.0, pad=1000, before=load.before // 2,
                    during=load.during * 4, min_fault_s=max(3.0, load.min_fault_s / 2))
    with mesh(3) as (lab, hosts, c):
        started += pids(c)
        return under_fault(lambda: slow(lab, hosts[2]), c.bases[:2], c.bases, heavy,
                           tag="slow")


FAULTS: dict[str, tuple[str, Callable[[Load, list[int]], Costs]]] = {
    "member_cut": ("mesh: 1 of 3 cut off from its peers", member_cut),
    "redis_cut": ("redis: 1 of 3 nodes cut from Redis", redis_cut),
    "one_way": ("mesh: node 1 -> node 2 dropped", one_way),
    "slow_link": ("mesh: node 3's link at 1 Mbit/s", slow_link),
}
COLUMNS = [("acked", "acked"), ("unacked", "no 201"), ("deliveries", "delivered"),
           ("delayed", ">1 s late"), ("max_lag_during_cut_s", "max lag s"), ("gaps", "gaps"),
           ("cut_s", "fault s"), ("heal_s", "heal s"), ("dropped", "pkts lost"),
           ("problems", "broken")]


def bench_faults(ctx: Context, quick: bool) -> dict[str, Any]:
    reason = skip_reason()
    if reason is not None:
        ctx.log(f"faults: skipped: {reason}")
        return {"skipped": reason}
    load = QUICK if quick else FULL
    out: dict[str, Any] = {"load": load.__dict__, "faults": {}}
    for key, (what, play) in FAULTS.items():
        t0 = time.monotonic()
        started: list[int] = []
        costs = play(load, started)
        out["faults"][key] = {"what": what, **costs.figures(), "kept": not costs.problems,
                              "pids": started,
                              "problems": costs.problems[:20],
                              "problem_count": len(costs.problems),
                              "took_s": round(time.monotonic() - t0, 1)}
        ctx.log(f"   {key}: {costs.figures()} problems={len(costs.problems)}")
    ctx.log(table(out))
    return out


def table(result: dict[str, Any]) -> str:
    """One line per fault, its costs in columns."""
    head = ["fault".ljust(38), *(h.rjust(9) for _, h in COLUMNS)]
    lines = [" ".join(head)]
    for f in result["faults"].values():
        cells = [str(f["problem_count"] if k == "problems" else f.get(k, "-")).rjust(9)
                 for k, _ in COLUMNS]
        lines.append(" ".join([f["what"].ljust(38), *cells]))
    return "\n".join(lines)
