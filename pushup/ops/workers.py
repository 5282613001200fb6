"""``--workers N``: N full nodes on one shared port, peered with each other.

The parent is a small supervisor with no reactor. It reserves the public
port, opens one private listening Unix socket per worker (in Linux's abstract
namespace: no file to leave behind; handed to the worker as a file
descriptor, so there is no race for names), and starts each worker as
``pushup serve`` with its own node id and its siblings' private addresses
(``PUSHUP_WORKER_SIBLINGS``); the secrets (cluster secret, publish token) go
in the worker's environment, never on its command line. On the mesh the
siblings are each other's peers over those sockets; a worker also links to
every ``--peer`` itself, and hands its siblings what another node sends it
(:mod:`pushup.backplane.mesh.mesh`). On Redis each worker is a client of the
shared log. Workers bind the public port with
SO_REUSEPORT, so the kernel spreads connections over them, each only once it has
caught up (a restarted one answers no client 503 meanwhile). The parent prints
the listening line once every worker has, forwards SIGTERM/SIGINT, restarts a
worker that dies, and exits 0 once all have drained. It also creates the
board where workers keep their figures, so a scrape of the shared port shows
the whole node (see :mod:`pushup.ops.fleet`).
"""

from __future__ import annotations

import http.client
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from urllib.parse import urlsplit

from pushup._build import PURE_ENV
from pushup.backplane.mesh.dial import unix_address, unix_url
from pushup.config import Config
from pushup.core.model import default_node_id
from pushup.ops.fleet import BOARD_ENV, create_board

FD_ENV = "PUSHUP_WORKER_PEER_FD"  # the inherited private socket of a worker
REUSE_ENV = "PUSHUP_WORKER_REUSE_PORT"
SIBLINGS_ENV = "PUSHUP_WORKER_SIBLINGS"  # its siblings' private URLs, comma-separated
RESTART_DELAY = 1.0
# passed in the environment, never in argv
SECRETS = ("cluster_secret", "publish_token", "subscribe_secret", "subscribe_secret_previous",
           "webhook_secret")


def _private_socket(name: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(unix_address(name))
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


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to a worker's private socket, by its URL
    (``http+unix://NAME``, an abstract Unix socket)."""

    def __init__(self, url: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.name = urlsplit(url).netloc

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(unix_address(self.name))


def _healthy(url: str, timeout: float = 30.0) -> bool:
    """Wait until a worker answers /health 200 (it may be catching up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = UnixHTTPConnection(url, timeout=2)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return True
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.05)
    return False


def worker_argv(config: Config, index: int, port: int) -> list[str]:
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
    for url in config.peer:  # other nodes: every worker links to each
        argv += ["--peer", url]
    return argv


def worker_env(config: Config, environ: Mapping[str, str], **extra: str) -> dict[str, str]:
    """The environment of a worker: ours without PUSHUP_* settings (the
    configuration is resolved already; ``PUSHUP_PURE``, which is not one,
    stays), plus the secrets and ``extra``."""
    env = {k: v for k, v in environ.items() if not k.startswith("PUSHUP_") or k == PURE_ENV}
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
        names = [f"pushup-{self.port}-{secrets.token_hex(4)}-{i}" for i in range(config.workers)]
        self.sockets = [_private_socket(name) for name in names]
        self.urls = [unix_url(name) for name in names]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * config.workers
        self.board = create_board(config.workers)  # the workers' figures (pushup.ops.fleet)
        self.stopping = False

    def spawn(self, i: int) -> subprocess.Popen[bytes]:
        # Workers on Redis share its log; on the mesh they are each other's peers.
        siblings = [u for j, u in enumerate(self.urls) if j != i and self.config.engine == "mesh"]
        fd = self.sockets[i].fileno()
        board = f"{self.board}:{i}:{len(self.procs)}"
        env = worker_env(self.config, os.environ, **{
            FD_ENV: str(fd), REUSE_ENV: "1", BOARD_ENV: board, SIBLINGS_ENV: ",".join(siblings)})
        # SIGINT ignored: a Ctrl-C reaches the whole process group, and we stop
        # the workers ourselves (SIGTERM), also while one is still importing.
        proc = subprocess.Popen(worker_argv(self.config, i, self.port),
                                stdout=subprocess.PIPE, env=env, pass_fds=(fd, self.board),
                                preexec_fn=_ignore_sigint)
        self.procs[i] = proc
        if self.stopping:  # a signal came while it was being started: stop() missed it
            proc.send_signal(signal.SIGTERM)
        return proc

    def run(self) -> int:
        selector = selectors.DefaultSelector()
        # From the start: a Ctrl-C while workers start stops them, with no traceback.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        for i in range(len(self.procs)):
            if self.stopping:
                break
            started = self.spawn(i)
            assert started.stdout is not None
            line = started.stdout.readline().decode().strip()
            if self.stopping:
                selector.register(started.stdout, selectors.EVENT_READ, i)
                break
            if not line.startswith("listening on"):
                print(f"pushup: error: worker {i} did not start", file=sys.stderr)
                self.stop()
                return 1
            selector.register(started.stdout, selectors.EVENT_READ, i)
        if not self.stopping and not all(_healthy(url) for url in self.urls):
            print("pushup: error: a worker did not become healthy", file=sys.stderr)
            self.stop()
            return 1
        if not self.stopping:
            host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
            print(f"listening on http://{host}:{self.port}", flush=True)
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


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def supervise(config: Config) -> int:
    return Supervisor(config).run()
