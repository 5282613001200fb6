"""Start N PushUp nodes plus HAProxy on loopback, with one command.

    python deploy/launch.py [--nodes 3] [--port 8000] [--haproxy-procs 1]
                            [--engine mesh|redis|redis://HOST:PORT]
                            [--web-backend 127.0.0.1:5000] [-- extra pushup flags]

``--engine redis`` starts a redis-server of its own (on a free loopback port,
no persistence) and puts every node on it; a ``redis://`` URL uses that Redis.
Prints the front URL and stops everything on Ctrl-C (or SIGTERM). The same
``LocalCluster`` class runs the cluster tests and benchmarks, so what the
tests prove is what ``make cluster`` starts.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from deploy.redis_server import RedisServer, free_port  # noqa: E402,F401  (run as a script too)

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "haproxy.cfg.template"
ERRORS = HERE / "errors"  # the JSON answers HAProxy gives itself (errorfile)


def haproxy_config(front_port: int, node_ports: Sequence[int], web_backend: str = "",
                   host: str = "127.0.0.1") -> str:
    """The HAProxy configuration for these nodes (see haproxy.cfg.template)."""
    servers = "\n".join(f"    server node{i + 1} {host}:{p} check"
                        for i, p in enumerate(node_ports))
    web = (f"backend web\n    server web1 {web_backend}\n" if web_backend else "")
    default = "web" if web_backend else "pushup"
    return TEMPLATE.read_text().format(front=f"{host}:{front_port}", servers=servers,
                                       web_backend=web, default_backend=default,
                                       errors=ERRORS)


def listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on (Linux /proc; empty elsewhere)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1]
                  for fd in os.listdir(f"/proc/{pid}/fd")
                  if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def get_json(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_healthy(url: str, deadline: float, proc: subprocess.Popen | None = None) -> None:
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            if get_json(url + "/health", timeout=1.0)[0] == 200:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not become healthy in time")


class LocalCluster:
    """N nodes peered with each other, behind one or more HAProxy processes."""

    def __init__(self, nodes: int = 3, front_port: int = 0, haproxy_procs: int = 1,
                 node_args: Sequence[str] = (), web_backend: str = "",
                 secret: str = "", workdir: str | None = None, haproxy: bool = True,
                 engine: str = "mesh") -> None:
        self.node_ports = [free_port() for _ in range(nodes)]
        self.front_port = front_port or free_port()
        self.haproxy_procs = haproxy_procs if haproxy else 0
        self.node_args = list(node_args)
        self.web_backend = web_backend
        self.secret = secret or secrets.token_urlsafe(16)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="pushup-cluster-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes: list[subprocess.Popen | None] = [None] * nodes
        self.haproxies: list[subprocess.Popen] = []
        self.engine = engine  # mesh, redis (a redis-server of our own) or a redis:// URL
        self.redis: RedisServer | None = None

    @property
    def front_url(self) -> str:
        return f"http://127.0.0.1:{self.front_port}"

    def node_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.node_ports[i]}"

    def node_argv(self, i: int) -> list[str]:
        argv = [sys.executable, "-m", "pushup", "serve", "--port", str(self.node_ports[i]),
                "--node-id", f"node{i + 1}",
                # "=": a generated secret may start with "-" (token_urlsafe)
                f"--cluster-secret={self.secret}"]
        if self.engine != "mesh":
            return [*argv, "--engine", self.engine_url, *self.node_args]
        for j in range(len(self.node_ports)):
            if j != i:
                argv += ["--peer", self.node_url(j)]
        return argv + self.node_args

    @property
    def engine_url(self) -> str:
        return self.redis.url if self.redis is not None else self.engine

    def start_node(self, i: int, timeout: float = 30.0) -> None:
        log = open(self.workdir / f"node{i + 1}.log", "ab")
        proc = subprocess.Popen(self.node_argv(i), stdout=subprocess.PIPE, stderr=log,
                                cwd=HERE.parent)
        self.nodes[i] = proc
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("listening on"):
            raise RuntimeError(f"node{i + 1} did not start; see {self.workdir}")
        wait_healthy(self.node_url(i), time.monotonic() + timeout, proc)

    def start(self, timeout: float = 30.0) -> LocalCluster:
        try:
            if self.engine == "redis":
                self.redis = RedisServer()
                self.redis.start()
            for i in range(len(self.nodes)):
                self.start_node(i, timeout)
            if self.haproxy_procs:
                cfg = self.workdir / "haproxy.cfg"
                cfg.write_text(haproxy_config(self.front_port, self.node_ports,
                                              self.web_backend))
                for k in range(self.haproxy_procs):
                    log = open(self.workdir / f"haproxy{k + 1}.log", "ab")
                    self.haproxies.append(subprocess.Popen(
                        ["haproxy", "-db", "-f", str(cfg)], stdout=log, stderr=log))
                wait_healthy(self.front_url, time.monotonic() + timeout, self.haproxies[0])
                self.wait_haproxies_listening(timeout)
                self.wait_backends_up(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_haproxies_listening(self, timeout: float = 30.0) -> None:
        """Until every HAProxy process holds a listening socket on the front port."""
        deadline = time.monotonic() + timeout
        while not all(self.front_port in listening_ports(p.pid) for p in self.haproxies):
            if time.monotonic() > deadline:
                raise TimeoutError("not every HAProxy process listens on the front port")
            time.sleep(0.05)

    def wait_backends_up(self, timeout: float = 30.0) -> None:
        """Until HAProxy's health checks see every running node (round-robin hits all)."""
        want = {f"node{i + 1}" for i, p in enumerate(self.nodes) if p is not None}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = set()
            for _ in range(len(want) * 3):
                try:
                    node_id = get_json(self.front_url + "/health", 1.0)[1].get("node_id", "")
                except (OSError, ValueError):
                    continue
                # a node of --workers answers as one of its workers: node1-0, node1-1...
                seen.add(node_id if node_id in want else node_id.rsplit("-", 1)[0])
            if want <= seen:
                return
            time.sleep(0.1)
        raise TimeoutError("HAProxy does not see every node")

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        proc = self.nodes[i]
        if proc is not None:
            proc.send_signal(sig)
            proc.wait(timeout=15)
            self.nodes[i] = None

    def stop(self) -> None:
        for proc in [*self.haproxies, *(p for p in self.nodes if p is not None)]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.haproxies, *(p for p in self.nodes if p is not None)]:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.haproxies.clear()
        self.nodes = [None] * len(self.nodes)
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--port", type=int, default=8000, help="HAProxy front port")
    parser.add_argument("--haproxy-procs", type=int, default=1,
                        help="HAProxy processes sharing the port (one holds ~10,000 "
                             "connections under a 20,000 open-files limit)")
    parser.add_argument("--web-backend", default="", help="HOST:PORT for non-PushUp paths")
    parser.add_argument("--engine", default="mesh",
                        help="mesh (peers), redis (a redis-server of our own) or a redis:// URL")
    parser.add_argument("extra", nargs="*", help="flags passed to every node (after --)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.nodes, args.port, args.haproxy_procs, args.extra,
                           args.web_backend, workdir=os.environ.get("PUSHUP_CLUSTER_DIR"),
                           engine=args.engine)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:  # a Ctrl-C while the cluster starts stops what started, with no traceback
        cluster.start()
        print(f"front: {cluster.front_url}")
        if cluster.engine != "mesh":
            print(f"engine: {cluster.engine_url}")
        for i in range(args.nodes):
            print(f"node{i + 1}: {cluster.node_url(i)}")
        print(f"logs: {cluster.workdir}   (Ctrl-C stops everything)", flush=True)
        while all(p is None or p.poll() is None for p in [*cluster.nodes, *cluster.haproxies]):
            time.sleep(0.5)
        print("a process exited; stopping the cluster", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
