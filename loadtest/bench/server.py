"""One `pushup serve` process: start it, talk to it, stop it (always).

A `Server` is a context manager. Leaving it, normally or by an exception, sends
SIGTERM and then SIGKILL after a grace period; the child also gets
PR_SET_PDEATHSIG so it dies with the harness even if the harness is killed -9.
The server's stderr goes to a log file in loadtest/out; its stdout is drained
by a thread so it can never block on a full pipe.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import resource
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import procfs

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


class Server:
    """A fresh server process on 127.0.0.1 with a free port."""

    def __init__(self, command: list[str], log_path: Path, cwd: Path) -> None:
        self.command = command
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._control: http.client.HTTPConnection | None = None

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=self.cwd,
            preexec_fn=_child_setup,
        )
        log.close()
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.stop()
                raise ServerError(
                    f"server did not print its listening line within {timeout:.0f} s "
                    f"(exit code {self.proc.returncode}); log tail:\n{self.log_tail()}"
                )
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(fd, 1)
                if not chunk:
                    continue
                line += chunk
        text = line.decode().strip()
        prefix = "listening on http://"
        if not text.startswith(prefix):
            self.stop()
            raise ServerError(f"unexpected first stdout line: {text!r}")
        self.port = int(text.rsplit(":", 1)[1].rstrip("/"))
        threading.Thread(target=self._drain, args=(fd,), daemon=True).start()

    def _drain(self, fd: int) -> None:
        try:
            while os.read(fd, 65536):
                pass
        except OSError:
            pass

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; returns the exit code."""
        if self._control is not None:
            self._control.close()
            self._control = None
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

    # -- control requests (one keep-alive connection from the controller) ---------

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0
    ) -> tuple[int, Any]:
        """One request on the control connection; returns (status, decoded JSON or None)."""
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for attempt in (1, 2):
            if self._control is None:
                self._control = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            try:
                self._control.request(method, path, body=payload, headers=headers)
                resp = self._control.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, OSError):
                self._control.close()
                self._control = None
                if attempt == 2 or not self.alive():
                    raise
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode(errors="replace")
        return resp.status, data

    def stats(self) -> dict[str, Any]:
        status, data = self.request("GET", "/stats")
        if status != 200 or not isinstance(data, dict):
            raise ServerError(f"/stats answered {status}: {data!r}")
        return data

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
        return procfs.rss_bytes(self.pid)

    def cpu(self) -> float:
        return procfs.cpu_seconds(self.pid)
