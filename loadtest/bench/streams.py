"""Issue 30's second target: a Durable Stream's catch-up read and long-poll
wake-up, against the same through ``/subscribe``, on one node in one run.

Rule: both sides are measured on the same `pushup serve` process, by the same
load client (``client.Worker``, its `stream` and `pushup` dialects), one after
the other, so a ratio compares only what the two paths do:

* catch-up read: a channel and a JSON stream each hold the same ``n``
  messages (``n`` publishes, ``n`` appends); keep-alive connections read them
  all, one read after another, for a few seconds (``GET /subscribe?since=0&
  timeout=0&limit=n`` against ``GET /v1/stream/C?offset=-1``); the figure is
  the server's CPU per read, the two sides taking turns within each repeat;
* long-poll wake-up: ``k`` long polls held on a channel (``/subscribe``) or
  a stream (``live=long-poll``), then one publish or append per round, the
  server's CPU from it until every poll has its answer, and each answer's trip
  time; the polls are sent again only after the round (as the fan-out's
  deferred mode), so a round's CPU is the wake-up alone.

CPU is read from /proc at the kernel's 10 ms tick: a wake-up's CPU is summed
over all rounds before it is divided. The load generator's CPU is beside each
figure. Waits are on the server's /stats (``waiting``, ``stream_long_polls``).
"""

from __future__ import annotations

import statistics
import time
from array import array
from typing import Any
from urllib.parse import quote

from . import procfs
from .scenarios import HOLD_TIMEOUT, BenchError, Context, percentile
from .server import Server

# (side, the load client's dialect, the /stats key counting its held polls)
SIDES = (("subscribe", "pushup", "waiting"), ("stream", "stream", "stream_long_polls"))
READ_CONNECTIONS = 8


def _path(channel: str) -> str:
    return "/v1/stream/" + quote(channel, safe="")


def _create(srv: Server, channel: str) -> None:
    status, doc = srv.request("PUT", _path(channel), [])  # [] : an empty JSON stream
    if status != 201:
        raise BenchError(f"creating the stream {channel} answered {status}: {doc!r}")


def _add(srv: Server, side: str, channel: str, data: Any) -> None:
    """One message on ``channel``: published, or appended to its stream."""
    if side == "subscribe":
        ok, doc = srv.publish(channel, data)
        if not ok:
            raise BenchError(f"publish to {channel} refused: {doc!r}")
        return
    status, doc = srv.request("POST", _path(channel), data)
    if status != 204:
        raise BenchError(f"append to {channel} answered {status}: {doc!r}")


def _read_back(srv: Server, side: str, channel: str, n: int) -> int:
    """How many messages one catch-up read returns (checked before timing)."""
    if side == "subscribe":
        status, doc = srv.request("GET", f"/subscribe?channels={channel}&since=0&timeout=0"
                                  f"&limit={n}")
        return len(doc["messages"]) if status == 200 else -1
    status, doc = srv.request("GET", _path(channel) + "?offset=-1")
    return len(doc) if status == 200 and isinstance(doc, list) else -1


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


# -- catch-up read ------------------------------------------------------------------------


def catch_up(ctx: Context, srv: Server, n: int, seconds: float, reps: int,
             connections: int = READ_CONNECTIONS) -> dict[str, Any]:
    channel = f"bench-catchup-{n}"
    _create(srv, channel)
    for i in range(n):
        data = {"i": i, "pad": "x" * 64}
        _add(srv, "subscribe", channel, data)
        _add(srv, "stream", channel, data)
    for side, _, _ in SIDES:
        got = _read_back(srv, side, channel, n)
        if got != n:
            raise BenchError(f"a {side} catch-up read of {channel} returned {got} messages, "
                             f"not {n}")
    for _, dialect, _ in SIDES:  # first reads (lazy imports, first-use caches): not counted
        ctx.pool.fetch(srv.port, connections, min(seconds, 0.2), channel, n, dialect)
    samples: dict[str, list[dict[str, Any]]] = {side: [] for side, _, _ in SIDES}
    for rep in range(reps):
        order = SIDES if rep % 2 == 0 else SIDES[::-1]  # neither always goes first
        for side, dialect, _ in order:
            a = ctx.snapshot(srv)
            lat, counters = ctx.pool.fetch(srv.port, connections, seconds, channel, n, dialect)
            b = ctx.snapshot(srv)
            usage = procfs.usage(a, b)
            reads = counters.get("read_ok", 0)
            if not reads or set(counters) != {"read_ok"}:
                raise BenchError(f"{side} catch-up reads of {channel}: {counters}")
            samples[side].append({
                "reads": reads,
                "server_us_per_read": 1e6 * usage["server_cpu_s"] / reads,
                "generator_us_per_read": 1e6 * usage["generator_cpu_s"] / reads,
                "latency_p50_ms": 1000 * percentile(sorted(lat), 50),
                "usage": usage,
            })
            ctx.log(f"    catch-up n={n} {side} rep={rep}: {reads} reads, "
                    f"{samples[side][-1]['server_us_per_read']:.0f} us server CPU per read, "
                    f"generator {usage['generator_cpu_pct']}% of a core")
    out: dict[str, Any] = {"messages": n, "seconds": seconds, "connections": connections}
    for side, rows in samples.items():
        out[side] = {
            "server_us_per_read": statistics.median(r["server_us_per_read"] for r in rows),
            "generator_us_per_read": statistics.median(r["generator_us_per_read"] for r in rows),
            "reads_per_second": statistics.median(r["reads"] / seconds for r in rows),
            "latency_p50_ms": statistics.median(r["latency_p50_ms"] for r in rows),
            "samples": rows,
        }
    out["ratio"] = _ratio(out["stream"]["server_us_per_read"],
                          out["subscribe"]["server_us_per_read"])
    return out


# -- long-poll wake-up --------------------------------------------------------------------


def wake_up(ctx: Context, srv: Server, k: int, rounds: int, round_timeout: float,
            side: str, dialect: str, held_key: str) -> dict[str, Any]:
    channel = f"bench-wake-{k}-{side}"
    if side == "stream":
        _create(srv, channel)

    def held(count: int) -> None:
        srv.wait_for(f"{count} {side} long polls held", lambda s: s[held_key] >= count, 180)

    ctx.pool.close_all()  # the counters are this side's alone
    per_worker, counters = ctx.pool.subscribe(srv.port, k, channel, HOLD_TIMEOUT, False,
                                              dialect=dialect)
    if sum(per_worker) < k:
        raise BenchError(f"only {sum(per_worker)}/{k} {side} long polls connected: {counters}")
    held(k)
    trips: array[float] = array("d")
    cpu = {"server_cpu_s": 0.0, "generator_cpu_s": 0.0, "others_cpu_s": 0.0}
    lasts = []
    for r in range(rounds):
        a = ctx.snapshot(srv)
        t0 = time.time()
        _add(srv, side, channel, {"bench_round": r, "pad": "x" * 64})
        times, alive, counters = ctx.pool.await_round(r, per_worker, t0 + round_timeout)
        b = ctx.snapshot(srv)
        if len(times) != k:
            raise BenchError(f"{side} round {r}: {len(times)} of {k} long polls answered "
                             f"({alive} alive): {counters}")
        usage = procfs.usage(a, b)
        for key in cpu:
            cpu[key] += usage[key]
        lat = sorted(t - t0 for t in times)
        trips.extend(lat)
        lasts.append(lat[-1])
        if r + 1 < rounds:
            ctx.pool.repoll_all()
            held(k)
    ctx.pool.close_all()
    result = {
        "long_polls": k,
        "rounds": rounds,
        "server_ms_per_wake": 1000 * cpu["server_cpu_s"] / rounds,
        "generator_ms_per_wake": 1000 * cpu["generator_cpu_s"] / rounds,
        "others_ms_per_wake": 1000 * cpu["others_cpu_s"] / rounds,
        "trip_p50_ms": 1000 * percentile(list(trips), 50),
        "trip_p99_ms": 1000 * percentile(list(trips), 99),
        "last_p50_ms": 1000 * percentile(lasts, 50),
        "client_counters": counters,
    }
    ctx.log(f"    wake-up k={k} {side}: {result['server_ms_per_wake']:.1f} ms server CPU per "
            f"append, trip p50 {result['trip_p50_ms']:.1f} ms, generator "
            f"{result['generator_ms_per_wake']:.1f} ms")
    return result


# -- the scenario -------------------------------------------------------------------------


def bench_streams(ctx: Context, sizes: list[int], read_seconds: float, read_reps: int,
                  holds: list[int], rounds: int, round_timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {"catch_up": {}, "wake_up": {}}
    with ctx.server("streams") as srv:
        srv.warm_up()
        for n in sizes:
            out["catch_up"][str(n)] = catch_up(ctx, srv, n, read_seconds, read_reps)
        for k in holds:
            sides = {side: wake_up(ctx, srv, k, rounds, round_timeout, side, dialect, key)
                     for side, dialect, key in SIDES}
            sides["ratio_cpu"] = _ratio(sides["stream"]["server_ms_per_wake"],
                                        sides["subscribe"]["server_ms_per_wake"])
            sides["ratio_trip_p50"] = _ratio(sides["stream"]["trip_p50_ms"],
                                             sides["subscribe"]["trip_p50_ms"])
            out["wake_up"][str(k)] = sides
        out["build"] = srv.stats().get("build")
    return out


def table(res: dict[str, Any]) -> str:
    lines = ["Durable Streams against /subscribe, one node (stream / subscribe; generator "
             "CPU in brackets)", ""]
    head = f"{'figure':44} {'/subscribe':>18} {'stream':>18} {'ratio':>7}"
    lines += [head, "-" * len(head)]

    def fmt(x: float | None, unit: str, gen: float | None = None) -> str:
        if x is None:
            return "-"
        text = f"{x:,.1f} {unit}"
        return text if gen is None else f"{text} ({gen:,.1f})"

    def times(ratio: float | None) -> str:  # None: the /subscribe side used no tick of CPU
        return "-" if ratio is None else f"{ratio:.2f}x"

    for n, c in res["catch_up"].items():
        s, t = c["subscribe"], c["stream"]
        lines.append(f"{'catch-up read of ' + n + ' messages: CPU/read':44} "
                     f"{fmt(s['server_us_per_read'], 'us', s['generator_us_per_read']):>18} "
                     f"{fmt(t['server_us_per_read'], 'us', t['generator_us_per_read']):>18} "
                     f"{times(c['ratio']):>7}")
    for k, w in res["wake_up"].items():
        s, t = w["subscribe"], w["stream"]
        lines.append(f"{'wake-up of ' + f'{int(k):,}' + ' long polls: CPU/append':44} "
                     f"{fmt(s['server_ms_per_wake'], 'ms', s['generator_ms_per_wake']):>18} "
                     f"{fmt(t['server_ms_per_wake'], 'ms', t['generator_ms_per_wake']):>18} "
                     f"{times(w['ratio_cpu']):>7}")
        lines.append(f"{'wake-up of ' + f'{int(k):,}' + ' long polls: trip p50':44} "
                     f"{fmt(s['trip_p50_ms'], 'ms'):>18} {fmt(t['trip_p50_ms'], 'ms'):>18} "
                     f"{times(w['ratio_trip_p50']):>7}")
    lines.append(f"(target: every ratio <= 1.20; core: {res.get('build')})")
    return "\n".join(lines)
