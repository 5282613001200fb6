"""Cluster benchmarks: fan-out through 1, 2 and 4 nodes; propagation rate and lag;
what ``--publish-ack`` costs a publisher.

Real nodes from ``deploy.launch.LocalCluster`` (peered, signed links), driven by
the same load workers as the single-node benchmarks. Subscribers are spread
evenly over the nodes; every publish goes to node 1, so the other nodes'
subscribers are answered through propagation. Server CPU is summed over all
node processes.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from typing import Any

from deploy.launch import LocalCluster

from . import procfs
from .pool import split
from .scenarios import HOLD_TIMEOUT, BenchError, Context, percentile

NODE_ARGS = ["--max-connections", "20000", "--max-timeout", str(HOLD_TIMEOUT)]


class Control:
    """A keep-alive control connection to one node."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body).encode()
        self.conn.request(method, path, body=payload,
                          headers={"Content-Type": "application/json"} if payload else {})
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None

    def stats(self) -> dict[str, Any]:
        return self.request("GET", "/stats")[1]  # type: ignore[no-any-return]


def _wait(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _waiting(nodes: list[Control]) -> int:
    return sum(x.stats()["waiting"] for x in nodes)


def _cpu(cluster: LocalCluster) -> float:
    """CPU seconds of every node, and of the cluster's own redis-server if it has one."""
    pids = [p.pid for p in cluster.nodes if p is not None]
    return sum(procfs.cpu_seconds(pid) for pid in pids
               + ([cluster.redis.pid] if cluster.redis is not None else []))


def bench_cluster_fanout(ctx: Context, node_counts: list[int], n: int, publishes: int,
                         round_timeout: float, engine: str = "mesh") -> dict[str, Any]:
    """`engine` as `LocalCluster` takes it; with "redis" the CPU includes redis-server."""
    out: dict[str, Any] = {}
    for k in node_counts:
        tag = k if engine == "mesh" else f"{engine}-{k}"
        workdir = ctx.out_dir / f"cluster-{ctx.stamp}-{tag}"
        with LocalCluster(k, haproxy=False, node_args=NODE_ARGS, workdir=str(workdir),
                          engine=engine) as c:
            nodes = [Control(port) for port in c.node_ports]
            channel = f"bench-cluster-{k}"
            for i, share in enumerate(split(n, k)):
                ctx.pool.subscribe(c.node_ports[i], share, channel, HOLD_TIMEOUT, True)
            _wait(f"{n} held over {k} nodes", lambda nodes=nodes: _waiting(nodes) >= n, 180)
            cpu0, t_start = _cpu(c), time.monotonic()
            rounds = []
            for r in range(publishes):
                alive, _ = ctx.pool.counters()
                expected = sum(alive)
                _wait("re-polls held again",
                      lambda e=expected, nodes=nodes: _waiting(nodes) >= e, 120)
                t0 = time.time()
                status, doc = nodes[0].request(
                    "POST", "/publish",
                    {"channels": [channel], "data": {"bench_round": r, "pad": "x" * 64}})
                if status != 201:
                    raise BenchError(f"publish answered {status}: {doc!r}")
                times, _, counters = ctx.pool.await_round(r, alive, t0 + round_timeout)
                lat = sorted(t - t0 for t in times)
                rounds.append({"delivered": len(lat), "last_s": lat[-1] if lat else None,
                               "median_s": percentile(lat, 50) if lat else None})
                ctx.log(f"    {k} node(s) publish {r}: delivered {len(lat)}/{n}, "
                        f"last {rounds[-1]['last_s']:.3f} s")
            cpu = _cpu(c) - cpu0
            wall = time.monotonic() - t_start
            ctx.pool.close_all()
        last = [x["last_s"] for x in rounds if x["last_s"] is not None]
        delivered = sum(x["delivered"] for x in rounds)
        out[str(k)] = {
            "nodes": k, "subscribers": n, "publishes": publishes,
            "last_p50_s": percentile(last, 50), "last_p99_s": percentile(last, 99),
            "median_subscriber_p50_s": percentile(
                [x["median_s"] for x in rounds if x["median_s"] is not None], 50),
            "delivered_pct": 100.0 * delivered / (n * publishes),
            "server_cpu_s": round(cpu, 2), "wall_s": round(wall, 1),
            "server_cpu_pct": round(100 * cpu / wall, 0),
            "client_counters": counters, "rounds": rounds,
        }
    return out


def _lag_sampler(sub_port: int, pub_port: int, stop: threading.Event, interval: float,
                 channel: str, lags: list[float], errors: list[str]) -> None:
    """Publish on one node, hold a poll on another; record publish→receipt times."""
    received: dict[int, float] = {}
    got = threading.Condition()

    def poll() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", sub_port, timeout=30)
        cursor = ""
        while not stop.is_set():
            try:
                conn.request("GET", f"/subscribe?channels={channel}&timeout=5{cursor}")
                doc = json.loads(conn.getresponse().read())
            except (OSError, http.client.HTTPException, ValueError) as e:
                errors.append(f"poll: {e}")
                return
            now = time.time()
            cursor = "&since=" + doc["cursor"]
            with got:
                for m in doc["messages"]:
                    received[m["data"]["seq"]] = now
                got.notify_all()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    pub = Control(pub_port)
    seq = 0
    while not stop.is_set():
        t0 = time.time()
        status, _ = pub.request("POST", "/publish", {"channels": [channel], "data": {"seq": seq}})
        if status != 201:
            errors.append(f"publish {status}")
        with got:
            got.wait_for(lambda s=seq: s in received, timeout=10)
        if seq in received:
            lags.append(received[seq] - t0)
        seq += 1
        time.sleep(max(0.0, interval - (time.time() - t0)))
    poller.join(10)


def bench_propagation(ctx: Context, publishers: int, duration: float,
                      lag_samples: int) -> dict[str, Any]:
    """A 3-node cluster: publish rate on node 1 (each publish sent on to 2 peers),
    time for the peers to confirm everything, and peer lag (publish on node 1 to
    receipt by a poll held on node 3), idle and under that publish load."""
    workdir = ctx.out_dir / f"cluster-{ctx.stamp}-propagation"
    with LocalCluster(3, haproxy=False, node_args=NODE_ARGS, workdir=str(workdir)) as c:
        first = Control(c.node_ports[0])
        idle: list[float] = []
        errors: list[str] = []
        stop = threading.Event()
        sampler = threading.Thread(target=_lag_sampler, daemon=True, args=(
            c.node_ports[2], c.node_ports[0], stop, 0.0, "lag-idle", idle, errors))
        sampler.start()
        _wait(f"{lag_samples} idle lag samples", lambda: len(idle) >= lag_samples, 120)
        stop.set()
        sampler.join(15)

        loaded: list[float] = []
        stop = threading.Event()
        sampler = threading.Thread(target=_lag_sampler, daemon=True, args=(
            c.node_ports[2], c.node_ports[0], stop, 0.05, "lag-loaded", loaded, errors))
        published0 = first.stats()["published"]
        cpu0 = _cpu(c)
        sampler.start()
        _, counters = ctx.pool.publish(c.node_ports[0], publishers, duration, "bench-prop")
        t_end = time.monotonic()
        stop.set()
        _wait("peers confirm every message",
              lambda: all(p["queued"] == 0 for p in first.stats()["peers"]), 120)
        settle_s = time.monotonic() - t_end
        cpu = _cpu(c) - cpu0
        sampler.join(15)
        published = first.stats()["published"] - published0
        per_node = [Control(p).stats() for p in c.node_ports]
        ctx.pool.close_all()
    ok = counters.get("publish_ok", 0)
    return {
        "publishers": publishers, "duration_s": duration,
        "per_second": ok / duration, "published": published,
        "peers_confirmed_all_after_s": round(settle_s, 2),
        "messages_per_node": [s["messages"] for s in per_node],
        "cluster_cpu_s": round(cpu, 2),
        "lag_idle_p50_ms": 1000 * statistics.median(idle) if idle else None,
        "lag_idle_p99_ms": 1000 * percentile(idle, 99) if idle else None,
        "lag_loaded_p50_ms": 1000 * statistics.median(loaded) if loaded else None,
        "lag_loaded_p99_ms": 1000 * percentile(loaded, 99) if loaded else None,
        "lag_samples": [len(idle), len(loaded)],
        "errors": errors[:10],
        "client_counters": counters,
    }


def _one_by_one(port: int, count: int, channel: str) -> tuple[list[float], dict[str, int]]:
    """``count`` publishes from one keep-alive client, each sent once the last
    is answered: the latency a lone publisher sees (seconds), and its statuses."""
    conn = Control(port)
    lat: list[float] = []
    statuses: dict[str, int] = {}
    for i in range(count):
        t0 = time.perf_counter()
        status, _ = conn.request("POST", "/publish", {"channels": [channel], "data": i})
        lat.append(time.perf_counter() - t0)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    conn.conn.close()
    return lat, statuses


def bench_publish_ack(ctx: Context, publishers: int, duration: float,
                      lone: int) -> dict[str, Any]:
    """A 3-node mesh, once per ``--publish-ack`` setting (local: the 201 at once;
    peer: once a peer holds the message): the latency of a lone publisher's
    publishes on node 1, then publishes/s and latency with ``publishers``
    keep-alive publishers on node 1 for ``duration`` s."""
    out: dict[str, Any] = {}
    for ack in ("local", "peer"):
        workdir = ctx.out_dir / f"cluster-{ctx.stamp}-ack-{ack}"
        args = [*NODE_ARGS, "--publish-ack", ack]
        with LocalCluster(3, haproxy=False, node_args=args, workdir=str(workdir)) as c:
            port = c.node_ports[0]
            _one_by_one(port, 50, f"ack-warm-{ack}")  # connections to the peers, warm
            lone_lat, statuses = _one_by_one(port, lone, f"ack-lone-{ack}")
            cpu0 = _cpu(c)
            loaded, counters = ctx.pool.publish(port, publishers, duration, f"ack-{ack}")
            cpu = _cpu(c) - cpu0
            unconfirmed = Control(port).stats().get("unconfirmed", 0)
            ctx.pool.close_all()
        loaded_lat = sorted(loaded)
        ok = counters.get("publish_ok", 0)
        out[ack] = {
            "lone_publishes": lone, "lone_statuses": statuses,
            "lone_p50_ms": 1000 * percentile(lone_lat, 50),
            "lone_p99_ms": 1000 * percentile(lone_lat, 99),
            "publishers": publishers, "duration_s": duration,
            "per_second": ok / duration,
            "loaded_p50_ms": 1000 * percentile(loaded_lat, 50) if loaded_lat else None,
            "loaded_p99_ms": 1000 * percentile(loaded_lat, 99) if loaded_lat else None,
            "cluster_cpu_s": round(cpu, 2), "unconfirmed_202": unconfirmed,
            "client_counters": counters,
        }
        r = out[ack]
        ctx.log(f"    --publish-ack {ack}: lone p50 {r['lone_p50_ms']:.2f} ms, p99 "
                f"{r['lone_p99_ms']:.2f} ms; {r['per_second']:.0f}/s with {publishers} "
                f"publishers, p50 {r['loaded_p50_ms']:.2f} ms")
    return out
