"""The controller's handle on the load-generator processes.

`WorkerPool` forks N `client.worker_main` processes once (before any server is
started) and sends them commands. Every wait is bounded: a worker that does not
answer in time, or dies, raises `PoolError`. Leaving the pool (context manager)
tells the workers to exit and terminates any that do not.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from array import array
from collections.abc import Callable
from typing import Any

from . import client


class PoolError(RuntimeError):
    pass


def split(total: int, parts: int) -> list[int]:
    """`total` spread over `parts` as evenly as possible."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class WorkerPool:
    def __init__(self, size: int, target: Callable[..., None] = client.worker_main,
                 extra_args: tuple[Any, ...] = ()) -> None:
        # `target(pipe, index, *extra_args)` runs in each worker; the default is the
        # bench's client, loadtest.experiments passes a subclass of its Worker.
        ctx = mp.get_context("fork")
        self.pipes = []
        self.procs = []
        for i in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=target, args=(child, i, *extra_args), daemon=True)
            p.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(p)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("exit",))
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)

    def _gather(self, expect: str, timeout: float) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + timeout
        replies = []
        for i, pipe in enumerate(self.pipes):
            while not pipe.poll(0.2):
                if not self.procs[i].is_alive():
                    raise PoolError(f"load worker {i} died (exit code {self.procs[i].exitcode})")
                if time.monotonic() > deadline:
                    raise PoolError(f"load worker {i} gave no {expect!r} reply in {timeout:.0f} s")
            msg = pipe.recv()
            if msg[0] != expect:
                raise PoolError(f"load worker {i} answered {msg[0]!r}, expected {expect!r}")
            replies.append(msg)
        return replies

    def subscribe(
        self, port: int, n: int, channel: str, timeout: int, repoll: bool = True,
        wait: float = 300.0, dialect: str = "pushup",
    ) -> tuple[list[int], dict[str, int]]:
        """Open `n` subscribers (spread over the workers) speaking `dialect`; returns
        (connected per worker, counters)."""
        for pipe, k in zip(self.pipes, split(n, len(self.pipes)), strict=False):
            pipe.send(("subscribe", port, k, channel, timeout, repoll, dialect))
        replies = self._gather("opened", wait)
        return [r[1] for r in replies], merge(r[2] for r in replies)

    def await_round(
        self, r: int, expected_per_worker: list[int], deadline: float
    ) -> tuple[array[float], int, dict[str, int]]:
        """Receipt times of round `r` from every worker; waits until each worker has
        `expected` receipts or wall time `deadline` passes."""
        for pipe, k in zip(self.pipes, expected_per_worker, strict=False):
            pipe.send(("await_round", r, k, deadline))
        replies = self._gather("round", max(deadline - time.time(), 0) + 30)
        times: array[float] = array("d")
        for rep in replies:
            times.frombytes(rep[2])
        return times, sum(rep[3] for rep in replies), merge(rep[4] for rep in replies)

    def counters(self) -> tuple[list[int], dict[str, int]]:
        for pipe in self.pipes:
            pipe.send(("counters",))
        replies = self._gather("counters", 30)
        return [r[1] for r in replies], merge(r[2] for r in replies)

    def publish(
        self, port: int, publishers: int, duration: float, channel_prefix: str,
        dialect: str = "pushup",
    ) -> tuple[array[float], dict[str, int]]:
        """Run `publishers` keep-alive publisher connections speaking `dialect` for
        `duration` seconds; returns (per-request latencies, counters)."""
        shares = split(publishers, len(self.pipes))
        for i, (pipe, k) in enumerate(zip(self.pipes, shares, strict=True)):
            pipe.send(("publish", port, k, duration, f"{channel_prefix}-{i}", dialect))
        replies = self._gather("published", duration + 60)
        lat: array[float] = array("d")
        for rep in replies:
            lat.frombytes(rep[1])
        return lat, merge(rep[2] for rep in replies)

    def fetch(
        self, port: int, connections: int, duration: float, channel: str, count: int,
        dialect: str = "pushup",
    ) -> tuple[array[float], dict[str, int]]:
        """Catch-up reads of `channel`'s first `count` messages, one after another on
        each of `connections` keep-alive connections, for `duration` seconds; returns
        (per-read latencies, counters: `read_ok` the reads answered 200)."""
        shares = split(connections, len(self.pipes))
        for pipe, k in zip(self.pipes, shares, strict=True):
            pipe.send(("fetch", port, k, duration, channel, count, dialect))
        replies = self._gather("published", duration + 60)
        lat: array[float] = array("d")
        for rep in replies:
            lat.frombytes(rep[1])
        return lat, merge(rep[2] for rep in replies)

    def repoll_all(self) -> int:
        """Send the held-back next poll of every subscriber (deferred re-poll mode)."""
        for pipe in self.pipes:
            pipe.send(("repoll_all",))
        return sum(r[1] for r in self._gather("repolled", 30))

    def close_all(self) -> None:
        for pipe in self.pipes:
            pipe.send(("close_all",))
        self._gather("closed", 60)


def merge(counters: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counters:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out
