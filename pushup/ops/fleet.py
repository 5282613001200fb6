"""``--workers``: the whole node's figures, whichever worker a scrape lands on.

The supervisor creates a small shared-memory board (a memfd) with one slot
per worker, and every worker inherits it. A worker writes its own figures
(JSON) into its slot every ``REFRESH`` seconds and whenever it answers
``/stats`` or ``/metrics``; answering, it then reads every slot and sums. So
a scrape is answered synchronously, from memory, with no request between
workers, and its own figures are exact while its siblings' are at most
``REFRESH`` seconds old.

Counters only grow. Each slot is written by one worker at a time and its
counters never decrease; the answering worker writes its slot before it
reads the others, so any later scrape, on any worker, sees at least as much.
A worker restarted by the supervisor starts from the counts its slot held
(the dead worker's last figures), and ``restarts`` says how often that
happened. Gauges (connections, waiting, memory) of a worker that stopped
writing are left out of the sums.

A slot holds two halves and a generation number: a write goes to the half
the reader is not told about, then bumps the generation, so a reader never
sees a torn write and a worker killed mid-write leaves the previous figures.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pushup.ops import timing
from pushup.ops.metrics import FIGURES, Column, engine_gauge, family_of, labelled

BOARD_ENV = "PUSHUP_WORKER_BOARD"  # "FD:INDEX:COUNT" of the inherited board
HALF = 32 * 1024  # bytes for one copy of a worker's figures
SLOT = 8 + 2 * HALF  # generation, then two halves (length + JSON)
REFRESH = 0.5  # seconds between a worker's own writes
STALE = 4 * REFRESH  # a slot not written for this long belongs to no live worker
# Counts summed over every worker that ever ran (a restart continues them).
COUNTERS = ("published", "delivered", "bytes_in", "bytes_out", "refused", "peer_refused",
            "cpu_seconds")
# Per live worker, summed for the node.
SUMMED = ("connections", "waiting", "rss_bytes", "open_fds")
# Each worker holds a replica of the whole cache: the node shows the largest.
REPLICATED = ("channels", "messages", "cached_bytes", "idempotency_keys", "idempotency_bytes")


def create_board(workers: int) -> int:
    """A shared-memory file for ``workers`` slots; returns its descriptor."""
    fd = os.memfd_create("pushup-workers", 0)
    os.ftruncate(fd, SLOT * workers)
    return fd


class Board:
    """The shared slots: write one's own, read anyone's."""

    def __init__(self, fd: int, count: int) -> None:
        self.count = count
        self._mem = mmap.mmap(fd, SLOT * count)
        self._gen: dict[int, int] = {}

    def write(self, index: int, figures: dict[str, Any]) -> None:
        data = json.dumps(figures, separators=(",", ":")).encode()
        if len(data) > HALF - 4:
            raise ValueError("a worker's figures do not fit in its slot")
        base = index * SLOT
        gen = struct.unpack_from("<Q", self._mem, base)[0] + 1
        half = base + 8 + (gen % 2) * HALF  # not the half readers are pointed at
        struct.pack_into("<I", self._mem, half, len(data))
        self._mem[half + 4:half + 4 + len(data)] = data
        struct.pack_into("<Q", self._mem, base, gen)

    def read(self, index: int) -> dict[str, Any] | None:
        """The figures last written to slot ``index``; None if never written."""
        base = index * SLOT
        for _ in range(100):
            gen = struct.unpack_from("<Q", self._mem, base)[0]
            if gen == 0:
                return None
            half = base + 8 + (gen % 2) * HALF
            (n,) = struct.unpack_from("<I", self._mem, half)
            data = self._mem[half + 4:half + 4 + n]
            # One newer write went to the other half; two may have reused ours.
            if struct.unpack_from("<Q", self._mem, base)[0] - gen <= 1:
                try:
                    figures: dict[str, Any] = json.loads(data)
                    return figures
                except ValueError:
                    pass
        return None


class Fleet:
    """This worker's view of the node's workers (see the module docstring)."""

    def __init__(self, board: Board, index: int, own: Callable[[], dict[str, Any]],
                 wall: Callable[[], float] = time.time) -> None:
        self.board = board
        self.index = index
        self._own = own
        self._wall = wall
        previous = board.read(index) or {}
        self._base = {k: previous.get(k, 0) for k in COUNTERS}
        self._base_timings: dict[str, Any] = previous.get("timings", {})
        self._restarts = previous.get("restarts", -1) + 1

    def publish(self) -> dict[str, Any]:
        """Write this worker's figures to its slot; returns them."""
        own = self._own()
        times = os.times()
        own["cpu_seconds"] = times.user + times.system
        own["peer_refused"] = own.get("peer_refused", 0)
        own["open_fds"] = open_fds()
        entry: dict[str, Any] = {
            "worker": self.index, "node_id": own["node_id"], "origin": own["origin"],
            "pid": os.getpid(), "restarts": self._restarts, "uptime_s": own["uptime_s"],
            "written_at": self._wall(), "peers": own["peers"],
            "engine": own.get("engine", "mesh"),
        }
        for key in COUNTERS:
            entry[key] = self._base[key] + own[key]
        entry["timings"] = timing.add(self._base_timings, own.get("timings", {}))
        entry["engine_up"] = own.get("engine_up", 1)
        for key in (*SUMMED, *REPLICATED):
            entry[key] = own.get(key, 0)
        self.board.write(self.index, entry)
        return entry

    def workers(self) -> list[dict[str, Any]]:
        mine = self.publish()
        now = self._wall()
        out = []
        for i in range(self.board.count):
            entry = mine if i == self.index else self.board.read(i)
            if entry is not None:
                entry["up"] = now - entry["written_at"] <= STALE
                out.append(entry)
        return out

    def stats(self) -> dict[str, Any]:
        """``/stats`` for the whole node, with a ``workers`` list of each one's figures."""
        workers = self.workers()
        live = [w for w in workers if w["up"]]
        node_id = workers[0]["node_id"].rsplit("-", 1)[0] if workers else ""
        stats: dict[str, Any] = {"node_id": node_id,
                                 "uptime_s": max((w["uptime_s"] for w in live), default=0)}
        for key in COUNTERS:
            stats[key] = sum(w[key] for w in workers)
        for key in SUMMED:
            stats[key] = sum(w[key] for w in live)
        for key in REPLICATED:
            stats[key] = max((w[key] for w in live), default=0)
        # The node's peers (other nodes, never its own workers), as this worker's links see them.
        stats["peers"] = [p for p in mine_peers(workers, self.index) if not p.get("sibling")]
        # The workers' engine: redis when they share a Redis log, else they are a mesh.
        stats["engine"] = workers[0]["engine"] if workers else "mesh"
        # Histograms and answer counts: every worker's, summed (like the counters).
        timings: dict[str, Any] = {}
        for w in workers:
            timings = timing.add(timings, w.get("timings", {}))
        stats["timings"] = timings
        stats["engine_up"] = min((w.get("engine_up", 1) for w in live), default=0)
        stats["answered_by"] = self.index
        stats["workers"] = workers
        return stats

    def metrics_text(self) -> bytes:
        """``/metrics`` for the whole node: totals, then per-worker series."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self.stats()))
        return generate_latest(registry)


class _Collector:
    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats, workers = self.stats, self.stats["workers"]
        for key, name, kind, text in FIGURES:
            yield family_of(kind)(name, text + ", all workers", value=stats[key])
        yield CounterMetricFamily("process_cpu_seconds", "CPU seconds of every worker",
                                  value=stats["cpu_seconds"])
        yield GaugeMetricFamily("process_resident_memory_bytes", "Resident memory, all workers",
                                value=stats["rss_bytes"])
        yield GaugeMetricFamily("process_open_fds", "Open descriptors, all workers",
                                value=stats["open_fds"])
        if stats["timings"]:
            yield from timing.families(stats["timings"], stats["engine"])
        yield engine_gauge(stats)
        yield from labelled(["worker"], WORKER_COLUMNS,
                            (([str(w["worker"])], w) for w in workers))
        for key, name, kind, text in FIGURES:
            if key == "uptime_s":
                continue
            per = name.replace("pushup_", "pushup_worker_", 1)
            metric = family_of(kind)(per, text + ", per worker", labels=["worker"])
            for w in workers:
                if kind == "counter" or w["up"]:
                    metric.add_metric([str(w["worker"])], w[key])
            yield metric
        yield from labelled(["worker", "peer"], SIBLING_COLUMNS,
                            (([str(w["worker"]), p["url"]], p)
                             for w in workers if w["up"] for p in w["peers"]))


WORKER_COLUMNS: tuple[Column, ...] = (
    ("gauge", "pushup_worker_up", "1 while the worker writes its figures",
     lambda w: 1 if w["up"] else 0),
    ("counter", "pushup_worker_restarts", "Times the worker restarted", lambda w: w["restarts"]),
)
SIBLING_COLUMNS: tuple[Column, ...] = (
    ("gauge", "pushup_worker_peer_queued", "Messages queued for a sibling",
     lambda p: p["queued"]),
    ("gauge", "pushup_worker_peer_up", "1 if the sibling link is up",
     lambda p: 1 if p["state"] == "up" else 0),
)


def mine_peers(workers: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The peer links of worker ``index``, from the workers' figures."""
    return next((list(w["peers"]) for w in workers if w["worker"] == index), [])


def join(spec: str, own: Callable[[], dict[str, Any]], clock: Any) -> Fleet:
    """This worker's Fleet from ``BOARD_ENV``'s value; writes its slot every REFRESH s."""
    from twisted.internet.task import LoopingCall

    fd, index, count = (int(part) for part in spec.split(":"))
    fleet = Fleet(Board(fd, count), index, own)
    os.close(fd)  # the mapping stays
    loop = LoopingCall(fleet.publish)
    loop.clock = clock
    loop.start(REFRESH, now=True)
    return fleet


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0
