"""The benchmarks: each starts a fresh server, drives it, and returns a result dict.

Every figure is stored with the CPU used meanwhile by the server, the load
generator and the rest of the machine (`procfs.usage`), so a saturated
generator or a noisy neighbour is visible next to the number it distorted.
Waits are on events (the server's /stats, the workers' replies), each bounded.
Each benchmark takes a `Target` (default: one `pushup serve` process), so the
same code measures `pushup serve --workers N` and nginx + nchan (compare.py).
"""

from __future__ import annotations

import os
import statistics
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import procfs
from .pool import WorkerPool
from .server import Server, ServerError

HOLD_TIMEOUT = 3600  # subscribers ask for this; the server gets --max-timeout to match


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    """A server to measure: `pushup serve` with `workers` processes, or nginx + nchan."""

    key: str  # short, for file names and the JSON record
    label: str  # for tables
    kind: str = "pushup"  # "pushup" or "nchan"
    workers: int = 1


PUSHUP = Target("pushup", "PushUp (1 process)")


@dataclass
class Context:
    pool: WorkerPool
    server_command: list[str]
    repo: Path
    out_dir: Path
    stamp: str
    log: Any = print
    servers_started: list[str] = field(default_factory=list)
    on_serving: Callable[[Server], None] | None = None  # handed to every server started

    def server(self, name: str, target: Target = PUSHUP, flags: tuple[str, ...] = ()) -> Server:
        """A fresh server; ``flags`` are added to a `pushup serve` line."""
        if target != PUSHUP:
            name = f"{target.key}-{name}"
        log_path = self.out_dir / f"server-{self.stamp}-{name}.log"
        self.servers_started.append(name)
        if target.kind == "nchan":
            from .nchan import NchanServer  # nginx is only needed when nchan is measured

            return NchanServer(log_path, self.out_dir, hold_timeout=HOLD_TIMEOUT)
        command = self.server_command + [
            "serve", "--port", "0",
            "--max-connections", "20000",
            "--max-timeout", str(HOLD_TIMEOUT), *flags,
        ]
        if target.workers > 1:
            command += ["--workers", str(target.workers)]
        srv = Server(command, log_path, self.repo, workers=target.workers)
        srv.on_serving = self.on_serving
        return srv

    def snapshot(self, srv: Server) -> procfs.Snapshot:
        return procfs.snapshot(srv.pids, self.pool.pids + [_self_pid()])


def _self_pid() -> int:
    return os.getpid()


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), as numpy's default."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def hold(
    ctx: Context, srv: Server, n: int, channel: str, repoll: bool = True
) -> tuple[list[int], dict[str, Any]]:
    """Open `n` held subscriptions on `channel` and wait until the server holds them."""
    t0 = time.monotonic()
    per_worker, counters = ctx.pool.subscribe(srv.port, n, channel, HOLD_TIMEOUT, repoll,
                                              dialect=srv.dialect)
    opened = sum(per_worker)
    if opened < n:
        ctx.log(f"    only {opened}/{n} subscribers connected: {counters}")
    stats = srv.wait_for(f"{opened} held subscriptions", lambda s: s["waiting"] >= opened, 180)
    return per_worker, {
        "opened": opened,
        "seconds_to_hold": round(time.monotonic() - t0, 2),
        "client_counters": counters,
        "stats_waiting": stats["waiting"],
        "stats_connections": stats.get("connections"),
    }


def release(ctx: Context, srv: Server) -> dict[str, Any]:
    """Close every client connection and check the server forgets the waiting polls."""
    t0 = time.monotonic()
    ctx.pool.close_all()
    try:
        srv.wait_for("waiting back to 0 after clients left", lambda s: s["waiting"] == 0, 30)
        return {"forgotten_after_disconnect_s": round(time.monotonic() - t0, 2)}
    except ServerError as e:
        return {"forgotten_after_disconnect_s": None, "error": str(e)}


def stop(srv: Server) -> dict[str, Any]:
    t0 = time.monotonic()
    code = srv.stop()
    return {"exit_code": code, "stop_s": round(time.monotonic() - t0, 2)}


# -- 1. memory per held poll -------------------------------------------------------------


def bench_memory(ctx: Context, sizes: list[int], reps: int,
                 target: Target = PUSHUP) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        samples = []
        for rep in range(reps):
            with ctx.server(f"memory-{n}-{rep}", target) as srv:
                srv.warm_up()
                before = srv.rss()
                before_stats = srv.stats().get("rss_bytes")
                a = ctx.snapshot(srv)
                _, held = hold(ctx, srv, n, "bench-memory")
                b = ctx.snapshot(srv)
                after = srv.rss()
                after_stats = srv.stats().get("rss_bytes")
                sample = {
                    "n": n,
                    "rss_before": before,
                    "rss_after": after,
                    "bytes_per_poll": (after - before) / n,
                    "stats_rss_before": before_stats,
                    "stats_rss_after": after_stats,
                    "usage_while_opening": procfs.usage(a, b),
                    **held,
                }
                sample.update(release(ctx, srv))
                sample["rss_after_release"] = srv.rss()
                sample.update(stop(srv))
            ctx.log(
                f"    memory n={n} rep={rep}: {sample['bytes_per_poll'] / 1024:.2f} KB/poll "
                f"(RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MB, "
                f"held in {sample['seconds_to_hold']} s)"
            )
            samples.append(sample)
        per = [s["bytes_per_poll"] for s in samples]
        out[str(n)] = {
            "median_bytes_per_poll": statistics.median(per),
            "min_bytes_per_poll": min(per),
            "max_bytes_per_poll": max(per),
            "generator_cpu_pct_median": statistics.median(
                s["usage_while_opening"]["generator_cpu_pct"] for s in samples),
            "server_cpu_pct_median": statistics.median(
                s["usage_while_opening"]["server_cpu_pct"] for s in samples),
            "samples": samples,
        }
    return out


# -- 2, 3, 5. fan-out of one publish to n subscribers -------------------------------------


def bench_fanout(
    ctx: Context, name: str, n: int, publishes: int, round_timeout: float,
    repoll_immediately: bool = True, target: Target = PUSHUP, pace_s: float = 0.0,
) -> dict[str, Any]:
    """n subscribers on one channel; `publishes` publishes, each waited for until every
    subscriber has it (or `round_timeout`), subscribers re-polling with their cursor:
    at once on receipt (the realistic client), or, with `repoll_immediately=False`,
    only after the round is over (isolates the server's fan-out from re-poll work).
    With `pace_s`, publish r is also sent no earlier than `pace_s` x r after the first
    (a schedule, e.g. one a second; a slower round delays the next, never overlaps)."""
    channel = f"bench-{name}"
    rounds = []
    all_lat: array[float] = array("d")  # every delivery's trip time, all publishes
    with ctx.server(name, target) as srv:
        srv.warm_up()
        rss_before = srv.rss()
        per_worker, held = hold(ctx, srv, n, channel, repoll_immediately)
        rss_held = srv.rss()
        stats0 = srv.stats()
        start = ctx.snapshot(srv)
        first_publish = time.monotonic()
        for r in range(publishes):
            time.sleep(max(0.0, first_publish + pace_s * r - time.monotonic()))
            alive, counters = ctx.pool.counters()
            expected = sum(alive)
            srv.wait_for(
                f"{expected} subscriptions held again before publish {r}",
                lambda s, expected=expected: s["waiting"] >= expected, 120,
            )
            a = ctx.snapshot(srv)
            body = {"bench_round": r, "pad": "x" * 64}
            t0 = time.time()
            ok, doc = srv.publish(channel, body)
            t_ack = time.time()
            if not ok:
                raise BenchError(f"publish {r} refused: {doc!r}")
            times, alive_after, counters = ctx.pool.await_round(r, alive, t0 + round_timeout)
            b = ctx.snapshot(srv)
            if not repoll_immediately:
                ctx.pool.repoll_all()
            lat = sorted(t - t0 for t in times)
            all_lat.extend(lat)
            rnd = {
                "round": r,
                "subscribers": sum(alive),
                "delivered": len(lat),
                "delivered_pct": 100.0 * len(lat) / n,
                "publish_ack_s": round(t_ack - t0, 4),
                "first_s": round(lat[0], 4) if lat else None,
                "median_s": round(percentile(lat, 50), 4) if lat else None,
                "last_s": round(lat[-1], 4) if lat else None,
                "usage": procfs.usage(a, b),
            }
            rounds.append(rnd)
            ctx.log(
                f"    {name} publish {r}: delivered {rnd['delivered']}/{n}, "
                f"last {rnd['last_s']} s, median {rnd['median_s']} s, "
                f"server {rnd['usage']['server_cpu_s']} s CPU, "
                f"generator {rnd['usage']['generator_cpu_s']} s CPU"
            )
        # Let the last round's re-polls land too, so the loop's CPU covers exactly
        # `publishes` x (publish + fan-out + re-polls).
        alive, counters = ctx.pool.counters()
        expected = sum(alive)
        srv.wait_for("re-polls after the last publish", lambda s: s["waiting"] >= expected, 120)
        end = ctx.snapshot(srv)
        stats1 = srv.stats()
        result: dict[str, Any] = {
            "subscribers": n,
            "repoll": "immediate" if repoll_immediately else "after-round",
            "publishes": publishes,
            "pace_s": pace_s,
            "rss_before": rss_before,
            "rss_held": rss_held,
            "bytes_per_poll": (rss_held - rss_before) / n,
            **held,
        }
        result.update(release(ctx, srv))
        result.update(stop(srv))
    last = [r["last_s"] for r in rounds if r["last_s"] is not None]
    delivered = sum(r["delivered"] for r in rounds)
    total = procfs.usage(start, end)
    server_cpu_in_rounds = sum(r["usage"]["server_cpu_s"] for r in rounds)
    gen_cpu_in_rounds = sum(r["usage"]["generator_cpu_s"] for r in rounds)
    result.update({
        "last_p50_s": percentile(last, 50),
        "last_p99_s": percentile(last, 99),
        "last_max_s": max(last) if last else None,
        "median_subscriber_p50_s": percentile(
            [r["median_s"] for r in rounds if r["median_s"] is not None], 50),
        "all_p50_s": percentile(list(all_lat), 50),
        "all_p99_s": percentile(list(all_lat), 99),
        "delivered_pct": 100.0 * delivered / (n * publishes),
        "min_round_delivered_pct": min(r["delivered_pct"] for r in rounds),
        "deliveries": delivered,
        "stats_delivered_delta": stats1["delivered"] - stats0["delivered"]
        if "delivered" in stats1 else None,
        "client_counters_end": counters,
        "usage_all_publishes": total,
        # Whole loop: publish, fan-out and the 20 rounds of re-polls (the real cost of
        # long polling: every delivery is followed by a new request).
        "server_cpu_s_per_10k_deliveries": total["server_cpu_s"] / (delivered / 10_000)
        if delivered else None,
        "generator_cpu_s_per_10k_deliveries": total["generator_cpu_s"] / (delivered / 10_000)
        if delivered else None,
        # Only from each publish until its last receipt (re-polls partly included).
        "server_cpu_s_per_10k_in_rounds": server_cpu_in_rounds / (delivered / 10_000)
        if delivered else None,
        "generator_cpu_s_per_10k_in_rounds": gen_cpu_in_rounds / (delivered / 10_000)
        if delivered else None,
        "rounds": rounds,
    })
    return result


# -- 4. publish rate ---------------------------------------------------------------------------


def bench_publish(ctx: Context, publishers: int, duration: float, reps: int,
                  target: Target = PUSHUP) -> dict[str, Any]:
    samples = []
    for rep in range(reps):
        with ctx.server(f"publish-{rep}", target) as srv:
            srv.warm_up()
            stats0 = srv.stats()
            a = ctx.snapshot(srv)
            lat_arr, counters = ctx.pool.publish(srv.port, publishers, duration, f"bench-pub{rep}",
                                                 dialect=srv.dialect)
            b = ctx.snapshot(srv)
            usage = procfs.usage(a, b)
            stats1 = srv.stats()
            ctx.pool.close_all()
            lat = sorted(lat_arr)
            ok = counters.get("publish_ok", 0)
            server_count = stats1.get("published", 0) - stats0.get("published", 0)
            if server_count != ok:
                ctx.log(f"    note: clients counted {ok} publishes answered 201, "
                        f"the server's /stats 'published' grew by {server_count}")
            sample = {
                "publishers": publishers,
                "duration_s": duration,
                "ok": ok,
                "per_second": ok / duration,
                # What one uncontended core would sustain at this cost per publish: the
                # figure to compare across runs on a shared, noisy machine.
                "per_server_cpu_second": ok / max(usage["server_cpu_s"], 1e-9),
                "stats_published_delta": server_count,
                "latency_p50_ms": 1000 * percentile(lat, 50) if lat else None,
                "latency_p99_ms": 1000 * percentile(lat, 99) if lat else None,
                "client_counters": counters,
                "usage": usage,
                "rss_after": srv.rss(),
            }
            sample.update(stop(srv))
        ctx.log(
            f"    publish rep={rep}: {sample['per_second']:.0f}/s, "
            f"p50 {sample['latency_p50_ms']:.2f} ms, server {sample['usage']['server_cpu_pct']}% "
            f"of a core, generator {sample['usage']['generator_cpu_pct']}%"
        )
        samples.append(sample)
    rates = [s["per_second"] for s in samples]
    return {
        "median_per_second": statistics.median(rates),
        "median_per_server_cpu_second": statistics.median(
            s["per_server_cpu_second"] for s in samples),
        "min_per_second": min(rates),
        "max_per_second": max(rates),
        "server_cpu_pct_median": statistics.median(s["usage"]["server_cpu_pct"] for s in samples),
        "generator_cpu_pct_median": statistics.median(
            s["usage"]["generator_cpu_pct"] for s in samples),
        "samples": samples,
    }
