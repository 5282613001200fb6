"""``--workers N``: N full nodes on one shared port, peered with each other.

The parent is a small supervisor with no reactor. It reserves the public
port, opens one private loopback listening socket per worker (handed to the
worker as a file descriptor, so there is no race for ports), and starts each
worker as ``pushup serve`` with its own node id and its siblings' private
addresses as peers; the secrets (cluster secret, publish token) go in the
worker's environment, never on its command line. Workers bind the public port with
SO_REUSEPORT, so the kernel spreads connections over them, each only once it has
caught up (a restarted one answers no client 503 meanwhile). The parent prints
the listening line once every worker has, forwards SIGTERM/SIGINT, restarts a
worker that dies, and exits 0 once all have drained. It also creates the
board where workers keep their figures, so a scrape of the shared port shows
the whole node (see :mod:`pushup.ops.fleet`).
"""

from __future__ import annotations

import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pushup.config import Config
from pushup.core.model import default_node_id
from pushup.ops.fleet import BOARD_ENV, create_board

FD_ENV = "PUSHUP_WORKER_PEER_FD"  # the inherited private socket of a worker
REUSE_ENV = "PUSHUP_WORKER_REUSE_PORT"
RESTART_DELAY = 1.0
# passed in the environment, never in argv
SECRETS = ("cluster_secret", "publish_token", "subscribe_secret")


def _private_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    s.setblocking(False)
    s.set_inheritable(True)
    return s


def _reserve_public(config: Config) -> tuple[socket.socket, int]:
    """Bind (not listen) the public port with SO_REUSEPORT, to learn and hold it."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((config.host, config.port))
    return s, s.getsockname()[1]


def _healthy(url: str, timeout: float = 30.0) -> bool:
    """Wait until a worker answers /health 200 (it may be catching up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return False


def worker_argv(config: Config, index: int, port: int, peers: Sequence[str]) -> list[str]:
    """The command line of worker ``index``: everything as flags, flags win.

    Never a secret: anyone can read a command line (``ps``); secrets go in
    the worker's environment (see :func:`worker_env`), which only its user can.
    """
    node_id = f"{config.node_id}-{index}"
    argv = [sys.executable, "-m", "pushup", "serve", "--workers", "1", "--port", str(port),
            "--node-id", node_id]
    skip = {"workers", "port", "node_id", "peer", *SECRETS}
    for name in Config.__dataclass_fields__:
        if name in skip:
            continue
        value = getattr(config, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                argv.append(flag)
        elif isinstance(value, tuple):  # a repeatable flag (--cors-origin)
            argv += [f"{flag}={item}" for item in value]
        elif value != "":
            argv.append(f"{flag}={value}")  # "=": a value may start with "-"
    for url in peers:
        argv += ["--peer", url]
    return argv


def worker_env(config: Config, environ: Mapping[str, str], **extra: str) -> dict[str, str]:
    """The environment of a worker: ours without PUSHUP_* (the configuration is
    resolved already), plus the secrets and ``extra``."""
    env = {k: v for k, v in environ.items() if not k.startswith("PUSHUP_")}
    for name in SECRETS:
        if getattr(config, name):
            env["PUSHUP_" + name.upper()] = getattr(config, name)
    env.update(extra)
    return env


class Supervisor:
    """The parent of ``--workers N``: reserves the ports, runs and restarts workers.

    Built before any worker exists: it holds the public port (so a second
    supervisor fails at once) and one private socket per worker. ``run``
    starts every worker, returns 1 if one does not print its listening line
    or become healthy, else prints the node's own line and blocks until every
    worker has exited after ``stop`` (SIGTERM/SIGINT), restarting any worker
    that dies meanwhile; then it returns 0. ``stop`` may be called any number
    of times, from a signal handler too. It runs no reactor.
    """

    def __init__(self, config: Config) -> None:
        if not config.cluster_secret:
            config = replace(config, cluster_secret=secrets.token_urlsafe(24))
        self.public, self.port = _reserve_public(config)
        if not config.node_id:  # stable across restarts, as a single node's (README)
            config = replace(config, node_id=default_node_id(
                socket.gethostname(), config.port, secrets.token_hex(3)))
        self.config = config
        self.sockets = [_private_socket() for _ in range(config.workers)]
        self.urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in self.sockets]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * config.workers
        self.board = create_board(config.workers)  # the workers' figures (pushup.ops.fleet)
        self.stopping = False

    def spawn(self, i: int) -> subprocess.Popen[bytes]:
        # Workers on Redis share its log; on the mesh they are each other's peers.
        peers = [u for j, u in enumerate(self.urls) if j != i and self.config.engine == "mesh"]
        fd = self.sockets[i].fileno()
        board = f"{self.board}:{i}:{len(self.procs)}"
        env = worker_env(self.config, os.environ,
                         **{FD_ENV: str(fd), REUSE_ENV: "1", BOARD_ENV: board})
        proc = subprocess.Popen(worker_argv(self.config, i, self.port, peers),
                                stdout=subprocess.PIPE, env=env, pass_fds=(fd, self.board))
        self.procs[i] = proc
        return proc

    def run(self) -> int:
        selector = selectors.DefaultSelector()
        for i in range(len(self.procs)):
            started = self.spawn(i)
            assert started.stdout is not None
            line = started.stdout.readline().decode().strip()
            if not line.startswith("listening on"):
                print(f"pushup: error: worker {i} did not start", file=sys.stderr)
                self.stop()
                return 1
            selector.register(started.stdout, selectors.EVENT_READ, i)
        if not all(_healthy(url) for url in self.urls):
            print("pushup: error: a worker did not become healthy", file=sys.stderr)
            self.stop()
            return 1
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        print(f"listening on http://{host}:{self.port}", flush=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        while any(p is not None for p in self.procs):
            for key, _ in selector.select(timeout=0.5):
                if not os.read(key.fileobj.fileno(), 4096):  # type: ignore[union-attr]
                    selector.unregister(key.fileobj)
            for i, proc in enumerate(self.procs):
                if proc is None or proc.poll() is None:
                    continue
                self.procs[i] = None
                if not self.stopping:
                    print(f"pushup: worker {i} exited with {proc.returncode}; restarting",
                          file=sys.stderr, flush=True)
                    time.sleep(RESTART_DELAY)
                    new = self.spawn(i)
                    assert new.stdout is not None
                    selector.register(new.stdout, selectors.EVENT_READ, i)
        return 0

    def stop(self) -> None:
        self.stopping = True
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)


def supervise(config: Config) -> int:
    return Supervisor(config).run()
