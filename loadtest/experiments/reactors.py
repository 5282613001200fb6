"""Experiment 1 (seeds 000, 001, 004): select, poll and epoll under idle held polls.

For each reactor a fresh `pushup serve --reactor R` gets N idle long polls (a
channel nobody publishes to: seed 001's "dead connections"), raised step by
step, and at each N an open-loop load at a fixed offered rate (pull
subscribes with timeout=0, the "one-byte" analogue, and publishes). At N = 0
and at the reactor's largest N the offered rate is swept (seed 000, Figures 3
and 5). One `strace -c -f` window per reactor, at its largest N, counts the
event-loop system calls per reply (seed 004's epoll_ctl finding).
select is capped below 1,024 descriptors (FD_SETSIZE): N stops at 850.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench.pool import WorkerPool
from loadtest.bench.server import Server

from .measure import HOLD, Recorder, rate_point, start_server
from .rate import rate_worker_main

REACTORS = ("select", "poll", "epoll")
MAX_CONNECTIONS = {"select": 900, "poll": 19000, "epoll": 19000}
STRACE_CALLS = ("epoll_wait", "epoll_ctl", "poll", "select", "pselect6", "ppoll",
                "recvfrom", "sendto", "read", "write", "sendmsg", "recvmsg")


@dataclass(frozen=True)
class Plan:
    idle: dict[str, tuple[int, ...]]
    sweep: tuple[int, ...]  # offered rates swept at N = 0 and at the largest N
    fixed_rate: int  # offered rate at every N
    duration: float  # seconds per point
    conns: int  # active keep-alive connections of the rate load
    workloads: tuple[str, ...]
    strace_s: float
    reps: int = 1  # repetitions of each point (the machine is shared: noise); rounds of the sweep
    workers: int = 1

    def rates(self, n: int, ns: tuple[int, ...]) -> dict[str, list[int]]:
        """Offered rates per workload at idle count `n` (fixed-rate ones `reps` times)."""
        rates = {w: [self.fixed_rate] * self.reps for w in self.workloads}
        if n in (ns[0], ns[-1]):
            rates["subscribe"] = sorted({*self.sweep, self.fixed_rate}) * self.reps
        return rates

    def points(self) -> int:
        n = 0
        for ns in self.idle.values():
            n += sum(len(v) for k in ns for v in self.rates(k, ns).values())
            n += 1 if self.strace_s else 0
        return n


PLANS = {
    "smoke": Plan(idle={"select": (0, 20), "poll": (0, 20), "epoll": (0, 20)},
                  sweep=(200, 400), fixed_rate=300, duration=0.5, conns=4,
                  workloads=("subscribe", "publish"), strace_s=0.5),
    "full": Plan(idle={"select": (0, 500, 850),
                       "poll": (0, 500, 2000, 5000, 10000, 15000),
                       "epoll": (0, 500, 2000, 5000, 10000, 15000)},
                 sweep=(2000, 4000, 6000, 8000, 11000, 14000, 18000, 22000), fixed_rate=5000,
                 duration=3.0,
                 conns=32, workloads=("subscribe", "publish"), strace_s=3.0, reps=3),
}


def hold_idle(pool: WorkerPool, srv: Server, held: int, target: int) -> int:
    """Open idle long polls until the server holds `target` of them; returns `target`."""
    if target > held:
        pool.subscribe(srv.port, target - held, "idle-never-published", HOLD, wait=300)
        srv.wait_for(f"{target} held polls", lambda s: s["waiting"] >= target, timeout=120)
    return target


def strace_window(pool: WorkerPool, srv: Server, out: Path, reactor: str, n: int,
                  plan: Plan) -> dict[str, Any]:
    """Count the server's system calls (strace -c -f) during one fixed-rate window."""
    trace_file = out / f"strace-{reactor}-{n}.txt"
    tracer = subprocess.Popen(
        ["strace", "-c", "-f", "-o", str(trace_file), "-p", str(srv.pid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert tracer.stderr is not None
        # strace reports each thread it attaches to on stderr: wait for the first line.
        line = tracer.stderr.readline()
        if not line:
            raise RuntimeError(f"strace did not attach (exit {tracer.wait(10)})")
        row = rate_point(pool, srv, kind="subscribe", rate=plan.fixed_rate,
                         duration=plan.strace_s, conns=plan.conns, channel="strace")
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # strace -c prints its table when detaching
        try:
            tracer.wait(30)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait(10)
    calls = parse_strace(trace_file.read_text())
    replies = max(row["reply_rate"] * plan.strace_s, 1)
    return {
        "syscalls": {k: calls.get(k, 0) for k in STRACE_CALLS if k in calls},
        "syscalls_per_reply": {k: round(calls[k] / replies, 3) for k in STRACE_CALLS
                               if k in calls},
        "strace_reply_rate": row["reply_rate"],
        "strace_offered_rate": plan.fixed_rate,
        "all_syscalls": calls,
    }


def parse_strace(text: str) -> dict[str, int]:
    """`strace -c` table -> {syscall: calls}."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            try:
                calls[parts[-1]] = int(parts[3])
            except ValueError:
                continue
    return calls


def run(plan: Plan, repo: Path, out: Path, rec: Recorder, reactors: tuple[str, ...] = REACTORS,
        stamp: str = "") -> None:
    with WorkerPool(plan.workers, target=rate_worker_main) as pool:
        for reactor in reactors:
            ns = plan.idle[reactor]
            srv = start_server(repo, out, f"reactor-{reactor}", reactor, MAX_CONNECTIONS[reactor])
            try:
                srv.warm_up()
                held = 0
                for n in ns:
                    t0 = time.monotonic()
                    held = hold_idle(pool, srv, held, n)
                    opened_s = round(time.monotonic() - t0, 2)
                    for workload, offered in plan.rates(n, ns).items():
                        for rate in offered:
                            row = rate_point(pool, srv, kind=workload, rate=rate,
                                             duration=plan.duration, conns=plan.conns,
                                             channel=f"active-{reactor}-{n}")
                            row.update(experiment="reactors", reactor=reactor, idle=n,
                                       fixed_rate=plan.fixed_rate,
                                       idle_open_s=opened_s, stamp=stamp,
                                       held=srv.stats()["waiting"])
                            rec.point(row, f"{reactor} N={n} {workload} {rate}/s -> "
                                           f"{row['reply_rate']}/s p99 "
                                           f"{row['latency_p99_ms']} ms")
                    if n == ns[-1] and plan.strace_s and not shutil.which("strace"):
                        print("strace is not installed: no system-call counts", flush=True)
                    elif n == ns[-1] and plan.strace_s:
                        row = strace_window(pool, srv, out, reactor, n, plan)
                        row.update(experiment="strace", reactor=reactor, idle=n, stamp=stamp)
                        rec.point(row, f"{reactor} N={n} strace {row['syscalls_per_reply']}")
                pool.close_all()
            finally:
                srv.stop()
