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
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import pushup
from deploy.processes import (
    LISTENING,
    NETWORK_ERRORS,
    alive,
    children,
    clean_env,
    first_line,
    free_port,
    wait_healthy,
    wait_until,
)

__all__ = ["LISTENING", "NETWORK_ERRORS", "ROOT", "ServedNode", "alive", "children", "clean_env",
           "compiled", "first_line", "free_port", "needs_compiled", "serve", "wait_healthy",
           "wait_until"]

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

    ``port`` None picks a free one and passes ``--port``, 0 passes ``--port 0``
    always (the port is read from the listening line); otherwise flags with
    ``--config`` get no ``--port`` (the file names it: pass the same ``port``).
    ``env`` is added to an environment without any ``PUSHUP_*`` setting.
    ``session``: the node gets a process group of its own (a signal to the group
    reaches its workers).
    ``program``: what runs ``serve`` (default ``python -m pushup``; e.g. the
    installed ``pushup`` script). ``healthy``: started once /health answers 200
    too (a node with peers or a data dir may load first).
    """

    def __init__(self, *flags: str, port: int | None = None, env: dict[str, str] | None = None,
                 session: bool = False, program: Sequence[str] | None = None,
                 healthy: bool = False, start_timeout: float = START_TIMEOUT) -> None:
        self.port = free_port() if port is None else port
        passed = port == 0 or "--config" not in flags
        port_flags = ["--port", str(self.port)] if passed else []
        self.argv = [*(program or (sys.executable, "-m", "pushup")), "serve", *port_flags,
                     *flags]
        self.log = Path(tempfile.mkstemp(prefix="pushup-node-", suffix=".log")[1])
        with open(self.log, "wb") as stderr:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=stderr,
                                         stdin=subprocess.DEVNULL, env=clean_env(env),
                                         cwd=ROOT, start_new_session=session)
        self.listening = first_line(self.proc, start_timeout)
        bound = LISTENING.match(self.listening)
        if bound is None:
            self.kill()
            raise AssertionError(f"{self.argv} did not start: first line {self.listening!r}, "
                                 f"exit {self.proc.returncode}; log: {self.lines()[-20:]}")
        self.host, self.port = bound.group(1), int(bound.group(2))
        self.url = f"http://127.0.0.1:{self.port}"
        if healthy:
            try:
                wait_healthy(self.url, time.monotonic() + start_timeout, self.proc)
            except (TimeoutError, RuntimeError) as e:
                self.kill()
                raise AssertionError(f"{self.argv} never became healthy ({e}); "
                                     f"log: {self.lines()[-20:]}") from None

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
