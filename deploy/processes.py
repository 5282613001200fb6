"""The process plumbing shared by everything here that starts real processes: the
launchers in ``deploy/``, the load tests in ``loadtest/`` and the test suite (through
``tests/toolkit.py``).

A loopback port nothing listens on, a bounded wait for a condition or for a node's
/health, the children of a process and whether one is alive, and the environment a
node is started in. Standard library only, and nothing here imports ``tests`` or
``loadtest``: ``deploy/launch.py`` runs as a script, and ``loadtest`` takes these
from here, not from ``tests``.
"""

from __future__ import annotations

import http.client
import os
import re
import selectors
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# The first line `pushup serve` prints on stdout once it listens (the port it bound).
LISTENING = re.compile(r"^listening on http://([^:/\s]+|\[[^\]]+\]):(\d+)$")

# What a condition on a process that is starting or stopping may raise meanwhile:
# it is not listening yet, or it closed the connection mid-answer.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)


def free_port() -> int:
    """A loopback port nothing listens on now; whoever binds it a moment later may
    lose a race, which shows as that process failing to start."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
               msg: str = "condition",
               retry_on: tuple[type[BaseException], ...] = NETWORK_ERRORS) -> T:
    """Poll ``condition`` until it returns something true, and return that.

    A ``retry_on`` error counts as "not yet" (a node not listening yet). After
    ``timeout`` seconds, an AssertionError names ``msg``, the last value and the
    last error: the wait is a hang guard, never a timing assertion.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
            last = value
        except retry_on as e:
            error = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"{msg} not reached within {timeout}s (last={last!r}"
                                 + (f", last error: {error!r})" if error else ")"))
        time.sleep(interval)


def wait_healthy(url: str, deadline: float, proc: subprocess.Popen[bytes] | None = None,
                 context: ssl.SSLContext | None = None) -> None:
    """Until ``url``'s /health answers 200 (a node may load its peers' cache or its
    data first); RuntimeError if ``proc`` exits meanwhile, TimeoutError at
    ``deadline`` (``time.monotonic()``). ``context``: an https URL's TLS (e.g.
    one that trusts a front's self-signed certificate)."""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0,
                                        context=context) as response:
                if response.status == 200:
                    return
        except OSError:  # not listening yet, or 503 (an HTTPError) while it loads
            pass
        time.sleep(0.05)  # polling, bounded by the deadline
    raise TimeoutError(f"{url} did not become healthy in time")


def first_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The first line of ``proc``'s stdout (a pipe), or what came of it within
    ``timeout`` seconds ("" if it exited first). Read byte by byte: nothing
    after the line is taken, so the rest stays for whoever reads it next."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    line = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as ready:
        ready.register(fd, selectors.EVENT_READ)
        while not line.endswith(b"\n") and ready.select(deadline - time.monotonic()):
            byte = os.read(fd, 1)
            if not byte:  # it exited
                break
            line += byte
    return line.decode(errors="replace").strip()


def process_tree() -> dict[int, list[int]]:
    """Every process's children, by parent pid (Linux /proc; empty elsewhere)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # it exited while we looked
                continue
            tree.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return tree


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc; empty elsewhere)."""
    return process_tree().get(pid, [])


def alive(pid: int) -> bool:
    """Process ``pid`` exists and is not a zombie (exited, not yet reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``PUSHUP_*`` setting (a node started
    from it reads only what the caller gives it), unbuffered, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PUSHUP_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env
