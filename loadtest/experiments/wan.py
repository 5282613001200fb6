"""Experiment 2 (seed 002): what the link's MTU and a bandwidth cap cost a fan-out.

The subscribers live in a namespace of our own behind a veth pair (netns.py);
the server listens on its end, 10.233.0.1, in the root namespace (publishing
open there: the address exists only on this private pair). For each MTU a fresh
server gets S held polls (fresh connections, so their MSS follows the MTU);
each round publishes one message of a given size and every subscriber re-polls
at once. A round's window runs from the publish until every re-poll is held
again, so its CPU and packets include the re-polls. Bandwidth caps (tc tbf)
are measured at MTU 1500.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench.pool import WorkerPool
from loadtest.bench.server import Server

from . import netns
from .measure import HOLD, Recorder, Window, percentile, start_server
from .rate import rate_worker_main


@dataclass(frozen=True)
class Plan:
    subscribers: int
    sizes: tuple[int, ...]
    mtus: tuple[int, ...]
    caps: tuple[str | None, ...]  # tbf rates, at MTU 1500 and `cap_size`
    cap_size: int
    rounds: int
    workers: int = 1

    def points(self) -> int:
        return len(self.mtus) * len(self.sizes) + len(self.caps)


PLANS = {
    "smoke": Plan(subscribers=20, sizes=(100, 2048), mtus=(1500, 296), caps=(None, "10mbit"),
                  cap_size=2048, rounds=2),
    "full": Plan(subscribers=2000, sizes=(100, 2048, 10240), mtus=(1500, 1280, 576, 296),
                 caps=(None, "1gbit", "100mbit", "20mbit"), cap_size=2048, rounds=6),
}


def fanout_rounds(pool: WorkerPool, srv: Server, subs: list[int], size: int, rounds: int,
                  first_round: int) -> dict[str, Any]:
    """`rounds` measured fan-outs (after one unmeasured) of a `size`-byte message."""
    total = sum(subs)
    channel = "fan"
    pad = "x" * max(size - 40, 0)  # the JSON envelope of the data is about 40 bytes
    window = Window(srv.pids, pool.pids + [os.getpid()])
    trips: list[float] = []
    lasts: list[float] = []
    delivered = 0
    link0 = seg0 = None
    drops0 = 0
    for i in range(rounds + 1):
        r = first_round + i
        if i == 1:  # round 0 warms caches and buffers; the window starts after it
            link0, seg0 = netns.link_counters(), netns.tcp_segments(pool.pids[0])
            drops0 = netns.qdisc_drops()
            window.begin()
        t0 = time.time()
        ok, doc = srv.publish(channel, {"bench_round": r, "pad": pad})
        if not ok:
            raise RuntimeError(f"publish refused: {doc!r}")
        times, alive, counters = pool.await_round(r, subs, t0 + 120)
        if alive != total or len(times) != total:
            raise RuntimeError(f"round {r}: {len(times)} of {total} received, {alive} alive, "
                               f"{counters}")
        srv.wait_for("every re-poll held", lambda s: s["waiting"] >= total, timeout=60)
        if i:
            delivered += len(times)
            rel = sorted(t - t0 for t in times)
            trips.append(percentile(rel, 0.5))
            lasts.append(rel[-1])
    cpu = window.end()
    link1, seg1 = netns.link_counters(), netns.tcp_segments(pool.pids[0])
    drops = netns.qdisc_drops() - drops0
    assert link0 is not None and seg0 is not None
    d = {k: link1[k] - link0[k] for k in link1}
    segs = {k: seg1[k] - seg0[k] for k in seg1}
    server_cpu = cpu["server_user_s"] + cpu["server_sys_s"]
    return {
        "size": size, "subscribers": total, "rounds": rounds, "deliveries": delivered,
        "server_cpu_us_per_delivery": round(1e6 * server_cpu / delivered, 2),
        "server_user_us_per_delivery": round(1e6 * cpu["server_user_s"] / delivered, 2),
        "server_sys_us_per_delivery": round(1e6 * cpu["server_sys_s"] / delivered, 2),
        "packets_per_delivery": round((d["tx_packets"] + d["rx_packets"]) / delivered, 2),
        "tx_packets_per_delivery": round(d["tx_packets"] / delivered, 2),
        "rx_packets_per_delivery": round(d["rx_packets"] / delivered, 2),
        "tx_bytes_per_delivery": round(d["tx_bytes"] / delivered, 1),
        "tcp_segments_per_delivery": round((segs["InSegs"] + segs["OutSegs"]) / delivered, 2),
        "retrans_segments": segs["RetransSegs"], "tx_dropped": d["tx_dropped"],
        "qdisc_drops": drops,
        "trip_p50_ms": round(1000 * statistics.median(trips), 2),
        "trip_last_ms": round(1000 * statistics.median(lasts), 2),
        **cpu,
    }


def run(plan: Plan, repo: Path, out: Path, rec: Recorder, stamp: str = "") -> None:
    with netns.private_link():
        args = (netns.NETNS_PATH, netns.SERVER_IP, [netns.CLIENT_IP])
        with WorkerPool(plan.workers, target=rate_worker_main, extra_args=args) as pool:
            groups: list[tuple[int, tuple[int, ...], tuple[str | None, ...]]] = [
                (mtu, plan.sizes, (None,)) for mtu in plan.mtus]
            groups.append((1500, (plan.cap_size,), plan.caps))
            for g, (mtu, sizes, caps) in enumerate(groups):
                netns.set_mtu(mtu)
                srv = start_server(repo, out, f"wan-{mtu}", "epoll", 19000,
                                   host=netns.SERVER_IP, extra=["--allow-open-publish"])
                try:
                    srv.warm_up()
                    subs, _ = pool.subscribe(srv.port, plan.subscribers, "fan", HOLD)
                    srv.wait_for("subscribers held",
                                 lambda s: s["waiting"] >= plan.subscribers, timeout=120)
                    first = 0
                    for cap in caps:
                        netns.set_bandwidth(cap)
                        for size in sizes:
                            row = fanout_rounds(pool, srv, subs, size, plan.rounds, first)
                            first += plan.rounds + 1
                            row.update(experiment="wan", mtu=mtu, cap=cap or "none",
                                       series="cap" if g == len(groups) - 1 else "mtu",
                                       stamp=stamp)
                            rec.point(row, f"wan MTU {mtu} cap {cap or 'none'} {size} B: "
                                           f"{row['server_cpu_us_per_delivery']} us, "
                                           f"{row['packets_per_delivery']} pkt/delivery, "
                                           f"trip {row['trip_p50_ms']} ms")
                    netns.set_bandwidth(None)
                    pool.close_all()
                finally:
                    srv.stop()
