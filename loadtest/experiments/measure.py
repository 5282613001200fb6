"""What every experiment shares: the server, the rate-controlled load, CPU windows, rows.

A `Window` brackets one measurement with CPU counters read from /proc: the
server's user and system time apart (the seeds' servers spent most of their
time in the kernel, a Python server spends most in user space), the load
generator's, the rest of the machine's (other work shares these 2 cores) and
the load average. `rate_point` runs one httperf-style point and returns its row.
Nothing here sleeps except to wait for a wall-clock instant the load is scheduled at.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench import procfs
from loadtest.bench.pool import WorkerPool, split
from loadtest.bench.server import Server

HOLD = 3600  # idle polls ask for this hold; the server's --max-timeout matches


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of `pid` (threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2 :].split()
    return int(fields[11]) / procfs.CLK_TCK, int(fields[12]) / procfs.CLK_TCK


@dataclass(frozen=True, slots=True)
class Mark:
    wall: float
    user: float
    system: float
    generator: float
    busy: float
    total: float


class Window:
    """CPU used by server, generator and machine between `begin()` and `end()`."""

    def __init__(self, server_pids: list[int], generator_pids: list[int]) -> None:
        self.server_pids = server_pids
        self.generator_pids = generator_pids
        self.start: Mark | None = None

    def mark(self) -> Mark:
        user = system = 0.0
        for p in self.server_pids:
            u, s = cpu_split(p)
            user, system = user + u, system + s
        busy, total = procfs.machine_cpu()
        gen = sum(procfs.cpu_seconds(p) for p in self.generator_pids)
        return Mark(time.monotonic(), user, system, gen, busy, total)

    def begin(self) -> None:
        self.start = self.mark()

    def end(self) -> dict[str, float]:
        assert self.start is not None
        a, b = self.start, self.mark()
        wall = max(b.wall - a.wall, 1e-9)
        user, system, gen = b.user - a.user, b.system - a.system, b.generator - a.generator
        others = max(b.busy - a.busy - user - system - gen, 0.0)
        return {
            "wall_s": round(wall, 3),
            "server_user_s": round(user, 3),
            "server_sys_s": round(system, 3),
            "server_cpu_pct": round(100 * (user + system) / wall, 1),
            "generator_cpu_pct": round(100 * gen / wall, 1),
            "others_cpu_pct": round(100 * others / wall, 1),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }


def start_server(repo: Path, out: Path, name: str, reactor: str, max_connections: int,
                 host: str = "127.0.0.1", extra: list[str] | None = None) -> Server:
    command = [sys.executable, "-m", "pushup.ops.cli", "serve", "--host", host, "--port", "0",
               "--reactor", reactor, "--max-connections", str(max_connections),
               "--max-timeout", str(HOLD), "--log-level", "warn", *(extra or [])]
    srv = Server(command, out / f"server-{name}.log", repo)
    srv.host = host
    srv.start()
    return srv


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def rate_point(pool: WorkerPool, srv: Server, *, kind: str, rate: float, duration: float,
               conns: int, channel: str) -> dict[str, Any]:
    """Offer `rate` requests/s of `kind` ("subscribe": timeout=0 pull; "publish") for
    `duration` s over `conns` keep-alive connections; the reply rate, latency and CPU."""
    n = len(pool.pipes)
    start = time.time() + 0.3  # time for the connections to open before the first due
    for i, (pipe, k) in enumerate(zip(pool.pipes, split(conns, n), strict=True)):
        pipe.send(("rate", srv.port, rate / n, duration, max(k, 1), kind, f"{channel}-{i}",
                   start))
    window = Window(srv.pids, pool.pids + [os.getpid()])
    time.sleep(max(0.0, start - time.time()))  # the schedule's own start instant
    window.begin()
    time.sleep(max(0.0, start + duration - time.time()))
    cpu = window.end()
    replies = pool._gather("rated", duration + 60)
    lat: array[float] = array("d")
    done: array[float] = array("d")
    counts: dict[str, int] = {}
    for rep in replies:
        lat.frombytes(rep[1])
        done.frombytes(rep[2])
        for key, v in rep[3].items():
            counts[key] = counts.get(key, 0) + v
    in_window = sum(1 for t in done if start <= t <= start + duration)
    server_cpu = cpu["server_user_s"] + cpu["server_sys_s"]
    lat_ms = [x * 1000 for x in lat]
    return {
        "kind": kind, "offered_rate": rate, "duration_s": duration, "conns": conns,
        "reply_rate": round(in_window / duration, 1),
        "latency_p50_ms": round(percentile(lat_ms, 0.5), 3),
        "latency_p99_ms": round(percentile(lat_ms, 0.99), 3),
        "latency_mean_ms": round(statistics.fmean(lat_ms), 3) if lat_ms else float("nan"),
        "server_cpu_us_per_reply": round(1e6 * server_cpu / in_window, 1) if in_window else None,
        "server_user_share": round(cpu["server_user_s"] / server_cpu, 3) if server_cpu else None,
        **counts, **cpu,
    }


class Recorder:
    """Appends one JSON line per row to `path` and prints progress with an ETA."""

    def __init__(self, path: Path, total_points: int) -> None:
        self.path = path
        self.total = max(total_points, 1)
        self.done = 0
        self.t0 = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)

    def row(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")

    def point(self, row: dict[str, Any], label: str) -> None:
        self.row(row)
        self.done += 1
        spent = time.monotonic() - self.t0
        eta = spent / self.done * max(self.total - self.done, 0)
        print(f"[{self.done}/{self.total}] {label}  ETA {eta:.0f} s", flush=True)


def run_logged(cmd: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """A short administrative command (ip, tc); raises with its stderr on failure."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r
