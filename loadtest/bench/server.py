"""One server under test: start it, talk to it, account for it, stop it (always).

A `Server` is a context manager. Leaving it, normally or by an exception, sends
SIGTERM to the process it started and then SIGKILL after a grace period; any of
its descendants still alive after that are killed by PID. The child also gets
PR_SET_PDEATHSIG so it dies with the harness even if the harness is killed -9.
The server's stderr goes to a log file in loadtest/out; its stdout is drained
by a thread so it can never block on a full pipe.

A server is all of its processes: CPU and RSS are summed over the process the
harness started and its descendants as they are once it serves (`pushup serve
--workers N`: the supervisor and its N workers; nginx: master and worker).

This class is `pushup serve` (`--workers N` included: `/stats` is then summed
over the workers, found through the workers' sibling links); `nchan.NchanServer`
adapts it to nginx + nchan. The load client speaks the server's `dialect`.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deploy.processes import first_line
from pushup.backplane.mesh.dial import UNIX_SCHEME
from pushup.ops.workers import UnixHTTPConnection

from . import procfs


def _private_address(url: str) -> int | str:
    """A worker's private address from its sibling URL: a loopback port, or
    ``http+unix://NAME`` as is (an abstract Unix socket)."""
    if url.startswith(UNIX_SCHEME + "://"):
        return url
    return int(url.rsplit(":", 1)[1].rstrip("/"))


PR_SET_PDEATHSIG = 1


def raise_nofile() -> int:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _child_setup() -> None:
    # Runs in the child between fork and exec.
    raise_nofile()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class ServerError(RuntimeError):
    pass


# /stats keys that add up over the workers of `pushup serve --workers N`.
SUMMED_STATS = ("connections", "waiting", "channels", "published", "delivered",
                "bytes_in", "bytes_out", "rss_bytes")


class Server:
    """A fresh `pushup serve` on 127.0.0.1 with a free port (its first stdout line)."""

    dialect = "pushup"  # how the load client talks to it (see dialect.py)

    def __init__(self, command: list[str], log_path: Path, cwd: Path, workers: int = 1) -> None:
        self.command = command
        self.log_path = log_path
        self.cwd = cwd
        self.workers = workers
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.host = "127.0.0.1"  # where control requests go (the address it listens on)
        self.pids: list[int] = []  # every process of the server, once it serves
        self._identity: list[tuple[int, int | None]] = []
        self._control: dict[int, http.client.HTTPConnection] = {}
        self._worker_ports: list[int | str] = []
        # Told once the server serves (its processes known): e.g. CPU budgets.
        self.on_serving: Callable[[Server], None] | None = None

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spawn(self, stdout: int) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=log,
                cwd=self.cwd,
                preexec_fn=_child_setup,
            )
        return self.proc

    def serving(self) -> None:
        """Note the server's processes (call once it answers requests)."""
        self.pids = procfs.descendants(self.pid)
        self._identity = [(p, procfs.start_ticks(p)) for p in self.pids]
        if self.on_serving is not None:
            self.on_serving(self)

    def start(self, timeout: float = 30.0) -> None:
        self.spawn(subprocess.PIPE)
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        text = first_line(self.proc, timeout)  # deploy/processes.py's, as every starter's
        if not text:
            self.stop()
            raise ServerError(
                f"server did not print its listening line within {timeout:.0f} s "
                f"(exit code {self.proc.returncode}); log tail:\n{self.log_tail()}"
            )
        prefix = "listening on http://"
        if not text.startswith(prefix):
            self.stop()
            raise ServerError(f"unexpected first stdout line: {text!r}")
        self.port = int(text.rsplit(":", 1)[1].rstrip("/"))
        threading.Thread(target=self._drain, args=(fd,), daemon=True).start()
        self.serving()  # with --workers, every worker is up before the line is printed

    def _drain(self, fd: int) -> None:
        try:
            while os.read(fd, 65536):
                pass
        except OSError:
            pass

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; then SIGKILL to any of the
        server's processes still alive (same pid and start time); returns the exit code."""
        for conn in self._control.values():
            conn.close()
        self._control.clear()
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid, started in self._identity:
            if started is not None and procfs.start_ticks(pid) == started:
                os.kill(pid, signal.SIGKILL)
        return proc.returncode

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- control requests (one keep-alive connection per port from the controller) -----

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0,
        port: int | str | None = None,
    ) -> tuple[int, Any]:
        """One request on a control connection to `port` (default: the server's; a
        string is a worker's private address, an abstract Unix socket's URL);
        returns (status, decoded JSON, else the text, or None when empty)."""
        port = port or self.port
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for attempt in (1, 2):
            conn = self._control.get(port)
            if conn is None:
                conn = self._control[port] = (
                    http.client.HTTPConnection(self.host, port, timeout=timeout)
                    if isinstance(port, int) else UnixHTTPConnection(port, timeout))
            try:
                conn.request(method, path, body=payload, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                del self._control[port]
                if attempt == 2 or not self.alive():
                    raise
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode(errors="replace")
        return resp.status, data

    def stats(self) -> dict[str, Any]:
        """The node's /stats; with --workers N, the SUMMED_STATS keys summed over the
        workers' own, exact figures (each worker asked on its private address: the
        shared port's sums carry siblings' figures up to 0.5 s old) and the per-worker
        figures."""
        first = self._stats(self.port)
        if self.workers == 1:
            return first
        if not self._worker_ports:
            self._worker_ports = self._find_workers(first)
        per = [self._own(self._stats(p)) for p in self._worker_ports]
        if not per[0]:  # a PushUp from before the fleet: its own /stats is its own
            per = [self._stats(p) for p in self._worker_ports]
        total = {k: sum(s.get(k, 0) for s in per) for k in SUMMED_STATS}
        return {**total, "workers": per}

    def _stats(self, port: int | str) -> dict[str, Any]:
        status, data = self.request("GET", "/stats", port=port)
        if status != 200 or not isinstance(data, dict):
            raise ServerError(f"/stats on port {port} answered {status}: {data!r}")
        return data

    @staticmethod
    def _own(stats: dict[str, Any]) -> dict[str, Any]:
        """The answering worker's own entry of a --workers /stats ({} before the fleet)."""
        return next((w for w in stats.get("workers", ())
                     if w["worker"] == stats["answered_by"]), {})

    def _find_workers(self, first: dict[str, Any]) -> list[int | str]:
        """The private addresses of all workers: the union of their sibling links
        (from each worker's entry, or, for a PushUp from before the fleet, by
        following each worker's own `peers`, so old and new servers compare in one
        run). A loopback port, or (since workers talk over Unix sockets) the URL of
        an abstract Unix socket."""
        ports: list[int | str] = []
        todo = [first] if "workers" not in first else []
        for worker in first.get("workers", []):
            for peer in worker.get("peers", []):
                port = _private_address(peer["url"])
                if port not in ports:
                    ports.append(port)
        while todo:
            for peer in todo.pop()["peers"]:
                port = _private_address(peer["url"])
                if port not in ports:
                    ports.append(port)
                    todo.append(self._stats(port))
        if len(ports) != self.workers:
            raise ServerError(f"found {len(ports)} workers through /stats workers' peers, "
                              f"expected {self.workers}")
        return ports

    def publish(self, channel: str, data: Any) -> tuple[bool, Any]:
        """One publish on the control connection: (accepted, answer)."""
        status, doc = self.request("POST", "/publish", {"channels": [channel], "data": data})
        return status == 201, doc

    def warm_up(self) -> None:
        """A few requests of every kind, so lazy imports and first-use caches are not
        counted as per-subscription memory."""
        self.stats()
        for _ in range(3):
            self.request("GET", "/subscribe?channels=bench-warm&timeout=0")
            ok, doc = self.publish("bench-warm", {})
            if not ok:
                raise ServerError(f"warm-up publish refused: {doc!r}")
        self.request("GET", "/health")

    def wait_for(
        self, what: str, predicate: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        """Poll /stats until `predicate(stats)`; ServerError on timeout or death.

        A readiness wait on the server's own state, not a fixed sleep: it returns as
        soon as the condition holds (polling every 20 ms, a negligible load).
        """
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while True:
            if not self.alive():
                raise ServerError(f"server died while waiting for {what}:\n{self.log_tail()}")
            last = self.stats()
            if predicate(last):
                return last
            if time.monotonic() > deadline:
                raise ServerError(
                    f"timed out after {timeout:.0f} s waiting for {what}; stats={last}")
            time.sleep(0.02)

    def rss(self) -> int:
        """VmRSS summed over the server's processes."""
        return sum(procfs.rss_bytes(p) for p in self.pids)

    def cpu(self) -> float:
        return sum(procfs.cpu_seconds(p) for p in self.pids)
