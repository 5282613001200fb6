"""An open-loop, rate-controlled load: httperf's `--rate`, on the bench's load client.

`RateWorker` is the bench's `client.Worker` (same epoll loop, same idle
subscribers, same HTTP parsing) plus one command, ``rate``: send requests at a
fixed offered rate for a fixed time over a few keep-alive connections, whatever
the server does. Request *i* is due at ``start + i / rate``; it goes out on a
free connection, or waits in a bounded client-side backlog when every
connection is busy (the server is behind). Latency is measured from the due
time, not the send time, so queueing behind a slow server is counted (no
coordinated omission). Requests still waiting when the backlog is full are
dropped and counted ``unsent`` (httperf counts these as client timeouts).

A worker may first join a network namespace (`setns`) and aim at another
address: experiment 2 runs the same client inside the namespace it created.
"""

from __future__ import annotations

import ctypes
import os
import time
from array import array
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from loadtest.bench.client import Conn, Worker
from loadtest.bench.dialect import dialect
from loadtest.bench.server import raise_nofile

RATE = 3  # a fourth connection role next to client.SUBSCRIBER / PUBLISHER
CLONE_NEWNET = 0x40000000
BACKLOG_PER_CONN = 64  # client-side queue bound: past it a due request is dropped
DRAIN_GRACE = 2.0  # seconds to wait for answers after the last due time


class RateWorker(Worker):
    def __init__(self, pipe: Connection, index: int) -> None:
        super().__init__(pipe, index)
        self.rate_on = False
        self.rate_request = b""
        self.rate_ok = 200
        self.rate_start = 0.0
        self.rate_interval = 0.0
        self.rate_total = 0
        self.rate_next = 0  # index of the next due request
        self.rate_end = 0.0
        self.free: deque[Conn] = deque()
        self.backlog: deque[float] = deque()  # due times waiting for a free connection
        self.inflight: dict[int, float] = {}  # fd -> due time of its request
        self.latencies = array("d")
        self.done_at = array("d")
        self.rate_counts: dict[str, int] = {}

    def poll_timeout(self) -> float:
        timeout = super().poll_timeout()
        if self.rate_on:
            timeout = min(timeout, max(0.0, self.next_due() - time.time()))
        return timeout

    def tick(self) -> None:
        if self.rate_on:
            self.rate_tick()

    def next_due(self) -> float:
        if self.rate_next >= self.rate_total:
            return time.time() + 0.05
        return self.rate_start + self.rate_next * self.rate_interval

    def command(self, msg: tuple[Any, ...]) -> None:
        if msg[0] != "rate":
            super().command(msg)
            return
        _, self.port, rate, duration, conns, kind, channel, start = msg
        d = dialect("pushup", self.port, channel, 0)
        if kind == "subscribe":
            self.rate_request, self.rate_ok = d.poll_request(b""), 200
        else:
            self.rate_request = d.publish_request({"rate": self.index})
            self.rate_ok = 201
        self.rate_total = int(rate * duration)
        self.rate_interval = 1.0 / rate if rate else 0.0
        self.rate_start, self.rate_next = start, 0
        self.rate_end = start + duration
        self.latencies, self.done_at = array("d"), array("d")
        self.backlog.clear()
        self.rate_counts = {"offered": self.rate_total, "sent": 0, "replies": 0,
                            "errors": 0, "unsent": 0, "dropped_conns": 0}
        self.to_open, self.to_open_role = conns, RATE
        self.rate_on = True

    # -- the rate schedule ---------------------------------------------------------

    def rate_tick(self) -> None:
        now = time.time()
        limit = BACKLOG_PER_CONN * max(len(self.free) + len(self.inflight), 1)
        while self.rate_next < self.rate_total and self.next_due() <= now:
            due = self.next_due()
            self.rate_next += 1
            if self.free:
                self.send_rate(self.free.popleft(), due)
            elif len(self.backlog) < limit:
                self.backlog.append(due)
            else:
                self.rate_counts["unsent"] += 1
        if self.rate_next >= self.rate_total and (
                not self.inflight and not self.backlog or now > self.rate_end + DRAIN_GRACE):
            self.finish_rate()

    def finish_rate(self) -> None:
        self.rate_on = False
        self.rate_counts["unsent"] += len(self.backlog)
        self.rate_counts["unanswered"] = len(self.inflight)
        self.backlog.clear()
        for c in [c for c in self.conns.values() if c.role == RATE]:
            self.drop(c, None)
        self.free.clear()
        self.inflight.clear()
        self.reply("rated", self.latencies.tobytes(), self.done_at.tobytes(),
                   dict(self.rate_counts))

    def send_rate(self, c: Conn, due: float) -> None:
        self.inflight[c.fd] = due
        self.rate_counts["sent"] += 1
        self.send(c, self.rate_request)

    def became_free(self, c: Conn) -> None:
        if self.backlog:
            self.send_rate(c, self.backlog.popleft())
        else:
            self.free.append(c)

    # -- hooks into the bench client's connection handling ---------------------------

    def send_publish(self, c: Conn) -> None:
        if c.role == RATE:  # a rate connection just connected
            self.became_free(c)
        else:
            super().send_publish(c)

    def on_publish_response(self, c: Conn, status: int, now: float) -> None:
        if c.role != RATE:
            super().on_publish_response(c, status, now)
            return
        due = self.inflight.pop(c.fd, None)
        if due is not None:
            if status == self.rate_ok:
                self.rate_counts["replies"] += 1
                self.latencies.append(now - due)
                self.done_at.append(now)
            else:
                self.rate_counts["errors"] += 1
        self.became_free(c)

    def drop(self, c: Conn, reason: str | None) -> None:
        if c.role == RATE and self.rate_on:
            self.rate_counts["dropped_conns"] += 1
            if self.inflight.pop(c.fd, None) is not None:
                self.rate_counts["errors"] += 1
            if c in self.free:
                self.free.remove(c)
        super().drop(c, reason)


def join_netns(path: str) -> None:
    """Move this process into the network namespace at `path` (needs CAP_SYS_ADMIN)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def rate_worker_main(pipe: Connection, index: int, netns: str | None = None,
                     server_host: str | None = None, sources: list[str] | None = None) -> None:
    raise_nofile()
    if netns:
        join_netns(netns)
    worker = RateWorker(pipe, index)
    if server_host:
        worker.server_host = server_host
    if sources:
        worker.source_addresses = sources
    try:
        worker.run()
    except (EOFError, KeyboardInterrupt):
        pass
