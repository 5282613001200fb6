"""Cluster publish capacity (issues 28 and 37): the highest publish rate 1, 2
and 4 nodes sustain, each node on a CPU budget of its own.

For each workload, mode and node count: a ``LocalCluster`` behind HAProxy (as
many processes on its port as ``haproxies_for`` the polls), every node in its
own cgroup of ``cores`` (0.1 by default; ``loadtest.cgroups``, made and removed
here), HAProxy, redis-server and the load generator outside the budgets (their
CPU shown). A workload (``Workload``) is ``channels`` channels with
``per_channel`` long polls each: issue 28's 1,000 x 3 in every mode, issue 37's
19,000 x 1 (a channel per user) with ``redis-affine`` only (``WORKLOADS``). The
polls are opened through HAProxy a run of about FOLLOW_CHUNK at a time, each
run held before the next (bounded), and re-polled on every answer. A poll asks
to be held HOLD_S, longer than a configuration runs (HAProxy carries it as
long): no poll times out while rates are measured. (With a 100 s timeout,
19,000 polls opened in 23 s came back as a wave of ~800 re-polls/s for 23 s
every 100 s, and a configuration's capacity depended on which of its steps the
wave fell in: a node holding its polls in 76 s met its first wave 24 s into
its steps, one holding them in 23 s never met it before its last.) Publishes go
to the nodes directly, round robin over their ports, one channel each (publish
*g* to channel ``37 g mod channels``), open loop: publish *g* is due at
``start + g / rate`` whatever the nodes do, and waits in the generator when
every connection to its node is busy, so a slow node's queue is counted
(latencies run from the due time). The rate steps up by ``factor`` (x1.25) a
step of ``step_s`` seconds until a step fails; a step passes when every
publish was answered 201, every subscriber of its channel received it (100 %
delivered, none twice) and the fan-out p99 (receipt minus due time) is under
1 s. Capacity is the highest passing rate (after one finer step, x1.1, between
the last pass and the first fail, when ``refine``). The first rate of k nodes
is ``0.6 k`` x the 1-node capacity of the same mode; a first step that fails
steps down instead.

Modes: ``redis-affine`` (Redis engine, subscribes balanced by a consistent hash
of their channel, ``haproxy_config(balance="channel")``); ``redis-sticky``
(Redis, ``balance leastconn`` + ``option prefer-last-server``: a subscriber's
re-polls stay on one node, but a channel's subscribers are spread); ``redis-
publish-only`` (Redis, no subscribers: a step passes on 201s and a publish
answer p99 under 1 s); ``mesh`` (full replication, round robin, for
comparison). ``partitions`` sets the nodes' ``--redis-partitions`` (a node
follows whole partitions: with 64, a node holding a few hundred channels
follows nearly every partition, so it receives nearly every message). Each row
keeps the CPU (percent of one core over the passing
step) of every node, HAProxy, Redis and the generator, the nodes' throttling
and the load average; ratios are to the same workload and mode's 1 node, each
beside its target (``TARGETS``: issue 28's, which issue 37 keeps for both
workloads).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import socket
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from deploy.launch import LocalCluster

from .. import cgroups
from .client import SUBSCRIBER, Conn, Worker, worker_main
from .cluster import NODE_ARGS, Control, _waiting
from .dialect import PushUp
from .nodescale import _cpu, _wait
from .pool import WorkerPool, merge
from .scenarios import BenchError, Context, percentile

MODES = {  # name: (engine, HAProxy balance, subscribers)
    "redis-affine": ("redis", "channel", True),
    "redis-sticky": ("redis", "sticky", True),
    "redis-publish-only": ("redis", "roundrobin", False),
    "mesh": ("mesh", "roundrobin", True),
}
TARGETS = {  # issue 28: capacity of k nodes / 1 node's, at least
    "redis-affine": {2: 1.8, 4: 3.4},
    "redis-sticky": {2: 1.7, 4: 3.0},
    "redis-publish-only": {2: 1.9, 4: 3.6},
}
TRIP_LIMIT_S = 1.0  # a step fails at a fan-out (or publish answer) p99 past this
DRAIN_S = 5.0  # after the last due time: answers and deliveries still counted
CONNS_PER_NODE = 4  # publisher connections per node, per generator process
MAX_STEPS = 30
FOLLOW_CHUNK = 300  # polls opened at once (follow_chunks), each run held before the next
FOLLOW_CHUNK_S = 180.0  # the longest one run of polls may take to be held
FOLLOW_TOTAL_S = 1200.0  # the longest all of a configuration's polls may take to be held
# HAProxy's polls per process at most: one process holds about 10,000 proxied
# connections under this machine's 20,000 fds (deploy/haproxy.cfg.template), and
# the kernel spreads connections over processes on one port only roughly evenly
HAPROXY_POLLS = 7000
PUBLISHER = 4  # a connection role next to client.SUBSCRIBER / PUBLISHER
HOLD_S = 1800.0  # what each poll asks the node to hold it for: past a configuration's run


@dataclass(frozen=True)
class Workload:
    """``channels`` channels with ``per_channel`` long polls each, measured in
    ``modes`` (None: every mode the run measures)."""

    channels: int
    per_channel: int
    modes: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return f"{self.channels}x{self.per_channel}"


# Issue 28's 1,000 channels x 3 in every mode; issue 37's one channel per user
# (~19,000 x 1) with channel-affine balancing only, the mode its targets are for
# (the others would double the run for figures no target reads).
WORKLOADS = (Workload(1000, 3), Workload(19000, 1, modes=("redis-affine",)))


def parse_workload(text: str) -> Workload:
    """``CHANNELSxPOLLS`` (``19000x1``) -> that workload, in every mode measured."""
    channels, sep, per_channel = text.strip().lower().partition("x")
    if not sep or not channels.isdigit() or not per_channel.isdigit():
        raise ValueError(f"a workload is CHANNELSxPOLLS (like 19000x1), not {text!r}")
    w = Workload(int(channels), int(per_channel))
    if w.channels < 1 or w.per_channel < 1:
        raise ValueError(f"a workload needs at least 1 channel and 1 poll each: {text!r}")
    return w


def plan(workloads: tuple[Workload, ...], modes: tuple[str, ...]) -> list[tuple[Workload, str]]:
    """(workload, mode) in the order they run: each workload in each of ``modes``
    it is measured in."""
    return [(w, m) for w in workloads for m in modes if w.modes is None or m in w.modes]


def follow_chunks(channels: list[str], per_channel: int,
                  polls: int = FOLLOW_CHUNK) -> list[list[str]]:
    """``channels`` cut into runs of about ``polls`` polls each (at least one
    channel a run): the polls opened at once, each run held before the next."""
    size = max(1, polls // per_channel)
    return [channels[i:i + size] for i in range(0, len(channels), size)]


def haproxies_for(polls: int, per_process: int = HAPROXY_POLLS) -> int:
    """HAProxy processes (on one port, SO_REUSEPORT) enough to hold ``polls`` polls."""
    return max(1, -(-polls // per_process))


def held_again(held: int, alive: int) -> bool:
    """Whether the polls are held again before a step: all but 0.5 % (a node on
    0.1 core has some of the last step's on their way back at every instant).
    One on its way is not lost: its next poll carries its cursor (the delivery
    counts, later)."""
    return held >= alive - alive // 200


@dataclass
class Settings:
    workloads: tuple[Workload, ...] = WORKLOADS
    node_counts: tuple[int, ...] = (1, 2, 4)
    step_s: float = 10.0
    factor: float = 1.25
    start_rate: float = 50.0  # 1 node's first step
    refine: bool = True
    max_steps: int = MAX_STEPS
    modes: tuple[str, ...] = tuple(MODES)
    partitions: int | None = None  # the nodes' --redis-partitions (None: their default, 1,024)


class CapacityWorker(Worker):
    """The bench client plus subscribers of many channels (one a connection) and an
    open-loop publisher spread round robin over several node ports."""

    def __init__(self, pipe: Connection, index: int) -> None:
        super().__init__(pipe, index)
        self.to_follow: deque[str] = deque()
        self.dialect_of: dict[int, PushUp] = {}
        self.seen: dict[int, set[int]] = {}  # fd -> publish ids of this step received
        self.step = -1
        self.trips = array("d")  # receipt minus due time, this step
        self.pub: dict[str, Any] | None = None
        self.hold_s = HOLD_S

    # -- subscribers: one channel per connection ------------------------------------

    def send_poll(self, c: Conn) -> None:
        d = self.dialect_of.get(c.fd)
        if d is None:
            d = self.dialect_of[c.fd] = PushUp(self.port, self.to_follow.popleft(),
                                               self.hold_s)
        self.send(c, d.poll_request(c.position))

    def on_poll_response(self, c: Conn, status: int, head: bytes, body: bytes,
                         now: float) -> None:
        if status != 200:
            self.counters[f"poll_status_{status}"] += 1
            self.drop(c, None)  # re-polling into an error would spin
            return
        try:
            c.position, datas, gap = self.dialect_of[c.fd].read_poll(head, body)
        except (ValueError, KeyError, TypeError):
            self.drop(c, "bad_poll_body")
            return
        if gap:
            self.counters["gap"] += 1
        seen = self.seen.setdefault(c.fd, set())
        for data in datas:
            if not isinstance(data, dict) or data.get("cap") != self.step:
                self.counters["other_message"] += 1
                continue
            if data["id"] in seen:
                self.counters["duplicate"] += 1
                continue
            seen.add(data["id"])
            self.trips.append(now - data["t"])
        self.send_poll(c)

    def drop(self, c: Conn, reason: str | None) -> None:
        self.dialect_of.pop(c.fd, None)
        self.seen.pop(c.fd, None)
        if c.role == PUBLISHER and self.pub is not None:
            p = self.pub
            for q in p["free"].values():
                if c in q:
                    q.remove(c)
            if p["inflight"].pop(c.fd, None) is not None:
                p["counts"]["errors"] += 1
            p["counts"]["dropped_conns"] += 1
            self.forget(c)
            return
        super().drop(c, reason)

    # -- the open-loop publisher ------------------------------------------------------

    def poll_timeout(self) -> float:
        timeout = super().poll_timeout()
        p = self.pub
        if p is not None:
            timeout = min(timeout, max(0.0, self.due(p["next"]) - time.time()), 0.05)
        return timeout

    def due(self, i: int) -> float:
        p = self.pub
        assert p is not None
        return p["start"] + p["ids"][i] / p["rate"] if i < len(p["ids"]) else time.time() + 0.05

    def command(self, msg: tuple[Any, ...]) -> None:
        op = msg[0]
        if op == "follow":
            _, self.port, channels = msg
            self.to_follow.extend(channels)
            self.to_open, self.to_open_role, self.open_reply_due = len(channels), SUBSCRIBER, True
        elif op == "step":
            _, self.step, ports, rate, duration, start, workers, channels = msg
            for s in self.seen.values():
                s.clear()
            self.trips = array("d")
            total = int(rate * duration)
            ids = list(range(self.index, total, workers))
            self.pub = {"rate": rate, "start": start, "ids": ids, "next": 0, "ports": ports,
                        "channels": channels, "end": start + duration,
                        "free": {i: deque() for i in range(len(ports))},
                        "backlog": {i: deque() for i in range(len(ports))},
                        "inflight": {}, "node_of": {}, "latencies": array("d"),
                        "counts": {"offered": len(ids), "sent": 0, "ok": 0, "errors": 0,
                                   "dropped_conns": 0}, "statuses": {}}
            for i, port in enumerate(ports):
                for _ in range(CONNS_PER_NODE):
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    c = Conn(sock, PUBLISHER)
                    c.kind = PUBLISHER
                    self.conns[c.fd] = c
                    self.ep.register(c.fd, select.EPOLLIN)
                    self.pub["node_of"][c.fd] = i
                    self.pub["free"][i].append(c)
        elif op == "close_all":
            self.to_follow.clear()
            super().command(msg)
        elif op == "trips":
            self.reply("trips", self.trips.tobytes(), dict(self.counters))
        else:
            super().command(msg)

    def tick(self) -> None:
        p = self.pub
        if p is None:
            return
        now = time.time()
        ids = p["ids"]
        while p["next"] < len(ids) and self.due(p["next"]) <= now:
            g = ids[p["next"]]
            due = self.due(p["next"])
            p["next"] += 1
            node = g % len(p["ports"])
            if p["free"][node]:
                self.send_one(p["free"][node].popleft(), g, due)
            else:
                p["backlog"][node].append((g, due))
        if p["next"] >= len(ids) and (not p["inflight"] and not any(p["backlog"].values())
                                      or now > p["end"] + DRAIN_S):
            self.finish_step()

    def send_one(self, c: Conn, g: int, due: float) -> None:
        p = self.pub
        assert p is not None
        channels = p["channels"]
        body = json.dumps({"channels": [channels[(37 * g) % len(channels)]],
                           "data": {"cap": self.step, "id": g, "t": due}}).encode()
        p["inflight"][c.fd] = due
        p["counts"]["sent"] += 1
        self.send(c, b"POST /publish HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def on_publish_response(self, c: Conn, status: int, now: float) -> None:
        p = self.pub
        if p is None or c.role != PUBLISHER:
            super().on_publish_response(c, status, now)
            return
        due = p["inflight"].pop(c.fd, None)
        if due is not None:
            p["statuses"][str(status)] = p["statuses"].get(str(status), 0) + 1
            if status == 201:
                p["counts"]["ok"] += 1
                p["latencies"].append(now - due)
            else:
                p["counts"]["errors"] += 1
        node = p["node_of"][c.fd]
        if p["backlog"][node]:
            self.send_one(c, *p["backlog"][node].popleft())
        else:
            p["free"][node].append(c)

    def finish_step(self) -> None:
        p = self.pub
        assert p is not None
        self.pub = None
        counts = p["counts"]
        counts["unsent"] = sum(len(q) for q in p["backlog"].values())
        counts["unanswered"] = len(p["inflight"])
        for c in [c for c in self.conns.values() if c.role == PUBLISHER]:
            self.forget(c)
        self.reply("stepped", p["latencies"].tobytes(), counts, p["statuses"])


def capacity_worker_main(pipe: Connection, index: int) -> None:
    worker_main(pipe, index, CapacityWorker)


class CapacityPool(WorkerPool):
    def __init__(self, size: int, target: Callable[..., None] = capacity_worker_main) -> None:
        super().__init__(size, target=target)

    def follow(self, port: int, channels: list[str], per_channel: int) -> int:
        subs = [ch for ch in channels for _ in range(per_channel)]
        for i, pipe in enumerate(self.pipes):
            pipe.send(("follow", port, subs[i::len(self.pipes)]))
        return sum(r[1] for r in self._gather("opened", 300))

    def step(self, step: int, ports: list[int], rate: float, duration: float,
             channels: list[str]) -> tuple[list[float], dict[str, int], dict[str, int]]:
        start = time.time() + 0.3
        for pipe in self.pipes:
            pipe.send(("step", step, ports, rate, duration, start, len(self.pipes), channels))
        replies = self._gather("stepped", duration + DRAIN_S + 30)
        lat: array[float] = array("d")
        for rep in replies:
            lat.frombytes(rep[1])
        return list(lat), merge(r[2] for r in replies), merge(r[3] for r in replies)

    def trips(self) -> tuple[list[float], dict[str, int]]:
        for pipe in self.pipes:
            pipe.send(("trips",))
        replies = self._gather("trips", 30)
        out: array[float] = array("d")
        for rep in replies:
            out.frombytes(rep[1])
        return list(out), merge(r[2] for r in replies)


def bench_capacity(ctx: Context, s: Settings, cores: float, shares: int = 0) -> dict[str, Any]:
    """Results under ``workloads.<name>.modes.<mode>.<nodes>`` (a workload's name is
    CHANNELSxPOLLS, ``Workload.name``); ratios to the same workload and mode's 1 node."""
    settings = {**s.__dict__, "workloads": [dataclasses.asdict(w) for w in s.workloads],
                "cores": cores, "front_shares": shares}
    out: dict[str, Any] = {"settings": settings, "loadavg_at_start": os.getloadavg(),
                           "workloads": {}}
    pool = CapacityPool(len(ctx.pool.pids))
    with pool:
        out["generator"] = f"raw-epoll client, {len(pool.pids)} processes"
        for w, mode in plan(s.workloads, s.modes):
            per = out["workloads"].setdefault(w.name, {"channels": w.channels,
                                                       "per_channel": w.per_channel,
                                                       "modes": {}})
            rows: dict[str, Any] = {}
            for k in s.node_counts:
                base = rows.get("1", {}).get("capacity")
                first = max(s.start_rate, 0.6 * k * base) if base else s.start_rate
                try:
                    rows[str(k)] = _one(ctx, pool, s, w, mode, k, first, cores, shares)
                except Exception as e:  # one configuration that cannot run hides no other
                    ctx.log(f"    {w.name} {mode} {k} node(s): ERROR {type(e).__name__}: {e}")
                    rows[str(k)] = {"mode": mode, "nodes": k, "error": f"{type(e).__name__}: {e}",
                                    "capacity": None, "engine": MODES[mode][0], "steps": []}
                    pool.close_all()
            cap1 = rows.get("1", {}).get("capacity")
            for count, r in rows.items():
                r["ratio_to_1"] = (round(r["capacity"] / cap1, 2)
                                   if cap1 and r.get("capacity") else None)
                r["target_ratio"] = TARGETS.get(mode, {}).get(int(count))
            per["modes"][mode] = rows
    out["loadavg_at_end"] = os.getloadavg()
    return out


def _one(ctx: Context, pool: CapacityPool, s: Settings, w: Workload, mode: str, k: int,
         first: float, cores: float, shares: int) -> dict[str, Any]:
    engine, balance, subscribed = MODES[mode]
    workdir = ctx.out_dir / f"capacity-{ctx.stamp}-{w.name}-{mode}-{k}"
    run = f"{ctx.stamp}-{os.getpid()}-cap-{w.name}-{mode}{k}"
    load0 = os.getloadavg()
    channels = [f"cap-{w.name}-{mode}-{k}-{i}" for i in range(w.channels)]
    steps: list[dict[str, Any]] = []
    node_args = list(NODE_ARGS)
    if engine == "redis" and s.partitions:
        node_args += ["--redis-partitions", str(s.partitions)]
    n = w.channels * w.per_channel if subscribed else 0
    with cgroups.CpuBudgets(run, cores, log=ctx.log) as budgets, \
            LocalCluster(k, node_args=node_args, workdir=str(workdir), engine=engine,
                         balance=balance, haproxy_procs=haproxies_for(n),
                         longest_poll_s=HOLD_S) as c:
        node_pids = [p.pid for p in c.nodes if p is not None]
        for i, pid in enumerate(node_pids):
            budgets.assign(f"node{i + 1}", pid)
        others = {"haproxy": [h.pid for h in c.haproxies],
                  "redis": [c.redis.pid] if c.redis is not None else [],
                  "generator": pool.pids}
        if shares:
            for pid in others["haproxy"] + others["redis"] + pool.pids:
                budgets.favour("front", pid, shares)
        nodes = [Control(port) for port in c.node_ports]
        held: list[int] = [0] * k
        t_open = time.monotonic()
        opened = _open(pool, c.front_port, channels if n else [], w.per_channel, nodes)
        open_s = round(time.monotonic() - t_open, 1)
        if n:
            ctx.log(f"    {w.name} {mode} {k} node(s): {opened:,} polls held in {open_s:.0f} s")
        if opened < n:
            raise BenchError(f"only {opened}/{n} subscribers connected through HAProxy")
        if n:
            held = [x.stats()["waiting"] for x in nodes]
        rate, passed, failed = first, None, None
        going_down = False
        for step in range(s.max_steps):
            row = _step(pool, budgets, step, c.node_ports, rate, s, w, channels, n, nodes,
                        node_pids, others)
            steps.append(row)
            ctx.log(f"    {w.name} {mode} {k} node(s) {rate:.0f}/s: "
                    f"{'pass' if row['pass'] else 'FAIL'} ({row['why'] or 'ok'}; busiest node "
                    f"{row['node_cpu_pct_max']} %)")
            if row["pass"]:
                passed = rate if passed is None else max(passed, rate)
                if going_down or (failed is not None):
                    break
                rate *= s.factor
            else:
                failed = rate if failed is None else min(failed, rate)
                if passed is None:
                    going_down = True
                    rate /= s.factor
                elif s.refine and rate > passed * 1.1 * 1.01:
                    rate = passed * 1.1
                else:
                    break
        pool.close_all()
        applied, note = budgets.available, budgets.reason
    best = max((x for x in steps if x["pass"]), key=lambda x: x["rate"], default=None)
    worst = min((x for x in steps if not x["pass"]), key=lambda x: x["rate"], default=None)
    return {"mode": mode, "engine": engine, "balance": balance, "nodes": k,
            "workload": w.name, "haproxies": haproxies_for(n), "subscribers": n,
            "held_per_node": held, "open_s": open_s,
            "capacity": round(passed, 1) if passed is not None else None,
            # None: no step failed, the capacity is a lower bound (max_steps reached)
            "first_failed_rate": round(failed, 1) if failed is not None else None,
            "at_capacity": best, "first_failed": worst,
            "budget_cores": cores if applied else None, "budget_note": note or None,
            "loadavg_before": load0, "loadavg_after": os.getloadavg(), "steps": steps}


def _open(pool: CapacityPool, front_port: int, channels: list[str], per_channel: int,
          nodes: list[Control]) -> int:
    """Open ``per_channel`` polls on each of ``channels`` through HAProxy, a run of
    ``follow_chunks`` at a time, each held before the next; the polls connected.
    A node on 0.1 core takes a burst of cold first polls slowly (each one a read
    from Redis) and answers /health late meanwhile: all 3,000 of 1,000 x 3 at once
    got a node marked down and its polls answered 503. Bounded: FOLLOW_CHUNK_S a
    run, FOLLOW_TOTAL_S in all."""
    opened = 0
    deadline = time.monotonic() + FOLLOW_TOTAL_S
    for run in follow_chunks(channels, per_channel):
        # (the answer counts every subscriber connected so far)
        opened = pool.follow(front_port, run, per_channel)
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise BenchError(f"{FOLLOW_TOTAL_S:.0f} s passed opening the polls")
            _wait(f"{opened} polls held over {len(nodes)} nodes",
                  lambda o=opened: _waiting(nodes) >= o, min(FOLLOW_CHUNK_S, left))
        except BenchError as e:
            alive, counters = pool.counters()
            raise BenchError(f"{e}: {[x.stats()['waiting'] for x in nodes]} held, "
                             f"{sum(alive)} connected of {len(channels) * per_channel}, "
                             f"client counters {counters}") from None
    return opened


def _step(pool: CapacityPool, budgets: cgroups.CpuBudgets, step: int, ports: list[int],
          rate: float, s: Settings, w: Workload, channels: list[str], n: int,
          nodes: list[Control],
          node_pids: list[int], others: dict[str, list[int]]) -> dict[str, Any]:
    if n:  # (a subscriber answered an error is gone: wait for those still there)
        alive = sum(pool.counters()[0])
        _wait("every poll held again", lambda: held_again(_waiting(nodes), alive), 60)
    cpu0 = {f"node{i + 1}": _cpu([p]) for i, p in enumerate(node_pids)}
    cpu0.update({role: _cpu(pids) for role, pids in others.items()})
    throttle0 = budgets.throttling()
    t0 = time.monotonic()
    lat, counts, statuses = pool.step(step, ports, rate, s.step_s, channels)
    expected = counts["offered"] * w.per_channel if n else 0
    trips: list[float] = []
    counters: dict[str, int] = {}
    if n:  # deliveries still on their way: wait for them, a bounded time
        deadline = time.monotonic() + DRAIN_S
        while True:
            trips, counters = pool.trips()
            if len(trips) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.25)
    wall = time.monotonic() - t0
    cpu = {f"node{i + 1}": _cpu([p]) for i, p in enumerate(node_pids)}
    cpu.update({role: _cpu(pids) for role, pids in others.items()})
    throttle = budgets.throttling()
    # Redis: how many partitions each node follows (of --redis-partitions)
    followed = [x.stats().get("redis", {}).get("followed") for x in nodes]
    cpu_pct = {role: round(100 * (cpu[role] - cpu0[role]) / wall, 1) for role in cpu}
    delivered = round(100.0 * len(trips) / expected, 2) if expected else None
    p99 = percentile(trips, 99) if trips else None
    pub_p99 = percentile(lat, 99) if lat else None
    why = []
    if counts["ok"] < counts["offered"]:
        why.append(f"{counts['offered'] - counts['ok']} of {counts['offered']} publishes "
                   f"not answered 201 ({statuses}, unsent {counts['unsent']}, "
                   f"unanswered {counts['unanswered']})")
    if n and len(trips) < expected:
        why.append(f"delivered {delivered} %")
    if counters.get("duplicate"):
        why.append(f"{counters['duplicate']} duplicates")
    if n and (p99 is None or p99 >= TRIP_LIMIT_S):
        why.append(f"fan-out p99 {p99:.2f} s" if p99 is not None else "no deliveries")
    if not n and (pub_p99 is None or pub_p99 >= TRIP_LIMIT_S):
        why.append(f"publish p99 {pub_p99:.2f} s" if pub_p99 is not None else "no answers")
    k = len(node_pids)
    return {
        "step": step, "rate": round(rate, 1), "pass": not why, "why": "; ".join(why),
        "offered": counts["offered"], "answered_201": counts["ok"], "statuses": statuses,
        "unsent": counts["unsent"], "unanswered": counts["unanswered"],
        "delivered_pct": delivered,
        "trip_p50_s": round(percentile(trips, 50), 4) if trips else None,
        "trip_p99_s": round(p99, 4) if p99 is not None else None,
        "publish_p50_s": round(percentile(lat, 50), 4) if lat else None,
        "publish_p99_s": round(pub_p99, 4) if pub_p99 is not None else None,
        "cpu_pct": cpu_pct, "followed_partitions": followed,
        "node_cpu_pct_max": max(cpu_pct[f"node{i + 1}"] for i in range(k)),
        "throttled": {g: v.get("nr_throttled", 0) - throttle0.get(g, {}).get("nr_throttled", 0)
                      for g, v in throttle.items()},
        "client_counters": {key: v for key, v in counters.items()
                            if key in ("duplicate", "gap", "other_message")
                            or key.startswith(("poll_status", "closed", "recv_error"))},
        "wall_s": round(wall, 1), "loadavg": os.getloadavg(),
    }


def table(res: dict[str, Any]) -> str:
    """The capacities as a Markdown table per workload, a row per (mode, nodes)."""
    st = res["settings"]
    first: dict[str, Any] = next((r for wl in res["workloads"].values()
                                  for rows in wl["modes"].values()
                                  for r in rows.values() if "error" not in r), {})
    budget = (f"{st['cores']:g} core per node" if first.get("budget_cores")
              else f"NO budgets ({first.get('budget_note')})")
    parts = st.get("partitions") or "the nodes' default number of"
    out: list[str] = []
    for wl in res["workloads"].values():
        out += [f"Publish capacity: {wl['channels']:,} channels x {wl['per_channel']} long "
                f"polls through HAProxy, publishes round robin over the nodes, open loop, "
                f"steps of {st['step_s']:g} s x{st['factor']:g}; {parts} Redis partitions; "
                f"{budget}; generator {res['generator']}", "", *_rows(wl["modes"]), ""]
    return "\n".join(out[:-1])


def _rows(modes: dict[str, Any]) -> list[str]:
    lines = ["| mode | nodes | capacity publishes/s | x 1 node | target | verdict "
             "| first failed at | why "
             "| fan-out p50 / p99 s | node CPU % (each) | partitions followed (each) "
             "| HAProxy % | redis % | generator % "
             "| load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, rows in modes.items():
        for k, r in rows.items():
            if "error" in r:
                lines.append(f"| {mode} | {k} | ERROR: {r['error']} |")
                continue
            b = r.get("at_capacity") or {}
            c = b.get("cpu_pct", {})
            fail = r.get("first_failed")
            cap = r["capacity"] if r["first_failed_rate"] else f">= {r['capacity']}"
            target = r.get("target_ratio")
            followed = " / ".join(str(f) for f in b.get("followed_partitions", [])
                                  if f is not None) or "-"
            nodes_cpu = " / ".join(str(c.get(f"node{i + 1}", "-")) for i in range(int(k)))
            trip = (f"{b.get('trip_p50_s')} / {b.get('trip_p99_s')}" if r["subscribers"]
                    else f"(publish {b.get('publish_p50_s')} / {b.get('publish_p99_s')})")
            lines.append(
                f"| {mode} | {k} | {cap} | {r['ratio_to_1']} "
                f"| {f'>= {target}' if target else '-'} "
                f"| {verdict(r['ratio_to_1'], target)} "
                f"| {r['first_failed_rate']} | {fail['why'] if fail else '-'} | {trip} "
                f"| {nodes_cpu} | {followed} | {c.get('haproxy', '-')} "
                f"| {c.get('redis', '-') if r['engine'] == 'redis' else '-'} "
                f"| {c.get('generator', '-')} | {r['loadavg_before'][0]:.2f} |")
    return lines


def verdict(ratio: float | None, target: float | None) -> str:
    """``met`` or ``MISSED (need / got)`` for a ratio to 1 node against its target."""
    if target is None:
        return "-"
    if ratio is None:
        return "no figure"
    return "met" if ratio >= target else f"MISSED ({target / ratio:.2f}x)"
