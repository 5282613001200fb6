"""The mesh and the Redis backplane side by side: the same 3-node figures, same run.

For each engine a 3-node ``LocalCluster`` (no HAProxy; with ``engine="redis"`` it
runs a redis-server of its own) is measured for: publishes/s on node 1, lag from
a publish on node 1 to a poll held on node 2 (idle and under that publish load),
fan-out of one publish to subscribers spread over the three nodes (cluster.py's
fan-out, one fresh cluster per engine), and CPU per message of every process:
redis-server, the accepting node, and the nodes that only read. (On the mesh a
reading node stores every message; on Redis only those of the partitions its
clients read: here node 2's lag sampler's channel, so its "reading node" figure
is what a node pays for the messages of channels none of its clients follow.) Both clusters
stay up together so the publish-rate repetitions alternate between engines and
the shared machine's noise falls on both alike.
This module starts processes only through ``LocalCluster``, which stops them by
PID; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from deploy.launch import LocalCluster

from . import procfs
from .cluster import NODE_ARGS, Control, _lag_sampler, _wait, bench_cluster_fanout
from .report import grid
from .scenarios import BenchError, Context, percentile

ENGINES = ("mesh", "redis")
NODES = 3
SETTLE_S = 60.0  # every node must hold what it takes this soon after a publish run


def bench_engines(ctx: Context, publishers: int, duration: float, reps: int,
                  lag_samples: int, n: int, publishes: int, round_timeout: float,
                  scaling_nodes: Sequence[int] = ()) -> dict[str, Any]:
    """Figures per engine under ``engines``, and Redis / mesh ratios under ``ratios``.
    With `scaling_nodes`, one more publish run per engine on clusters of those sizes
    (CPU per message against the node count, under ``engines.<e>.by_nodes``)."""
    out: dict[str, Any] = {"nodes": NODES, "publishers": publishers, "duration_s": duration,
                           "reps": reps, "subscribers": n, "publishes": publishes,
                           "engines": {e: {"samples": [], "by_nodes": {}} for e in ENGINES}}
    res = out["engines"]
    with contextlib.ExitStack() as stack:
        clusters = {}
        for engine in ENGINES:
            workdir = ctx.out_dir / f"engines-{ctx.stamp}-{engine}"
            clusters[engine] = stack.enter_context(LocalCluster(
                NODES, haproxy=False, node_args=NODE_ARGS, workdir=str(workdir),
                engine=engine))
        for engine, c in clusters.items():
            # Recorded so a caller can check that every process started was stopped.
            res[engine]["pids"] = _pids(c) + ([c.redis.pid] if c.redis is not None else [])
            res[engine].update(_idle_lag(c, lag_samples, f"lag-idle-{engine}"))
            ctx.log(f"    {engine}: idle lag node 1 -> node 2 p50 "
                    f"{res[engine]['lag_idle_p50_ms']:.2f} ms, p99 "
                    f"{res[engine]['lag_idle_p99_ms']:.2f} ms")
        for rep in range(reps):
            for engine, c in clusters.items():
                s = _publish_run(ctx, engine, c, publishers, duration, rep)
                res[engine]["samples"].append(s)
                ctx.log(f"    {engine} rep {rep}: {s['per_second']:,.0f} publishes/s; CPU per "
                        f"message: redis {_us(s['redis_us_per_message'])}, node 1 "
                        f"{s['node_us_per_message'][0]:.0f} µs, reading node "
                        f"{s['reader_us_per_message']:.0f} µs")
        ctx.pool.close_all()
    for engine in ENGINES:
        res[engine].update(_summary(res[engine]["samples"]))
        fan = bench_cluster_fanout(ctx, [NODES], n, publishes, round_timeout,
                                   engine=engine)[str(NODES)]
        res[engine]["fanout"] = fan
        ctx.log(f"    {engine}: fan-out to {n:,} over {NODES} nodes, last p50 "
                f"{1000 * fan['last_p50_s']:.0f} ms")
        res[engine]["by_nodes"][str(NODES)] = _scale_row(res[engine],
                                                         res[engine]["node1_us_per_message"])
    for k in sorted(set(scaling_nodes) - {NODES}):
        for engine in ENGINES:
            s = _scaling_run(ctx, engine, k, publishers, duration)
            res[engine]["by_nodes"][str(k)] = _scale_row(s, s["node_us_per_message"][0])
    out["ratios"] = {row["figure"]: row["ratio"] for row in rows(out)}
    return out


def _scaling_run(ctx: Context, engine: str, k: int, publishers: int,
                 duration: float) -> dict[str, Any]:
    workdir = ctx.out_dir / f"engines-{ctx.stamp}-{engine}-{k}"
    with LocalCluster(k, haproxy=False, node_args=NODE_ARGS, workdir=str(workdir),
                      engine=engine) as c:
        s = _publish_run(ctx, engine, c, publishers, duration, 0)
        ctx.pool.close_all()
    ctx.log(f"    {engine}, {k} node(s): {s['per_second']:,.0f} publishes/s; CPU per "
            f"message: redis {_us(s['redis_us_per_message'])}, node 1 "
            f"{s['node_us_per_message'][0]:.0f} µs, reading node "
            f"{_us(s['reader_us_per_message'])}, all {s['cluster_us_per_message']:.0f} µs")
    return s


def _scale_row(r: dict[str, Any], node1_us: float) -> dict[str, Any]:
    return {"per_second": r["per_second"], "redis_us_per_message": r["redis_us_per_message"],
            "node1_us_per_message": node1_us,
            "reader_us_per_message": r["reader_us_per_message"],
            "cluster_us_per_message": r["cluster_us_per_message"]}


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} µs"


def _idle_lag(c: LocalCluster, samples: int, channel: str) -> dict[str, Any]:
    """Publish on node 1, one at a time, each timed to its receipt by a poll on node 2."""
    lags: list[float] = []
    errors: list[str] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_lag_sampler, daemon=True, args=(
        c.node_ports[1], c.node_ports[0], stop, 0.0, channel, lags, errors))
    sampler.start()
    try:
        _wait(f"{samples} idle lag samples", lambda: len(lags) >= samples or bool(errors), 120)
    finally:
        _stop_sampler(c, stop, sampler, channel)
    if errors:
        raise BenchError(f"lag sampler: {errors[:3]}")
    return {"lag_idle_p50_ms": 1000 * percentile(lags, 50),
            "lag_idle_p99_ms": 1000 * percentile(lags, 99), "lag_idle_samples": len(lags)}


def _stop_sampler(c: LocalCluster, stop: threading.Event, sampler: threading.Thread,
                  channel: str) -> None:
    """Stop a `_lag_sampler`: one more publish answers its held poll (else the poll
    would hold its thread for up to its 5 s timeout)."""
    stop.set()
    time.sleep(0.05)  # its publishing loop sees `stop` after its current publish
    Control(c.node_ports[0]).request("POST", "/publish",
                                     {"channels": [channel], "data": {"seq": -1}})
    sampler.join(15)


def _settled(engine: str, c: LocalCluster, nodes: list[Control]) -> Callable[[], bool]:
    """Every node holds what it takes from the run: on the mesh, every message
    (no peer queue left); on Redis, every message of the partitions it follows
    (its clients' channels only): its horizon stopped moving for 0.1 s."""
    if engine == "mesh":
        return lambda: all(p["queued"] == 0 for x in nodes for p in x.stats()["peers"])
    seen: list[tuple[list[int], float]] = []

    def quiet() -> bool:
        now = [x.stats()["redis"]["horizon"] for x in nodes]
        if not seen or seen[0][0] != now:
            seen[:] = [(now, time.monotonic())]
            return False
        return time.monotonic() - seen[0][1] >= 0.1

    return quiet


def _pids(c: LocalCluster) -> list[int]:
    return [p.pid for p in c.nodes if p is not None]


def _commandstats(c: LocalCluster) -> dict[str, dict[str, float]]:
    """Redis's own accounting per command: calls and µs spent executing them."""
    assert c.redis is not None
    out = {}
    for line in c.redis.cli("INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[8:].split(":", 1)
            kv = dict(f.split("=", 1) for f in fields.split(","))
            out[name] = {"calls": int(kv["calls"]), "usec": int(kv["usec"])}
    return out


def _publish_run(ctx: Context, engine: str, c: LocalCluster, publishers: int,
                 duration: float, rep: int) -> dict[str, Any]:
    """`publishers` keep-alive publishers on node 1 for `duration` s, a lag sampler
    alongside (node 1 -> node 2, one publish per 50 ms); CPU until every node holds
    what it takes (``_settled``)."""
    nodes = [Control(p) for p in c.node_ports]
    redis_pid = c.redis.pid if c.redis is not None else None
    if c.redis is not None:
        c.redis.cli("CONFIG", "RESETSTAT")
    published0 = nodes[0].stats()["published"]
    node0 = [procfs.cpu_seconds(p) for p in _pids(c)]
    redis0 = procfs.cpu_seconds(redis_pid) if redis_pid else 0.0
    snap0 = procfs.snapshot(_pids(c) + ([redis_pid] if redis_pid else []), ctx.pool.pids)
    lags: list[float] = []
    errors: list[str] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_lag_sampler, daemon=True, args=(
        c.node_ports[min(1, len(nodes) - 1)], c.node_ports[0], stop, 0.05,
        f"lag-{engine}-{rep}", lags, errors))
    sampler.start()
    try:
        lat, counters = ctx.pool.publish(c.node_ports[0], publishers, duration,
                                         f"bench-engines-{engine}-{rep}")
        stop.set()  # the sampler's one publish per 50 ms ends with the load
        t_end = time.monotonic()
        _wait(f"{engine}: every node holds what it takes",
              _settled(engine, c, nodes), SETTLE_S)
        settle_s = time.monotonic() - t_end
        snap1 = procfs.snapshot(_pids(c) + ([redis_pid] if redis_pid else []), ctx.pool.pids)
        node_cpu = [procfs.cpu_seconds(p) - a for p, a in zip(_pids(c), node0, strict=True)]
        redis_cpu = procfs.cpu_seconds(redis_pid) - redis0 if redis_pid else None
        messages = nodes[0].stats()["published"] - published0
        commandstats = _commandstats(c) if c.redis is not None else None
    finally:
        _stop_sampler(c, stop, sampler, f"lag-{engine}-{rep}")
    ok = counters.get("publish_ok", 0)
    if not ok or not messages:
        raise BenchError(f"{engine}: nothing published ({counters})")
    lat_ms = sorted(1000 * x for x in lat)
    per = 1e6 / messages  # seconds per run -> µs per message
    sample: dict[str, Any] = {
        "ok": ok, "per_second": ok / duration, "messages": messages,
        "latency_p50_ms": percentile(lat_ms, 50), "latency_p99_ms": percentile(lat_ms, 99),
        "settle_s": round(settle_s, 2),
        "node_cpu_s": [round(x, 2) for x in node_cpu],
        "node_us_per_message": [x * per for x in node_cpu],
        # Nodes 2..N only read (propagation in, the store, the hub): the cost every
        # node pays for every message, wherever it was published.
        "reader_us_per_message": statistics.mean(node_cpu[1:]) * per
        if len(node_cpu) > 1 else None,
        "redis_cpu_s": None if redis_cpu is None else round(redis_cpu, 2),
        "redis_us_per_message": None if redis_cpu is None else redis_cpu * per,
        "cluster_us_per_message": (sum(node_cpu) + (redis_cpu or 0.0)) * per,
        "lag_loaded_ms": [1000 * x for x in lags], "lag_errors": errors[:5],
        "usage": procfs.usage(snap0, snap1), "client_counters": counters,
    }
    if commandstats is not None:
        sample["redis_commandstats"] = commandstats
    return sample


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions (latency percentiles over all loaded samples)."""
    def med(key: str) -> float | None:
        vals = [s[key] for s in samples if s[key] is not None]
        return statistics.median(vals) if vals else None

    loaded = [x for s in samples for x in s["lag_loaded_ms"]]
    return {
        "per_second": med("per_second"),
        "per_second_range": [min(s["per_second"] for s in samples),
                             max(s["per_second"] for s in samples)],
        "publish_latency_p50_ms": med("latency_p50_ms"),
        "redis_us_per_message": med("redis_us_per_message"),
        "node1_us_per_message": statistics.median(s["node_us_per_message"][0]
                                                  for s in samples),
        "reader_us_per_message": med("reader_us_per_message"),
        "cluster_us_per_message": med("cluster_us_per_message"),
        "lag_loaded_p50_ms": percentile(loaded, 50) if loaded else None,
        "lag_loaded_p99_ms": percentile(loaded, 99) if loaded else None,
        "lag_loaded_samples": len(loaded),
        "server_cpu_pct": statistics.median(s["usage"]["server_cpu_pct"] for s in samples),
        "generator_cpu_pct": statistics.median(s["usage"]["generator_cpu_pct"]
                                               for s in samples),
        "others_cpu_pct": statistics.median(s["usage"]["others_cpu_pct"] for s in samples),
    }


# -- the table ---------------------------------------------------------------------------

def _figures(res: dict[str, Any]) -> list[tuple[str, str, str, float]]:
    """(figure, unit, field path, scale) for the side-by-side table."""
    n = res["subscribers"]
    return [
        (f"publishes/s on node 1, {res['publishers']} publishers", "/s", "per_second", 1),
        ("publish answered, p50", "ms", "publish_latency_p50_ms", 1),
        ("lag node 1 -> poll on node 2, idle: p50", "ms", "lag_idle_p50_ms", 1),
        ("lag node 1 -> poll on node 2, idle: p99", "ms", "lag_idle_p99_ms", 1),
        ("lag under the publish load: p50", "ms", "lag_loaded_p50_ms", 1),
        ("lag under the publish load: p99", "ms", "lag_loaded_p99_ms", 1),
        (f"fan-out to {n:,} over {NODES} nodes: last p50", "ms", "fanout.last_p50_s", 1000),
        (f"fan-out to {n:,} over {NODES} nodes: last p99", "ms", "fanout.last_p99_s", 1000),
        ("fan-out delivered", "%", "fanout.delivered_pct", 1),
        ("redis-server CPU per message", "µs", "redis_us_per_message", 1),
        ("node 1 (accepts the publish) CPU per message", "µs", "node1_us_per_message", 1),
        ("reading node CPU per message (each of nodes 2, 3)", "µs", "reader_us_per_message", 1),
        ("all processes' CPU per message", "µs", "cluster_us_per_message", 1),
    ]


def _value(r: dict[str, Any], path: str, scale: float) -> float | None:
    for key in path.split("."):
        if not isinstance(r, dict) or r.get(key) is None:
            return None
        r = r[key]
    return float(r) * scale  # type: ignore[arg-type]


def rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: each engine's value and Redis / mesh."""
    out = []
    for figure, unit, path, scale in _figures(res):
        values = {e: _value(res["engines"].get(e, {}), path, scale) for e in ENGINES}
        m, r = values["mesh"], values["redis"]
        out.append({"figure": figure, "unit": unit, "values": values,
                    "ratio": None if m is None or r is None or not m else r / m})
    return out


def fmt(v: float | None, unit: str) -> str:
    """A figure with its unit, as the engines and workers tables print it."""
    if v is None:
        return "-"
    if unit == "/s":
        return f"{v:,.0f}/s"
    if unit == "%":
        return f"{v:.2f} %"
    return f"{v:,.2f} {unit}" if v < 10 else f"{v:,.0f} {unit}"


def table(res: dict[str, Any]) -> str:
    """The side-by-side figures, then CPU per message against the node count."""
    lines = [f"Mesh and Redis, {NODES} nodes: {res['reps']} x {res['duration_s']:.0f} s of "
             f"publishing (medians), {res['publishes']} fan-out publishes", ""]
    lines += grid(["figure", "mesh", "redis", "redis / mesh"], [
        [r["figure"], fmt(r["values"]["mesh"], r["unit"]), fmt(r["values"]["redis"], r["unit"]),
         "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"] for r in rows(res)])
    for e in ENGINES:
        r = res["engines"].get(e, {})
        if "server_cpu_pct" in r:
            lines.append(f"  publish runs, {e}: servers {r['server_cpu_pct']:.0f}%, generator "
                         f"{r['generator_cpu_pct']:.0f}%, others {r['others_cpu_pct']:.0f}% "
                         "of a core")
    by = {(int(k), e): b for e in ENGINES
          for k, b in res["engines"].get(e, {}).get("by_nodes", {}).items()}
    if len({k for k, _ in by}) > 1:
        lines += ["", f"CPU per message against the number of nodes (one run each; {NODES}: "
                  "the medians above):", ""]
        lines += grid(
            ["nodes", "engine", "publishes/s", "redis-server", "node 1", "each reader",
             "all processes"],
            [[str(k), e, fmt(b["per_second"], "/s"), fmt(b["redis_us_per_message"], "µs"),
              fmt(b["node1_us_per_message"], "µs"), fmt(b["reader_us_per_message"], "µs"),
              fmt(b["cluster_us_per_message"], "µs")] for (k, e), b in sorted(by.items())])
    return "\n".join(lines)
