"""Delivery by interest (issue 37): what a node pays for messages none of its
clients read, against how many channels its clients do read.

The rule: node B should pay nothing for node A's messages when no client of B
reads their channels, however many other channels B's clients hold. The figure
is B's CPU over A's, over the same window.

A real Redis Cluster of 3 primaries and no replicas (deploy/redis_cluster.py,
started once for the run) and, for each width W, two fresh PushUp nodes A and B
on it (Redis engine, no HAProxy: a ``LocalCluster`` of 2 given the cluster's
seeds). B first holds one long poll on each of W channels that nobody publishes
to (``cold-<W>-<i>``, one a connection, opened by the raw-epoll workers in
chunks); then ``publishers`` keep-alive publishers on A publish for
``duration_s`` over ``publish_channels`` other channels that nobody reads (each
request the next channel of the publisher's share, round robin). The window
runs from the first publish until B's CPU is quiet again (B may still be taking
A's messages in after the last answer; bounded by ``SETTLE_S``); A's and B's CPU
seconds (/proc, threads included) over that window, B / A, publishes/s, the
generator's and the Redis primaries' CPU beside them. B's RSS is read before
its polls, once they are held and after the window (so memory per held
channel is stated), and its ``/stats`` redis section after the window:
``followed`` (partitions followed) and, when the node reports it,
``channels_followed``. B's polls ask for an hour (``HOLD_TIMEOUT``): none is
answered inside the window unless a message reached it (``b_poll_answers``
counts them; it should be 0).

Every process is started through ``RedisCluster`` and ``LocalCluster``, which
stop them by PID; every wait is bounded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from deploy.launch import LocalCluster
from deploy.redis_cluster import RedisCluster

from . import procfs
from .capacity import CapacityPool, CapacityWorker
from .client import Conn, worker_main
from .cluster import NODE_ARGS, Control
from .dialect import PushUp
from .nodescale import _wait
from .pool import merge, split
from .report import grid
from .scenarios import HOLD_TIMEOUT, BenchError, Context

TARGET = 0.10  # issue 37: B's CPU / A's, at most, at every width
FOLLOW_CHUNK = 500  # B's polls opened at once; each chunk held before the next
FOLLOW_CHUNK_S = 120.0  # the longest one chunk may take to be held
SETTLE_S = 30.0  # the longest B may take to become quiet after the last publish
QUIET_S = 0.5  # B is quiet when its CPU rose by at most QUIET_CPU_S over this long
QUIET_CPU_S = 0.02  # (two clock ticks)
SAMPLE_S = 0.1  # how often B's CPU is read while waiting for it to be quiet


@dataclass
class Settings:
    widths: tuple[int, ...] = (20, 200, 2000, 8000)
    duration_s: float = 10.0
    publishers: int = 8
    publish_channels: int = 1000


def quiet(samples: Sequence[tuple[float, float]], quiet_s: float = QUIET_S,
          tolerance: float = QUIET_CPU_S) -> bool:
    """Whether ``samples`` ((time, CPU seconds), oldest first) span at least
    ``quiet_s`` and the CPU rose by at most ``tolerance`` over the last
    ``quiet_s`` of them."""
    if not samples or samples[-1][0] - samples[0][0] < quiet_s:
        return False
    t_end, cpu_end = samples[-1]
    start = next(cpu for t, cpu in reversed(samples) if t_end - t >= quiet_s)
    return cpu_end - start <= tolerance


def ratio(b: float, a: float) -> float | None:
    """B's CPU over A's, None when A used none (nothing to compare with)."""
    return round(b / a, 3) if a > 0 else None


class InterestWorker(CapacityWorker):
    """The capacity worker's one-channel-a-connection subscribers, plus keep-alive
    publishers that go round robin over a list of channels (one request each)."""

    def __init__(self, pipe: Connection, index: int) -> None:
        super().__init__(pipe, index)
        self.pub_requests: list[bytes] = []
        self.pub_next = 0
        self.hold_s = HOLD_TIMEOUT  # no HAProxy in between: B's polls outlast the run

    def command(self, msg: tuple[Any, ...]) -> None:
        if msg[0] == "publish_over":
            _, self.port, n, duration, channels = msg
            self.pub_requests = [PushUp(self.port, ch, 0).publish_request(
                {"bench": "interest", "w": self.index}) for ch in channels]
            self.pub_next = 0
            self.repeat(self.pub_requests[0], PushUp.publish_ok, "publish_ok", n, duration)
        else:
            super().command(msg)

    def send_publish(self, c: Conn) -> None:
        if self.pub_requests:
            self.pub_request = self.pub_requests[self.pub_next % len(self.pub_requests)]
            self.pub_next += 1
        super().send_publish(c)

    def on_poll_response(self, c: Conn, status: int, head: bytes, body: bytes,
                         now: float) -> None:
        self.counters["poll_answers"] += 1  # (none is expected while A publishes)
        super().on_poll_response(c, status, head, body, now)


def interest_worker_main(pipe: Connection, index: int) -> None:
    worker_main(pipe, index, InterestWorker)


class InterestPool(CapacityPool):
    def __init__(self, size: int) -> None:
        super().__init__(size, target=interest_worker_main)

    def publish_over(self, port: int, publishers: int, duration: float,
                     channels: list[str]) -> dict[str, int]:
        """``publishers`` keep-alive publishers on ``port`` for ``duration`` s, worker
        i's going round robin over ``channels[i::workers]``; the run's counters."""
        shares = split(publishers, len(self.pipes))
        for i, (pipe, k) in enumerate(zip(self.pipes, shares, strict=True)):
            pipe.send(("publish_over", port, k, duration, channels[i::len(self.pipes)]))
        return merge(r[2] for r in self._gather("published", duration + 60))


def bench_interest(ctx: Context, s: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": dict(s.__dict__), "target": TARGET,
                           "loadavg_at_start": os.getloadavg(), "widths": {}}
    redis = RedisCluster(primaries=3, replicas=0)
    redis.start()
    try:
        out["redis_primaries"] = len(redis.primaries())
        # recorded so a caller can check that every process started was stopped
        out["redis_pids"] = [node.pid for node in redis.nodes.values()]
        pool = InterestPool(len(ctx.pool.pids))
        with pool:
            out["generator"] = f"raw-epoll client, {len(pool.pids)} processes"
            for w in s.widths:
                try:
                    row = _one(ctx, pool, redis, s, w)
                except Exception as e:  # one width that cannot run hides no other
                    ctx.log(f"    W={w}: ERROR {type(e).__name__}: {e}")
                    row = {"width": w, "error": f"{type(e).__name__}: {e}"}
                    pool.close_all()
                out["widths"][str(w)] = row
                for port in redis.primaries():  # the next width starts from an empty Redis
                    redis.cli(port, "FLUSHALL")
    finally:
        redis.stop()
    out["loadavg_at_end"] = os.getloadavg()
    return out


def _one(ctx: Context, pool: InterestPool, redis: RedisCluster, s: Settings,
         w: int) -> dict[str, Any]:
    workdir = ctx.out_dir / f"interest-{ctx.stamp}-{w}"
    cold = [f"cold-{w}-{i}" for i in range(w)]
    hot = [f"hot-{w}-{i}" for i in range(s.publish_channels)]
    redis_pids = [redis.nodes[p].pid for p in redis.primaries()]
    load0 = os.getloadavg()
    with LocalCluster(2, haproxy=False, node_args=NODE_ARGS, workdir=str(workdir),
                      engine=redis.seeds) as c:
        a_pid, b_pid = (p.pid for p in c.nodes if p is not None)
        b = Control(c.node_ports[1])
        rss_before = procfs.rss_bytes(b_pid)
        t_open = time.monotonic()
        for i in range(0, w, FOLLOW_CHUNK):
            opened = pool.follow(c.node_ports[1], cold[i:i + FOLLOW_CHUNK], 1)
            try:
                _wait(f"{opened} polls held on B", lambda o=opened: b.stats()["waiting"] >= o,
                      FOLLOW_CHUNK_S)
            except BenchError as e:
                raise BenchError(f"{e}: {b.stats()['waiting']} held, client counters "
                                 f"{pool.counters()[1]}") from None
        if opened < w:
            raise BenchError(f"only {opened}/{w} polls connected to B")
        open_s = time.monotonic() - t_open
        _until_quiet(b_pid, "B, its polls held")
        rss_held = procfs.rss_bytes(b_pid)
        stats0 = b.stats()
        cpu0 = _cpu_of(a_pid, b_pid, pool.pids, redis_pids)
        t0 = time.monotonic()
        counters = pool.publish_over(c.node_ports[0], s.publishers, s.duration_s, hot)
        t_last = time.monotonic()
        _until_quiet(b_pid, "B, after the last publish")
        wall = time.monotonic() - t0
        cpu1 = _cpu_of(a_pid, b_pid, pool.pids, redis_pids)
        rss_after = procfs.rss_bytes(b_pid)
        stats1 = b.stats()
        held = stats1["waiting"]
        pool.close_all()
    used = {k: round(cpu1[k] - cpu0[k], 3) for k in cpu0}
    ok = counters.get("publish_ok", 0)
    if not ok:
        raise BenchError(f"W={w}: nothing published ({counters})")
    redis1 = stats1.get("redis", {})
    row = {
        "width": w, "node_pids": [a_pid, b_pid], "a_cpu_s": used["a"], "b_cpu_s": used["b"],
        "b_over_a": ratio(used["b"], used["a"]),
        "generator_cpu_s": used["generator"], "redis_cpu_s": used["redis"],
        "a_cpu_pct": round(100 * used["a"] / wall, 1),
        "b_cpu_pct": round(100 * used["b"] / wall, 1),
        "generator_cpu_pct": round(100 * used["generator"] / wall, 1),
        "redis_cpu_pct": round(100 * used["redis"] / wall, 1),
        "publishes": ok, "per_second": round(ok / s.duration_s, 1),
        # what each node pays per message A took (B: for messages none of its clients read)
        "a_us_per_message": round(1e6 * used["a"] / ok, 1),
        "b_us_per_message": round(1e6 * used["b"] / ok, 1),
        "window_s": round(wall, 2), "settle_s": round(t0 + wall - t_last, 2),
        "open_s": round(open_s, 1), "held_on_b": held,
        "b_poll_answers": counters.get("poll_answers", 0),
        "b_rss_mb": {"before": _mb(rss_before), "held": _mb(rss_held),
                     "after": _mb(rss_after)},
        "b_rss_kb_per_channel": round((rss_held - rss_before) / 1024 / w, 2),
        "b_followed": redis1.get("followed"), "b_partitions": redis1.get("partitions"),
        "b_channels_followed": redis1.get("channels_followed"),
        "b_redis_stats": {"before": stats0.get("redis"), "after": redis1},
        "client_counters": {k: v for k, v in counters.items() if k != "publish_ok"},
        "loadavg_before": load0, "loadavg_after": os.getloadavg(),
    }
    ctx.log(f"    W={w}: A {row['a_cpu_s']} s, B {row['b_cpu_s']} s, B / A "
            f"{row['b_over_a']}; {row['per_second']:,.0f} publishes/s; per message A "
            f"{row['a_us_per_message']} µs, B {row['b_us_per_message']} µs; B follows "
            f"{row['b_followed']} partitions, {row['b_channels_followed']} channels; "
            f"B RSS {row['b_rss_mb']['held']} MB")
    return row


def _mb(n: int) -> float:
    return round(n / 1e6, 1)


def _cpu_of(a: int, b: int, generator: list[int], redis: list[int]) -> dict[str, float]:
    return {"a": procfs.cpu_seconds(a), "b": procfs.cpu_seconds(b),
            "generator": sum(procfs.cpu_seconds(p) for p in generator),
            "redis": sum(procfs.cpu_seconds(p) for p in redis)}


def _until_quiet(pid: int, what: str, read: Callable[[int], float] = procfs.cpu_seconds
                 ) -> None:
    """Until ``pid``'s CPU is ``quiet`` (read from /proc: asking the node would cost
    it CPU); at most SETTLE_S."""
    samples = [(time.monotonic(), read(pid))]
    deadline = samples[0][0] + SETTLE_S
    while not quiet(samples):
        if samples[-1][0] > deadline:
            raise BenchError(f"{what}: still busy after {SETTLE_S:.0f} s")
        time.sleep(SAMPLE_S)  # polling /proc: there is no event to await
        samples.append((time.monotonic(), read(pid)))


def table(res: dict[str, Any]) -> str:
    """A row per width: the CPU of A and B over the window, B / A against the target."""
    st = res["settings"]
    lines = [f"Delivery by interest (issue 37): a {res.get('redis_primaries', 3)}-primary Redis "
             f"Cluster, nodes A and B; B holds one long poll on each of W channels nobody "
             f"publishes to, then {st['publishers']} keep-alive publishers on A for "
             f"{st['duration_s']:g} s over {st['publish_channels']:,} other channels nobody "
             f"reads; CPU seconds over the window (until B is quiet again); generator "
             f"{res.get('generator', '-')}", ""]
    body = []
    for w, r in res["widths"].items():
        if "error" in r:
            body.append([f"W={w}: ERROR {r['error']}"])
            continue
        v = r["b_over_a"]
        verdict = ("no figure" if v is None else "met" if v <= TARGET
                   else f"MISSED ({v / TARGET:.2f}x)")
        body.append([f"{int(w):,}", f"{r['a_cpu_s']:.2f}", f"{r['b_cpu_s']:.2f}",
                     "-" if v is None else f"{v:.2f}", f"<= {TARGET:.2f}", verdict,
                     f"{r['per_second']:,.0f}",
                     f"{r['a_us_per_message']:.0f} / {r['b_us_per_message']:.0f}",
                     f"{r['generator_cpu_s']:.2f}",
                     f"{r['redis_cpu_s']:.2f}", f"{r['b_rss_mb']['held']}",
                     f"{r['b_rss_kb_per_channel']}", str(r["b_followed"]),
                     "-" if r["b_channels_followed"] is None else str(r["b_channels_followed"]),
                     str(r["b_poll_answers"])])
    lines += grid(["W", "A CPU s", "B CPU s", "B / A", "target", "verdict", "publishes/s",
                   "µs per message A / B", "generator CPU s", "redis CPU s", "B RSS MB",
                   "B KB/channel",
                   "partitions followed", "channels followed", "B polls answered"], body)
    return "\n".join(lines)
