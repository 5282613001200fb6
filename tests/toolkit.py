"""The one toolkit of the tests that run real processes: ports, waits, a `pushup
serve` node stopped by its PID, and the mark for tests that need the compiled core.

Process plumbing that ``deploy/`` and ``loadtest/`` use too lives in
``deploy/processes.py`` (``loadtest`` takes it from there, not from ``tests``); this
module re-exports it and adds what only tests need. Fixtures that start processes stop
them by PID at teardown, never by name.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pushup
from deploy.processes import (
    NETWORK_ERRORS,
    alive,
    children,
    clean_env,
    free_port,
    wait_healthy,
    wait_until,
)

__all__ = ["NETWORK_ERRORS", "ROOT", "ServedNode", "alive", "children", "clean_env", "compiled",
           "free_port", "needs_compiled", "serve", "wait_healthy", "wait_until"]

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 30.0  # seconds for a node to print its listening line (a busy machine)
STOP_TIMEOUT = 15.0  # seconds for a node to drain and exit after SIGTERM

# The core this run imports (docs/contributing.md, "A compiled core"). A test that
# needs the compiled one is skipped when it is not: PUSHUP_PURE=1, or nothing built
# (with PUSHUP_PURE=1 even if a build exists, though clean_env drops the variable).
compiled = pushup.BUILD.startswith("compiled")
needs_compiled = pytest.mark.skipif(
    not compiled, reason=f"needs the compiled core; this run has the {pushup.BUILD}")


class ServedNode:
    """``pushup serve`` as a user starts it: its own process on a loopback port,
    stderr in a log file of its own (``lines()``), started once it prints its
    listening line; ``stop`` and ``kill`` act on its PID only.

    ``port`` None picks a free one and passes ``--port``; flags with ``--config``
    get no ``--port`` (the file names it: pass the same ``port``). ``env`` is added
    to an environment without any ``PUSHUP_*`` setting. ``session``: the node gets
    a process group of its own (a signal to the group reaches its workers).
    """

    def __init__(self, *flags: str, port: int | None = None, env: dict[str, str] | None = None,
                 session: bool = False) -> None:
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        port_flags = [] if "--config" in flags else ["--port", str(self.port)]
        self.argv = [sys.executable, "-m", "pushup", "serve", *port_flags, *flags]
        self.log = Path(tempfile.mkstemp(prefix="pushup-node-", suffix=".log")[1])
        with open(self.log, "wb") as stderr:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=stderr,
                                         stdin=subprocess.DEVNULL, env=clean_env(env),
                                         cwd=ROOT, start_new_session=session)
        self.listening = self._first_line(START_TIMEOUT)
        if not self.listening.startswith("listening on http://"):
            self.kill()
            raise AssertionError(f"{self.argv} did not start: first line {self.listening!r}, "
                                 f"exit {self.proc.returncode}; log: {self.lines()[-20:]}")

    def _first_line(self, timeout: float) -> str:
        """The first line of stdout, or what came of it within ``timeout``."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        line = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as ready:
            ready.register(fd, selectors.EVENT_READ)
            while not line.endswith(b"\n") and ready.select(deadline - time.monotonic()):
                byte = os.read(fd, 1)  # byte by byte: nothing after the line is taken
                if not byte:  # it exited
                    break
                line += byte
        return line.decode(errors="replace").strip()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lines(self) -> list[str]:
        """What the node has logged so far (stderr), line by line."""
        return self.log.read_text(errors="replace").splitlines()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        """Send ``sig`` (SIGTERM: drain and exit) and return the exit code; a node
        still running after ``timeout`` is killed, with its workers, and fails."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        workers = children(self.pid)
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(workers)
            raise AssertionError(f"{self.argv} did not exit within {timeout}s of {sig!r}; "
                                 f"log: {self.lines()[-20:]}") from None

    def kill(self, also: list[int] | None = None) -> None:
        """SIGKILL the node, and the PIDs in ``also`` (its workers), and reap it."""
        for pid in also or []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., ServedNode]]:
    """``serve(*flags, port=, env=, session=)``: a started ``ServedNode``. At teardown
    each node still running gets SIGTERM and must exit 0; its log is removed."""
    started: list[ServedNode] = []

    def start(*flags: str, **kw: object) -> ServedNode:
        started.append(ServedNode(*flags, **kw))  # type: ignore[arg-type]
        return started[-1]

    yield start
    failures = []
    for node in started:
        code = node.stop()
        if code != 0:
            failures.append(f"{node.argv} exited {code}; log: {node.lines()[-10:]}")
        node.log.unlink(missing_ok=True)
    assert not failures, failures
