"""Rerun the paper's evaluation (section 4) against PushUp with real Locust.

    python -m loadtest.paper.run --profile quick|paper|scale|nodes-locust [--nodes 1,2,4]
                           [--out DIR | --results] [--budget CORES] [--engine mesh|redis]
                           [--modes cp,mlp,elp] [--cc 10,100,1000]
                           [--intervals 10,20,30,40,50] [--conns 500,...,16000]
                           [--repeat R] [--timeout 50]

Experiments (each point starts its own server, runs headless Locust in a
subprocess, measures, and stops everything, also on error or Ctrl-C):

- grid (paper 4.2, Tables 1-2, Figures 7-8): CP, MLP and ELP at cc
  concurrent subscribers; one Locust run per (mode, cc) publishes a warm-up
  message and then one message after each gap of ``intervals`` (e.g. 10, 30,
  50 s later). The window of each interval — from 2 s after the previous
  publish to 2 s after this one — holds exactly one publish and its whole
  fan-out, so its wire bytes are the paper's NT for that interval, and the
  message that ended the quiet gap gives MPT for it.
- scale (paper 4.3, Figures 9-11): MLP and ELP at 500-16,000 long-polling
  connections: SMU (RSS of the server processes, peak and while holding),
  MPT and RMP for a few messages each fanned out to every connection.
- nodes (paper 4.4, Figures 12-13): with ``--nodes 2,4`` (any N > 1) the
  scale points of ELP are also run on N nodes behind HAProxy
  (``deploy.launch.LocalCluster``). With ``--budget CORES`` every node runs in
  a CPU cgroup of its own with that quota (``loadtest.cgroups``; the 1-node
  point then runs behind HAProxy too, like the others), made after the nodes
  start and removed when they stop; Locust and HAProxy stay unbudgeted.
  Without a writable /sys/fs/cgroup/cpu the run goes on unbudgeted, prints so,
  and each row's ``budget_cores`` is null with ``budget_note`` saying why.
  The ``nodes-locust`` profile is that: ELP at 4,000 connections on 1, 2 and 4
  nodes, 0.1 core each.

Every figure is measured, none estimated: NT by nftables counters on the
server port (bytes on the wire, both directions, headers included); MPT from
the Locust ``DELIVER`` events (trip time of every received message); RMP =
received / (scheduled messages x connected subscribers), duplicates counted
apart (``rmp_published_pct`` divides by the messages the server accepted);
SMU and server CPU by sampling the server processes once a second; the load
generator's CPU (every Locust process) beside every point.

Output in DIR: results.jsonl (one line per point), raw/ (Locust CSVs and
logs), report.md and PNG figures (written by loadtest.paper.report). DIR is
``--out DIR`` if given; else the scratch folder loadtest/out/<profile>
(git-ignored); with ``--results``, loadtest/results/<profile>, the committed
results (``make loadtest RESULTS=1``). A run never replaces the committed
results unless asked to.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from deploy.processes import first_line, wait_healthy
from loadtest.cgroups import CpuBudgets
from loadtest.netcount import NetCountUnavailable, PortCounter, Traffic, available

ROOT = Path(__file__).resolve().parents[2]  # the repository
USERS = Path(__file__).resolve().parent / "users.py"
EDGE = 2.0  # an NT window runs from EDGE s after one publish to EDGE s after the next

PROFILES: dict[str, dict[str, Any]] = {
    # A smoke test: small numbers, about two minutes.
    "quick": dict(modes=["cp", "mlp", "elp"], cc=[10], intervals=[3, 5], repeat=1,
                  conns=[100, 300], scale_messages=3, scale_gap=3.0, timeout=50.0),
    # The paper's grid (4.2); scale points kept small.
    "paper": dict(modes=["cp", "mlp", "elp"], cc=[10, 100, 1000],
                  intervals=[10, 20, 30, 40, 50], repeat=1, conns=[], scale_messages=4,
                  scale_gap=10.0, timeout=50.0),
    # The paper's 4.3 (and 4.4 with --nodes): 500-16,000 connections.
    "scale": dict(modes=["mlp", "elp"], cc=[], intervals=[], repeat=1,
                  conns=[500, 1000, 2000, 4000, 8000, 16000], scale_messages=4,
                  scale_gap=10.0, timeout=50.0),
    # The paper's 4.4 (Figures 12-13) with a CPU budget per node: 1, 2, 4 nodes.
    # (The raw-epoll version, not bounded by Locust: make bench ONLY=scale.)
    # A gap of 8 s: one node at 0.1 core needs ~5 s per publish to 4,000 (re-polls
    # included), so publishes never overlap; 2 Locust processes (each < 50 %).
    "nodes-locust": dict(modes=["elp"], cc=[], intervals=[], repeat=1, conns=[4000],
                         scale_messages=5, scale_gap=8.0, timeout=50.0, nodes=[1, 2, 4],
                         budget=0.1, processes=2),
}


@dataclass
class Point:
    experiment: str  # grid | scale
    mode: str  # cp | mlp | elp
    users: int
    nodes: int = 1
    gaps: list[float] = field(default_factory=list)  # grid: seconds between publishes
    messages: int = 0  # scale: how many messages
    gap: float = 0.0  # scale: seconds between them
    timeout: float = 50.0
    procs: int = 0  # Locust processes; 0: one up to 4,000 users, else two
    budget: float = 0.0  # CPU cores per node (a cgroup each); 0: none
    engine: str = "mesh"  # the nodes' engine when there are several (or a budget)

    @property
    def edge(self) -> float:
        """NT windows start this long after a publish (its fan-out is done by then)."""
        return min(EDGE, min(self.gaps) / 3) if self.gaps else EDGE

    @property
    def label(self) -> str:
        n = f" nodes={self.nodes}" if self.nodes > 1 or self.budget else ""
        n += f" {self.engine}" if self.engine != "mesh" else ""
        n += f" budget={self.budget:g}" if self.budget else ""
        return f"{self.experiment} {self.mode.upper()} {self.users} subscribers{n}"

    @property
    def processes(self) -> int:
        return self.procs or (1 if self.users <= 4000 else 2)

    @property
    def rate(self) -> int:
        return min(max(self.users, 1), 400 if self.users > 4000 else 500)

    def startup(self) -> float:
        """Seconds from launching Locust until every subscriber should be connected."""
        return (6.0 if self.processes > 1 else 4.0) + self.users / self.rate + \
            (5.0 if self.users > 2000 else 2.0)

    def schedule(self, t0: float) -> list[tuple[float, str]]:
        if self.experiment == "grid":
            out, t = [(t0, "warmup")], t0
            for g in self.gaps:
                t += g
                out.append((t, f"{g:g}"))
            return out
        return [(t0 + k * self.gap, "s") for k in range(self.messages)]

    def drain(self) -> float:
        if self.experiment == "grid":
            return self.edge + 2.0 + self.users / 1000
        return 10.0 + self.users / 2000

    def duration(self) -> float:
        span = sum(self.gaps) if self.experiment == "grid" else self.gap * (self.messages - 1)
        return self.startup() + span + self.drain()


# -- processes -----------------------------------------------------------


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def get_stats(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url + "/stats", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


class Server:
    """The server under test: ELP (pushup serve), MLP (loadtest.paper.mlp), or N nodes."""

    def __init__(self, mode: str, nodes: int, users: int, workdir: Path, budget: float = 0.0,
                 engine: str = "mesh", run: str = "") -> None:
        self.mode, self.nodes, self.users, self.workdir = mode, nodes, users, workdir
        self.budget, self.engine, self.run = budget, engine, run or str(os.getpid())
        self.budgets: CpuBudgets | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.cluster: Any = None
        self.url = ""
        self.port = 0
        self.inner_ports: list[int] = []  # cluster: the nodes' ports

    def start(self) -> Server:
        log = open(self.workdir / "server.log", "ab")
        if self.mode != "mlp" and (self.nodes > 1 or self.budget):
            sys.path.insert(0, str(ROOT))
            from deploy.launch import LocalCluster

            procs = 2 if self.users > 9000 else 1
            self.cluster = LocalCluster(
                nodes=self.nodes, haproxy_procs=procs, workdir=str(self.workdir / "cluster"),
                node_args=["--max-connections", "20000", "--log-level", "warn"],
                engine=self.engine)
            (self.workdir / "cluster").mkdir(exist_ok=True)
            self.cluster.start()
            if self.budget:
                self.budgets = CpuBudgets(self.run, self.budget)
                for i, node in enumerate(self.cluster.nodes):
                    self.budgets.assign(f"node{i + 1}", node.pid)
            self.url, self.port = self.cluster.front_url, self.cluster.front_port
            self.inner_ports = list(self.cluster.node_ports)
            return self
        if self.mode == "mlp":
            argv = [sys.executable, "-m", "loadtest.paper.mlp", "--port", "0"]
        else:
            argv = [sys.executable, "-m", "pushup", "serve", "--port", "0", "--node-id", "elp",
                    "--max-connections", "20000", "--log-level", "warn"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, cwd=ROOT,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        line = first_line(self.proc, 30.0)  # deploy/processes.py's, as every starter's
        if not line.startswith("listening on"):
            self.stop()
            raise RuntimeError(f"{self.mode} server did not start: {line!r}")
        self.url = line.split()[-1]
        self.port = int(self.url.rsplit(":", 1)[1])
        wait_healthy(self.url, time.monotonic() + 30, self.proc)
        return self

    def pids(self) -> dict[str, list[int]]:
        """Server processes by role (nodes, haproxy)."""
        if self.cluster is not None:
            return {"server": [p.pid for p in self.cluster.nodes if p is not None],
                    "haproxy": [p.pid for p in self.cluster.haproxies],
                    "redis": [self.cluster.redis.pid] if self.cluster.redis else []}
        return {"server": [self.proc.pid] if self.proc else [], "haproxy": []}

    def stats(self) -> dict[str, Any]:
        if self.cluster is not None:
            return {f"node{i + 1}": get_stats(self.cluster.node_url(i))
                    for i in range(self.nodes)}
        return get_stats(self.url)

    def stop(self) -> None:
        try:
            if self.cluster is not None:
                self.cluster.stop()
                self.cluster = None
        finally:
            if self.budgets is not None:
                self.budgets.close()
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


def stop_process(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process (and its session's group, which we created), then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:  # the leader is gone; make sure no worker of its group is left
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


# -- sampling ------------------------------------------------------------


class Sampler:
    """RSS and CPU of process groups, sampled by the runner's loop."""

    def __init__(self) -> None:
        self.procs: dict[int, psutil.Process] = {}
        # role -> [(t, rss, cpu seconds, busiest single process's CPU % since last sample)]
        self.series: dict[str, list[tuple[float, int, float, float]]] = {}
        self._last: dict[int, tuple[float, float]] = {}
        # role -> pid -> last CPU seconds seen: processes that exit keep counting
        self._cum: dict[str, dict[int, float]] = {}
        psutil.cpu_percent()
        self.host: list[float] = []

    def _proc(self, pid: int) -> psutil.Process | None:
        p = self.procs.get(pid)
        if p is None:
            try:
                p = self.procs[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return p

    def sample(self, roles: dict[str, list[int]], tree: bool) -> None:
        now = time.monotonic()
        for role, pids in roles.items():
            rss, cpu, procs, busiest = 0, 0.0, [], 0.0
            for pid in pids:
                p = self._proc(pid)
                if p is None:
                    continue
                procs.append(p)
                if tree:
                    with contextlib.suppress(psutil.Error):
                        procs.extend(p.children(recursive=True))
            for p in procs:
                try:
                    with p.oneshot():
                        rss += p.memory_info().rss
                        t = p.cpu_times()
                        c = t.user + t.system
                except psutil.Error:
                    continue
                self._cum.setdefault(role, {})[p.pid] = c
                last = self._last.get(p.pid)
                if last is not None and now > last[0]:
                    busiest = max(busiest, 100.0 * (c - last[1]) / (now - last[0]))
                self._last[p.pid] = (now, c)
            if procs:
                cpu = sum(self._cum.get(role, {}).values())
                self.series.setdefault(role, []).append((now, rss, cpu, busiest))
        self.host.append(psutil.cpu_percent())

    def summary(self, role: str, t_from: float, t_to: float) -> dict[str, Any]:
        rows = [r for r in self.series.get(role, []) if t_from <= r[0] <= t_to]
        if len(rows) < 2:
            rows = self.series.get(role, [])[-2:]
        if not rows:
            return {}
        rss = [r[1] for r in rows]
        span = rows[-1][0] - rows[0][0]
        cpu = (rows[-1][2] - rows[0][2]) / span * 100 if span > 0 else 0.0
        return {"rss_peak_mb": round(max(rss) / 2**20, 1),
                "rss_mean_mb": round(sum(rss) / len(rss) / 2**20, 1),
                "cpu_pct": round(cpu, 1),
                "cpu_peak_pct": round(max(r[3] for r in rows[1:]), 1) if len(rows) > 1 else None}

    def rss_at(self, role: str, t: float) -> float | None:
        rows = [r for r in self.series.get(role, []) if r[0] <= t]
        return round(rows[-1][1] / 2**20, 1) if rows else None


# -- Locust results --------------------------------------------------------


def read_stats(prefix: Path) -> dict[tuple[str, str], dict[str, str]]:
    import csv

    path = Path(f"{prefix}_stats.csv")
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}


def users_at(prefix: Path, t: float) -> int | None:
    """Locust's user count at Unix time ``t`` (from the stats history)."""
    import csv

    path = Path(f"{prefix}_stats_history.csv")
    if not path.exists():
        return None
    found = None
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["Name"] == "Aggregated" and float(r["Timestamp"]) <= t:
                found = int(r["User Count"])
    return found


def _num(row: dict[str, str] | None, key: str) -> float:
    if not row:
        return 0.0
    try:
        return float(row.get(key) or 0)
    except ValueError:
        return 0.0


def ok_count(row: dict[str, str] | None) -> int:
    return int(_num(row, "Request Count") - _num(row, "Failure Count"))


# -- one point ----------------------------------------------------------------


def fmt(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    def __init__(self, points: list[Point]) -> None:
        self.points = points
        self.started = time.monotonic()
        self.overhead = 6.0  # server start/stop per point, refined as we go
        self.index = 0
        self.point_started = 0.0

    def begin(self, i: int) -> None:
        self.index, self.point_started = i, time.monotonic()

    def end(self) -> None:
        done = self.index + 1
        spent = time.monotonic() - self.started
        planned = sum(p.duration() for p in self.points[:done])
        self.overhead = max(2.0, (spent - planned) / done)

    def eta(self) -> float:
        p = self.points[self.index]
        left_here = max(0.0, p.duration() - (time.monotonic() - self.point_started))
        rest = sum(q.duration() + self.overhead for q in self.points[self.index + 1:])
        return left_here + rest

    def line(self, extra: str = "") -> str:
        p = self.points[self.index]
        return (f"[{self.index + 1}/{len(self.points)}] {p.label} | point "
                f"{fmt(time.monotonic() - self.point_started)}/{fmt(p.duration())} | elapsed "
                f"{fmt(time.monotonic() - self.started)} ETA {fmt(self.eta())}"
                + (f" | {extra}" if extra else ""))


def run_point(p: Point, out: Path, progress: Progress, run_id: str) -> list[dict[str, Any]]:
    name = (f"{p.experiment}-{p.mode}-n{p.nodes}-u{p.users}"
            + (f"-i{'_'.join(f'{g:g}' for g in p.gaps)}" if p.gaps else ""))
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"pushup-lt-{name}-"))
    server = Server("elp" if p.mode == "cp" else p.mode, p.nodes, p.users, work, p.budget,
                    p.engine, f"{run_id}-{os.getpid()}-{name}")
    locust: subprocess.Popen[bytes] | None = None
    counter: PortCounter | None = None
    sampler = Sampler()
    nt_reason = available()
    try:
        server.start()
        if not nt_reason:
            try:
                counter = PortCounter([server.port, *server.inner_ports],
                                      name=f"pushup_lt_{os.getpid()}").start()
            except NetCountUnavailable as e:
                nt_reason, counter = str(e), None
        channel = f"lt-{run_id}-{name}"
        launch = time.time()
        t0 = launch + p.startup()
        schedule = p.schedule(t0)
        t_last = schedule[-1][0]
        run_time = int(t_last + p.drain() - launch) + 1
        env = dict(os.environ, PUSHUP_LT_CHANNEL=channel, PUSHUP_LT_TIMEOUT=f"{p.timeout:g}",
                   PUSHUP_LT_SCHEDULE=json.dumps(schedule), PYTHONUNBUFFERED="1")
        cls = "PullUser" if p.mode == "cp" else "LongPollUser"
        prefix = raw / name
        argv = [sys.executable, "-m", "locust", "-f", str(USERS), "--headless",
                "--host", server.url, cls, "PublisherUser", "-u", str(p.users + 1),
                "-r", str(p.rate), "-t", f"{run_time}s", "--stop-timeout", "0",
                "--csv", str(prefix), "--only-summary", "--exit-code-on-error", "0",
                "--loglevel", "WARNING"]
        if p.processes > 1:
            argv += ["--processes", str(p.processes)]
        with open(raw / f"{name}.locust.log", "wb") as log:
            locust = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=ROOT, start_new_session=True)
        # Read the counters at each window edge; sample processes every second.
        marks = [(t + p.edge, f"after {tag}") for t, tag in schedule]
        marks.insert(0, (t0 - 0.5, "before"))
        snaps: dict[str, tuple[float, Traffic, Traffic]] = {}
        mono_t0 = time.monotonic() + (t0 - time.time())
        next_print = 0.0
        deadline = time.time() + run_time + 90
        while locust.poll() is None:
            now = time.time()
            if now > deadline:
                raise TimeoutError("Locust overran its run time")
            roles = server.pids()
            roles["locust"] = [locust.pid]
            sampler.sample({k: v for k, v in roles.items() if k != "locust"}, tree=False)
            sampler.sample({"locust": roles["locust"]}, tree=True)
            while marks and marks[0][0] <= time.time():
                _, label = marks.pop(0)
                if counter is not None:
                    c = counter.read()
                    front = c.get(server.port, Traffic())
                    inner = Traffic()
                    for port in server.inner_ports:
                        inner = inner + c.get(port, Traffic())
                    snaps[label] = (time.time(), front, inner)
            if time.monotonic() >= next_print:
                s = sampler.series.get("server", [])
                g = sampler.series.get("locust", [])
                extra = ""
                if s:
                    extra += f"server RSS {s[-1][1] / 2**20:.0f} MB"
                if len(g) > 5:
                    use = (g[-1][2] - g[-6][2]) / (g[-1][0] - g[-6][0]) * 100
                    extra += f", Locust CPU {use:.0f}%"
                print(progress.line(extra), flush=True)
                next_print = time.monotonic() + 10
            wake = min([time.time() + 1.0] + [m[0] for m in marks])
            time.sleep(max(0.05, min(1.0, wake - time.time())))
        final_traffic = counter.read() if counter is not None else {}
        budgets = server.budgets
        budget_row = {"budget_cores": p.budget if budgets and budgets.available else None,
                      "budget_note": (budgets.reason or None) if budgets else None,
                      "budget_throttling": budgets.throttling() if budgets else None}
        server_stats = server.stats()
        cpu_warning = b"CPU usage above" in (raw / f"{name}.locust.log").read_bytes()
    finally:
        if locust is not None:
            stop_process(locust, grace=20)
        server.stop()
        if counter is not None:
            counter.stop()
        for log_file in sorted(work.rglob("*.log")):  # keep what the servers said
            if log_file.stat().st_size:
                shutil.copy(log_file, raw / f"{name}.{log_file.name}")
        shutil.rmtree(work, ignore_errors=True)

    stats = read_stats(prefix)
    if not stats:
        raise RuntimeError(f"Locust wrote no stats; see {raw / name}.locust.log")
    connected = ok_count(stats.get(("GET", "connect")))
    mono_end = mono_t0 + (t_last - t0) + p.drain()
    server_use = sampler.summary("server", mono_t0, mono_end)
    gen_use = sampler.summary("locust", mono_t0, mono_end)
    hap_use = sampler.summary("haproxy", mono_t0, mono_end)
    host_cpu = round(sum(sampler.host) / max(1, len(sampler.host)), 1)
    polls = {k[1]: {"count": int(_num(v, "Request Count")),
                    "failures": int(_num(v, "Failure Count")),
                    "mean_ms": round(_num(v, "Average Response Time"), 1)}
             for k, v in stats.items() if k[0] in ("GET", "POST")}
    front_total = final_traffic.get(server.port, Traffic()) if final_traffic else None
    base: dict[str, Any] = {
        "run": run_id, "experiment": p.experiment, "mode": p.mode, "nodes": p.nodes,
        "engine": p.engine, **budget_row,
        "users": p.users, "timeout_s": p.timeout, "locust_processes": p.processes,
        "connected": connected, "requests": polls,
        # Locust users (subscribers + the publisher) running at the first publish
        "users_at_first_publish": users_at(prefix, t0),
        "gaps_seen": ok_count(stats.get(("GAP", "gap"))),
        "smu_peak_mb": server_use.get("rss_peak_mb"), "smu_mean_mb": server_use.get("rss_mean_mb"),
        "smu_hold_mb": sampler.rss_at("server", mono_t0 - 0.5),
        "server_cpu_pct": server_use.get("cpu_pct"),
        "server_cpu_peak_pct": server_use.get("cpu_peak_pct"),
        "haproxy_cpu_pct": hap_use.get("cpu_pct"),
        "haproxy_rss_peak_mb": hap_use.get("rss_peak_mb"),
        "gen_cpu_pct": gen_use.get("cpu_pct"),
        "gen_cpu_peak_pct": gen_use.get("cpu_peak_pct"),
        "gen_rss_peak_mb": gen_use.get("rss_peak_mb"),
        "gen_cpu_warning": cpu_warning, "host_cpu_pct": host_cpu,
        "nt_total": front_total.as_dict() if front_total else None,
        "nt_note": nt_reason or None,
        "server_stats": server_stats,
        "raw": str((raw / name).relative_to(out)),
    }
    rows = []
    tags = sorted({tag for _, tag in schedule}, key=lambda t: (t == "warmup", t))
    for tag in tags:
        d = stats.get(("DELIVER", f"mpt {tag}"))
        published = ok_count(stats.get(("POST", f"publish {tag}")))
        scheduled = sum(1 for _, t in schedule if t == tag)
        received = int(_num(d, "Request Count"))
        # RMP counts every message the publisher was scheduled to send: one the
        # server never accepted (publish refused, stuck or too late) is lost too.
        expected = scheduled * connected
        row = dict(base, tag=tag, scheduled=scheduled, published=published, received=received,
                   expected=expected,
                   duplicates=int(_num(stats.get(("DUPLICATE", f"dup {tag}")), "Request Count")),
                   rmp_pct=round(100.0 * received / expected, 2) if expected else None,
                   rmp_published_pct=(round(100.0 * received / (published * connected), 2)
                                      if published * connected else None),
                   mpt_mean_s=round(_num(d, "Average Response Time") / 1000, 4) if d else None,
                   mpt_p50_s=round(_num(d, "50%") / 1000, 4) if d else None,
                   mpt_p90_s=round(_num(d, "90%") / 1000, 4) if d else None,
                   mpt_p99_s=round(_num(d, "99%") / 1000, 4) if d else None,
                   mpt_max_s=round(_num(d, "Max Response Time") / 1000, 4) if d else None)
        if p.experiment == "grid" and tag != "warmup":
            row["interval_s"] = float(tag)
            i = [t for _, t in schedule].index(tag)
            a, b = f"after {schedule[i - 1][1]}", f"after {tag}"
            if a in snaps and b in snaps:
                row["nt_window_s"] = round(snaps[b][0] - snaps[a][0], 2)
                row["nt"] = (snaps[b][1] - snaps[a][1]).as_dict()
                if server.inner_ports:
                    row["nt_inner"] = (snaps[b][2] - snaps[a][2]).as_dict()
        if p.experiment == "scale" and "before" in snaps and f"after {tag}" in snaps:
            row["nt"] = (snaps[f"after {tag}"][1] - snaps["before"][1]).as_dict()
        rows.append(row)
    return rows


# -- the plan ------------------------------------------------------------------


def code_version() -> str:
    """The commit the servers under test run, and whether pushup/ had local edits."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "pushup", "deploy"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+uncommitted pushup/deploy edits" if dirty else "")


def plan(args: argparse.Namespace) -> list[Point]:
    prof = dict(PROFILES[args.profile])
    for key in ("modes", "cc", "intervals", "conns"):
        value = getattr(args, key)
        if value is not None:
            prof[key] = value
    for key in ("repeat", "timeout"):
        if getattr(args, key) is not None:
            prof[key] = getattr(args, key)
    nodes = args.nodes or prof.get("nodes") or [1]
    budget = args.budget if args.budget is not None else prof.get("budget", 0.0)
    points = []
    gaps = [float(g) for g in prof["intervals"]] * prof["repeat"]
    if gaps:
        for cc in prof["cc"]:
            for mode in prof["modes"]:
                points.append(Point("grid", mode, cc, 1, gaps=gaps, timeout=prof["timeout"],
                                    procs=args.processes))
    for n in nodes:
        for conns in prof["conns"]:
            for mode in prof["modes"]:
                if mode == "cp" or (mode == "mlp" and n > 1):
                    continue
                points.append(Point("scale", mode, conns, n, messages=prof["scale_messages"],
                                    gap=prof["scale_gap"], timeout=prof["timeout"],
                                    procs=args.processes or prof.get("processes", 0),
                                    budget=budget if mode == "elp" else 0.0,
                                    engine=args.engine))
    return points


def _list(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        return [kind(x) for x in text.split(",") if x.strip()] if text else []
    return parse


SCRATCH = Path("loadtest") / "out"  # git-ignored; the default
RESULTS = Path("loadtest") / "results"  # committed; only with --results


def output_dir(args: argparse.Namespace) -> Path:
    """Where a run writes: --out, else --results' committed folder, else scratch."""
    if args.out is not None:
        return Path(args.out)
    return ROOT / (RESULTS if args.results else SCRATCH) / args.profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--nodes", type=_list(int), default=None,
                        help="node counts for the scale points (e.g. 1,2,4); N>1 = HAProxy")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=None,
                       help="output folder (default: loadtest/out/<profile>, git-ignored)")
    where.add_argument("--results", action="store_true",
                       help="write the committed results, loadtest/results/<profile>")
    parser.add_argument("--budget", type=float, default=None,
                        help="CPU cores per node for the scale points, a cgroup each "
                        "(default: the profile's; 0: none)")
    parser.add_argument("--engine", choices=["mesh", "redis"], default="mesh",
                        help="the nodes' engine when there are several or a budget")
    parser.add_argument("--modes", type=_list(str), default=None)
    parser.add_argument("--cc", type=_list(int), default=None, help="grid subscriber counts")
    parser.add_argument("--intervals", type=_list(float), default=None,
                        help="grid publish intervals, seconds")
    parser.add_argument("--conns", type=_list(int), default=None, help="scale connection counts")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=None, help="long-poll hold, seconds")
    parser.add_argument("--processes", type=int, default=0,
                        help="Locust processes per point (default: 1 up to 4,000 users, else 2)")
    parser.add_argument("--append", action="store_true",
                        help="add to an existing results.jsonl instead of replacing it")
    parser.add_argument("--no-report", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    points = plan(args)
    if not points:
        print("nothing to run", file=sys.stderr)
        return 2
    out = output_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    if not args.append and results.exists():
        results.unlink()
    raise_nofile()
    if available():
        print(f"warning: no NT figures: {available()}", file=sys.stderr)
    run_id = time.strftime("%Y%m%dT%H%M%S")
    version = code_version()
    progress = Progress(points)
    total = sum(p.duration() + progress.overhead for p in points)
    print(f"{len(points)} points, about {fmt(total)} (min:s); results in {out}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    failed = 0
    try:
        for i, p in enumerate(points):
            progress.begin(i)
            print(progress.line("starting"), flush=True)
            try:
                rows = run_point(p, out, progress, run_id)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # one bad point must not lose the others
                failed += 1
                print(f"  point failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                rows = [dict(run=run_id, experiment=p.experiment, mode=p.mode, nodes=p.nodes,
                             users=p.users, error=f"{type(e).__name__}: {e}")]
            with open(results, "a") as f:
                for row in rows:
                    row["code"] = version
                    f.write(json.dumps(row) + "\n")
            for row in rows:
                if "error" in row:
                    continue
                print(f"  {row['tag']:>6}: published {row['published']}/{row['scheduled']}, "
                      f"rx {row['received']}/{row['expected']} "
                      f"RMP {row['rmp_pct']}% dup {row['duplicates']} MPT "
                      f"{row['mpt_mean_s']} s (p99 {row['mpt_p99_s']}) "
                      f"NT {(row.get('nt') or {}).get('bytes')} B | SMU peak "
                      f"{row['smu_peak_mb']} MB, server CPU {row['server_cpu_pct']}%, "
                      f"Locust CPU {row['gen_cpu_pct']}% (peak proc {row['gen_cpu_peak_pct']}%)",
                      flush=True)
            progress.end()
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    if not args.no_report:
        from loadtest.paper.report import write_report

        write_report(out)
        print(f"report: {out / 'report.md'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
