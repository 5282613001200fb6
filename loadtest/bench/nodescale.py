"""Node scaling (the paper's Figures 12-13) with a CPU budget per node.

For each engine (mesh, Redis) and each node count (1, 2, 4): a ``LocalCluster``
with HAProxy in front; every node moved into its own cgroup with ``cores`` of
CPU (``loadtest.cgroups``); ``n`` long polls on one channel opened through
HAProxy (round robin, so spread over the nodes, and every re-poll balanced
again); then a warm-up publish and ``publishes`` measured publishes on node 1,
at most one a second: each waits until the previous one reached every
subscriber and every re-poll is held again, so each figure is one fan-out.

Trip = a subscriber's receipt time minus the publisher's send time, for every
delivery; trip p50 pools the deliveries of the measured publishes. The load
generator is the bench's raw-epoll client (``client.py``, ``--workers``
processes), outside every budget like HAProxy and redis-server; the CPU of
each (percent of one core over the measured span) and of every node is kept
beside each figure, with each group's throttling counters (cpu.stat) and the
machine's load average. Without writable cgroups the run goes on unbudgeted
and its record says so (``budget_cores`` None, ``budget_note`` why).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from deploy.launch import LocalCluster

from .. import cgroups
from . import procfs
from .cluster import NODE_ARGS, Control, _waiting
from .scenarios import BenchError, Context, percentile

ENGINES = ("mesh", "redis")
POLL_TIMEOUT = 100  # < HAProxy's 150 s server/client timeouts (deploy/haproxy.cfg.template)


def bench_node_scaling(ctx: Context, node_counts: list[int], n: int, publishes: int,
                       interval: float, cores: float, round_timeout: float,
                       shares: int = 0, engines: tuple[str, ...] = ENGINES) -> dict[str, Any]:
    out: dict[str, Any] = {"subscribers": n, "publishes": publishes, "interval_s": interval,
                           "generator": f"raw-epoll client, {len(ctx.pool.pids)} processes",
                           "engines": {}}
    for engine in engines:
        rows: dict[str, Any] = {}
        for k in node_counts:
            rows[str(k)] = _one(ctx, engine, k, n, publishes, interval, cores, round_timeout,
                                shares)
        base = rows.get("1", {}).get("trip_p50_s")
        for r in rows.values():
            r["speedup_p50"] = (round(base / r["trip_p50_s"], 2)
                                if base and r.get("trip_p50_s") else None)
        out["engines"][engine] = rows
    first = next(iter(out["engines"].values()))
    first_row = next(iter(first.values()))
    out["budget_cores"] = first_row["budget_cores"]
    out["budget_note"] = first_row["budget_note"]
    return out


def _wait(what: str, predicate: Any, timeout: float) -> None:
    """Until ``predicate()``; asks 4 times a second, so the nodes' /stats answers
    take little of their budgets (cluster._wait asks 50 times)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.25)


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += procfs.cpu_seconds(pid)
        except OSError:
            pass
    return total


def _one(ctx: Context, engine: str, k: int, n: int, publishes: int, interval: float,
         cores: float, round_timeout: float, shares: int) -> dict[str, Any]:
    workdir = ctx.out_dir / f"scale-{ctx.stamp}-{engine}-{k}"
    run = f"{ctx.stamp}-{os.getpid()}-{engine}{k}"
    load0 = os.getloadavg()
    with cgroups.CpuBudgets(run, cores, log=ctx.log) as budgets, \
            LocalCluster(k, node_args=NODE_ARGS, workdir=str(workdir), engine=engine) as c:
        node_pids = [p.pid for p in c.nodes if p is not None]
        for i, pid in enumerate(node_pids):
            budgets.assign(f"node{i + 1}", pid)
        if shares:
            for pid in [h.pid for h in c.haproxies] + ctx.pool.pids + (
                    [c.redis.pid] if c.redis is not None else []):
                budgets.favour("front", pid, shares)
        nodes = [Control(port) for port in c.node_ports]
        channel = f"bench-scale-{engine}-{k}"
        opened, _ = ctx.pool.subscribe(c.front_port, n, channel, POLL_TIMEOUT, True)
        if sum(opened) < n:
            raise BenchError(f"only {sum(opened)}/{n} subscribers connected through HAProxy")
        _wait(f"{n} held over {k} nodes", lambda: _waiting(nodes) >= n, 180)
        held = [x.stats()["waiting"] for x in nodes]
        others = {"haproxy": [h.pid for h in c.haproxies],
                  "redis": [c.redis.pid] if c.redis is not None else [],
                  "generator": ctx.pool.pids}
        # CPU while fan-outs are in flight (publish sent .. last receipt), per process
        busy_pids = ctx.pool.pids + others["haproxy"]
        busy: dict[int, float] = {}
        busy_wall = 0.0
        trips: list[float] = []
        rounds: list[dict[str, Any]] = []
        statuses: dict[str, int] = {}
        cpu0: dict[str, float] = {}
        throttle0: dict[str, dict[str, int]] = {}
        t_start = last_publish = 0.0
        for r in range(publishes + 1):  # round 0 warms up and is not counted
            alive, _ = ctx.pool.counters()
            expected = sum(alive)
            _wait("re-polls held again", lambda e=expected: _waiting(nodes) >= e, 120)
            time.sleep(max(0.0, last_publish + interval - time.monotonic()))
            if r == 1:
                cpu0 = {f"node{i + 1}": _cpu([p]) for i, p in enumerate(node_pids)}
                cpu0.update({role: _cpu(pids) for role, pids in others.items()})
                throttle0 = budgets.throttling()
                t_start = time.monotonic()
            last_publish = time.monotonic()
            busy0 = {pid: _cpu([pid]) for pid in busy_pids}
            t0 = time.time()
            status, doc = nodes[0].request(
                "POST", "/publish",
                {"channels": [channel], "data": {"bench_round": r, "pad": "x" * 64}})
            # 202: stored on node 1, not yet confirmed by a peer in time (--publish-ack
            # peer); it still reaches everyone, which "delivered" checks.
            if status not in (201, 202):
                raise BenchError(f"publish answered {status}: {doc!r}")
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            times, _, counters = ctx.pool.await_round(r, alive, t0 + round_timeout)
            lat = sorted(t - t0 for t in times)
            if r == 0:
                continue
            busy_wall += time.time() - t0
            for pid in busy_pids:
                busy[pid] = busy.get(pid, 0.0) + _cpu([pid]) - busy0[pid]
            trips.extend(lat)
            rounds.append({"delivered": len(lat), "expected": expected,
                           "p50_s": round(percentile(lat, 50), 4) if lat else None,
                           "last_s": round(lat[-1], 4) if lat else None})
            ctx.log(f"    {engine} {k} node(s) publish {r}: delivered {len(lat)}/{expected}, "
                    f"p50 {percentile(lat, 50):.3f} s, last {lat[-1] if lat else 0:.3f} s")
        wall = time.monotonic() - t_start
        cpu = {f"node{i + 1}": _cpu([p]) for i, p in enumerate(node_pids)}
        cpu.update({role: _cpu(pids) for role, pids in others.items()})
        throttle = budgets.throttling()
        ctx.pool.close_all()
        applied = budgets.available
        note = budgets.reason
    delivered = sum(x["delivered"] for x in rounds)
    cpu_pct = {role: round(100 * (cpu[role] - cpu0.get(role, 0.0)) / wall, 1) for role in cpu}
    return {
        "engine": engine, "nodes": k, "subscribers": n, "held_per_node": held,
        "budget_cores": cores if applied else None, "budget_note": note or None,
        "front_shares": shares if applied and shares else None,
        "trip_p50_s": round(percentile(trips, 50), 4) if trips else None,
        "trip_p90_s": round(percentile(trips, 90), 4) if trips else None,
        "trip_p99_s": round(percentile(trips, 99), 4) if trips else None,
        "last_p50_s": round(percentile([x["last_s"] for x in rounds if x["last_s"]], 50), 4),
        "delivered_pct": round(100.0 * delivered / max(1, sum(x["expected"] for x in rounds)),
                               2),
        "cpu_pct": cpu_pct,
        "in_fanout_cpu_pct": {
            "generator_busiest_process": round(max(
                100 * busy.get(p, 0.0) / busy_wall for p in ctx.pool.pids), 1),
            "generator": round(100 * sum(busy.get(p, 0.0) for p in ctx.pool.pids) / busy_wall, 1),
            "haproxy": round(100 * sum(busy.get(p, 0.0) for p in others["haproxy"]) / busy_wall,
                             1)},
        "node_cpu_pct_max": max(cpu_pct[f"node{i + 1}"] for i in range(k)),
        "throttled": {g: {"periods": v.get("nr_periods", 0) - throttle0.get(g, {}).get(
                              "nr_periods", 0),
                          "throttled": v.get("nr_throttled", 0) - throttle0.get(g, {}).get(
                              "nr_throttled", 0)}
                      for g, v in throttle.items()},
        "wall_s": round(wall, 1), "loadavg_before": load0, "loadavg_after": os.getloadavg(),
        "publish_statuses": statuses, "client_counters": counters, "rounds": rounds,
    }


def table(res: dict[str, Any]) -> str:
    """The figures as a Markdown table, a row per (engine, nodes)."""
    budget = (f"{res['budget_cores']:g} core per node" if res.get("budget_cores")
              else f"NO budgets ({res.get('budget_note')})")
    lines = [f"Node scaling: {res['subscribers']} long polls through HAProxy, "
             f"{res['publishes']} publishes on node 1; {budget}; generator "
             f"{res['generator']}",
             "",
             "| engine | nodes | trip p50 s | p90 s | last p50 s | 1 node ÷ this | delivered "
             "| busiest node CPU % | HAProxy % | redis % | generator % (in fan-outs; busiest "
             "process) | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for engine, rows in res["engines"].items():
        for k, r in rows.items():
            c = r["cpu_pct"]
            lines.append(
                f"| {engine} | {k} | {r['trip_p50_s']} | {r['trip_p90_s']} | {r['last_p50_s']} "
                f"| {r['speedup_p50']} | {r['delivered_pct']} % | {r['node_cpu_pct_max']} "
                f"| {c['haproxy']} | {c['redis'] if r['engine'] == 'redis' else '-'} "
                f"| {c['generator']} ({r['in_fanout_cpu_pct']['generator']}; "
                f"{r['in_fanout_cpu_pct']['generator_busiest_process']}) "
                f"| {r['loadavg_before'][0]:.2f} |")
    return "\n".join(lines)


def write(record: dict[str, Any], res: dict[str, Any], out: Path) -> None:
    """The run's record (JSON), the table (report.md) and Figures 12-13 (PNG) in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(record, indent=2, default=str))
    machine = record.get("machine", {})
    (out / "report.md").write_text(
        f"# Node scaling under per-node CPU budgets (Figures 12-13)\n\n"
        f"`{record.get('command')}`, started {record.get('started')}; load average "
        f"{machine.get('loadavg_at_start', [0])[0]:.2f} at the start, "
        f"{machine.get('loadavg_at_end', [0])[0]:.2f} at the end (2 cores, shared).\n\n"
        + table(res) + "\n\n![fig12](fig12_trip_nodes.png)\n![fig13](fig13_delivered_nodes.png)\n")
    engines = res["engines"]
    fig, (top, low) = plt.subplots(2, 1, figsize=(7, 7), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 2]})
    for (engine, rows), colour in zip(engines.items(), ("C0", "C3"), strict=False):
        ks = [int(k) for k in rows]
        top.plot(ks, [rows[str(k)]["trip_p50_s"] for k in ks], "o-", color=colour,
                 label=f"{engine}: trip p50")
        top.plot(ks, [rows[str(k)]["trip_p90_s"] for k in ks], "x:", color=colour,
                 label=f"{engine}: p90")
        low.plot(ks, [rows[str(k)]["in_fanout_cpu_pct"]["generator_busiest_process"]
                      for k in ks], "o-", color=colour,
                 label=f"{engine}: busiest generator process")
        low.plot(ks, [rows[str(k)]["in_fanout_cpu_pct"]["haproxy"] for k in ks], "s--",
                 color=colour, label=f"{engine}: HAProxy")
        low.plot(ks, [rows[str(k)]["node_cpu_pct_max"] for k in ks], "^:", color=colour,
                 label=f"{engine}: busiest node (whole run)")
        base = rows.get("1", {}).get("trip_p50_s")
        if base:
            top.plot(ks, [base / k for k in ks], color="grey", lw=0.8, ls="--")
    budget = res.get("budget_cores")
    top.set_title(f"Fig. 12: {res['subscribers']:,} long polls via HAProxy, "
                  + (f"{budget:g} core per node" if budget else "NO CPU budgets")
                  + " (grey: 1 node / N)")
    top.set_ylabel("publish trip time, s")
    top.legend(fontsize=8)
    low.set_ylabel("CPU % of a core\n(during fan-outs)")
    low.set_xlabel("nodes")
    low.set_xticks(sorted({int(k) for rows in engines.values() for k in rows}))
    low.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "fig12_trip_nodes.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for engine, rows in engines.items():
        ks = [int(k) for k in rows]
        ax.plot(ks, [rows[str(k)]["delivered_pct"] for k in ks], "o-", label=engine)
    ax.set_ylim(0, 105)
    ax.set_title("Fig. 13: messages received, % of (publishes x subscribers)")
    ax.set_xlabel("nodes")
    ax.set_ylabel("%")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fig13_delivered_nodes.png", dpi=110)
    plt.close(fig)
