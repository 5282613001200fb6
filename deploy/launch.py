"""Start N PushUp nodes plus HAProxy on loopback, with one command.

    python deploy/launch.py [--nodes 3] [--port 8000] [--haproxy-procs 1]
                            [--engine mesh|redis|redis-cluster|redis://HOST:PORT]
                            [--logs DIR]
                            [--balance roundrobin|channel|sticky]
                            [--leave-dead] [--web-backend 127.0.0.1:5000]
                            [--tls [CERT_AND_KEY.pem]]
                            [-- extra pushup flags]

``--engine redis`` starts a redis-server of its own (on a free loopback port,
no persistence) and puts every node on it; ``--engine redis-cluster`` starts a
Redis Cluster of its own (3 primaries with a replica each, deploy/redis_cluster.py)
and gives every node all of its addresses as seeds; a ``redis://`` URL uses that
Redis. A process that dies is reported and restarted (``--leave-dead``: a node is
left dead, and the others serve its clients; a Redis Cluster node that dies is
restarted all the same, and rejoins, as a replica if its replica took over
meanwhile); the cluster keeps serving.
Logs go to ``--logs`` (default ``.cluster/`` in the repository, replaced by
each run); nothing is left in the temporary directory. Secrets reach the
nodes in their environment, never on a command line (``ps`` shows those).
``--tls``: HAProxy terminates TLS and offers HTTP/2 (``alpn h2,http/1.1``),
with the PEM given (certificate then key) or, without one, a self-signed
certificate for 127.0.0.1 and localhost made by ``openssl`` in the logs
directory. Ctrl-C (or SIGTERM) stops everything. The same ``LocalCluster`` class runs
the cluster tests and benchmarks, so what the tests prove is what ``make
cluster`` starts.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import hiredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from deploy.processes import free_port, wait_healthy  # run as a script too
from deploy.redis_cluster import FAILOVER_TIMEOUT, RedisCluster
from deploy.redis_server import RedisServer, RedisServerError

HERE = Path(__file__).resolve().parent
LOGS = HERE.parent / ".cluster"  # `make cluster`'s logs (git-ignored), replaced by each run
TEMPLATE = HERE / "haproxy.cfg.template"
ERRORS = HERE / "errors"  # the JSON answers HAProxy gives itself (errorfile)


BALANCES = ("roundrobin", "channel", "sticky")
# HAProxy puts a server 16 x its weight times on a consistent hash's ring
# (lb_chash.c); 256 is the most it takes.
CHANNEL_RING_WEIGHT = 256


def haproxy_config(front_port: int, node_ports: Sequence[int], web_backend: str = "",
                   host: str = "127.0.0.1", balance: str = "roundrobin",
                   tls_pem: str = "", longest_poll_s: float = 0) -> str:
    """The HAProxy configuration for these nodes (see haproxy.cfg.template).

    ``longest_poll_s``: HAProxy carries a held poll this long (its client and
    server timeouts 30 s past it; 0: the template's 150 s, past the node's
    default --max-timeout of 120 s).

    ``tls_pem``: the front terminates TLS with this certificate and key (one
    PEM file) and offers HTTP/2 first (ALPN ``h2,http/1.1``).

    ``balance="channel"``: a subscribe goes to a node chosen by a consistent
    hash of its ``channels`` parameter (so a channel's pollers share a node,
    and with the Redis engine a node holds fewer channels' work), everything
    else round robin. Any node still answers any request: affinity only
    saves work, and a node that is down sends its channels elsewhere.

    ``balance="sticky"``: every request to the node with the fewest
    connections, and a keep-alive client's next requests to the node that
    answered its last one (``balance leastconn``, ``option
    prefer-last-server``, ``http-reuse never``): a client's re-polls stay on
    one node, without affinity by channel. ``roundrobin`` moves every request."""
    if balance not in BALANCES:
        raise ValueError(f"balance is one of {', '.join(BALANCES)}")
    servers = "\n".join(f"    server node{i + 1} {host}:{p} check"
                        for i, p in enumerate(node_ports))
    web = (f"backend web\n    server web1 {web_backend}\n" if web_backend else "")
    default = "web" if web_backend else "pushup"
    bind_tls = f" ssl crt {tls_pem} alpn h2,http/1.1" if tls_pem else ""
    text = TEMPLATE.read_text().format(front=f"{host}:{front_port}", servers=servers,
                                       web_backend=web, default_backend=default,
                                       errors=ERRORS, bind_tls=bind_tls)
    if longest_poll_s:
        carried = f"{longest_poll_s + 30:.0f}s"
        text = (text.replace("timeout client 150s", f"timeout client {carried}")
                .replace("timeout server 150s", f"timeout server {carried}"))
    if balance == "channel":
        head, backend = text.split("\nbackend pushup\n", 1)
        backend, _, rest = backend.partition("\n\n")
        # (each server 256 points on the hash ring, not weight 1's 16: with 16
        # the busiest of 2 or 4 nodes held 12-19 % over its share of channels,
        # with 256 2-4 %; equal weights, so the shares stay equal)
        by_channel = backend.replace("    balance roundrobin\n",
                                     "    balance url_param channels\n    hash-type consistent\n")
        by_channel = by_channel.replace(servers, "\n".join(
            f"{line} weight {CHANNEL_RING_WEIGHT}" for line in servers.split("\n")))
        head = head.replace("    use_backend pushup if pushup\n",
                            "    use_backend pushup_by_channel if { path /subscribe }\n"
                            "    use_backend pushup if pushup\n")
        text = (f"{head}\nbackend pushup\n{backend}\n\n"
                f"# Subscribes by channel (deploy/launch.py --balance channel)\n"
                f"backend pushup_by_channel\n{by_channel}\n\n{rest}")
    if balance == "sticky":
        text = text.replace("\nbackend pushup\n    balance roundrobin\n",
                            "\nbackend pushup\n    # keep-alive stickiness (deploy/launch.py "
                            "--balance sticky)\n    balance leastconn\n"
                            "    option prefer-last-server\n"
                            # a shared idle pool hands a client's next request to
                            # any server connection: prefer-last-server needs its own
                            "    http-reuse never\n", 1)
    return text


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


def self_signed_pem(directory: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key, in one
    PEM file in ``directory`` (as HAProxy's ``crt`` reads it), made by openssl."""
    cert, key, pem = (directory / n for n in ("front-cert.pem", "front-key.pem", "front.pem"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "30",
                    "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    key.unlink()
    pem.chmod(0o600)
    return pem


def get_json(url: str, timeout: float = 5.0,
             context: ssl.SSLContext | None = None) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class LocalCluster:
    """N nodes peered with each other, behind one or more HAProxy processes."""

    def __init__(self, nodes: int = 3, front_port: int = 0, haproxy_procs: int = 1,
                 node_args: Sequence[str] = (), web_backend: str = "",
                 secret: str = "", workdir: str | None = None, haproxy: bool = True,
                 engine: str = "mesh", node_env: dict[str, str] | None = None,
                 balance: str = "roundrobin", data_dirs: bool = False,
                 tls: bool | str = False, longest_poll_s: float = 0) -> None:
        """``tls``: HAProxy's front terminates TLS and offers h2 (``True``: with a
        self-signed certificate made in ``workdir``, see ``certificate``; a
        path: that PEM of certificate and key). ``longest_poll_s``: see
        ``haproxy_config``."""
        self.longest_poll_s = longest_poll_s
        self.node_ports = [free_port() for _ in range(nodes)]
        self.balance = balance  # HAProxy's: roundrobin, channel or sticky (haproxy_config)
        self.data_dirs = data_dirs  # each mesh node a --data-dir of its own, in workdir
        self.front_port = front_port or free_port()
        self.haproxy_procs = haproxy_procs if haproxy else 0
        self.node_args = list(node_args)
        self.web_backend = web_backend
        self.secret = secret or secrets.token_urlsafe(16)
        # secrets and other settings the nodes get in their environment (not argv)
        self.node_env = {"PUSHUP_CLUSTER_SECRET": self.secret, **(node_env or {})}
        self.own_workdir = workdir is None  # a temporary one, removed by stop()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="pushup-cluster-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes: list[subprocess.Popen | None] = [None] * nodes
        self.haproxies: list[subprocess.Popen] = []
        # mesh, redis (a redis-server of our own), redis-cluster (a Redis Cluster of our
        # own) or a redis:// URL
        self.engine = engine
        self.redis: RedisServer | None = None
        self.redis_cluster: RedisCluster | None = None
        self.tls = tls
        self.tls_pem = tls if isinstance(tls, str) else ""  # made at start when tls is True

    @property
    def front_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.front_port}"

    @property
    def certificate(self) -> str:
        """The front's PEM (certificate and key): a client trusts it to reach the
        TLS front."""
        return self.tls_pem

    @property
    def client_certificate(self) -> str:
        """The front's certificate alone, without its key (what to hand clients,
        e.g. ``curl --cacert``): the one made at start, else the PEM given."""
        made = Path(self.tls_pem).with_name("front-cert.pem")
        return str(made) if self.tls is True and made.exists() else self.tls_pem

    def front_context(self) -> ssl.SSLContext | None:
        """TLS that trusts the front's certificate (None: the front is plain HTTP)."""
        return ssl.create_default_context(cafile=self.tls_pem) if self.tls else None

    def node_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.node_ports[i]}"

    def node_argv(self, i: int) -> list[str]:
        # the secret is in the environment (node_env): anyone can read a command line
        argv = [sys.executable, "-m", "pushup", "serve", "--port", str(self.node_ports[i]),
                "--node-id", f"node{i + 1}"]
        if self.engine != "mesh":
            return [*argv, "--engine", self.engine_url, *self.node_args]
        for j in range(len(self.node_ports)):
            if j != i:
                argv += ["--peer", self.node_url(j)]
        if self.data_dirs:
            argv += ["--data-dir", str(self.workdir / f"node{i + 1}-data")]
        return argv + self.node_args

    @property
    def engine_url(self) -> str:
        if self.redis is not None:
            return self.redis.url
        if self.redis_cluster is not None:
            return self.redis_cluster.seeds
        return self.engine

    def start_node(self, i: int, timeout: float = 30.0) -> None:
        path = self.workdir / f"node{i + 1}.log"
        with open(path, "ab") as log:
            # its own session: a Ctrl-C in the terminal reaches the launcher only,
            # which stops the nodes by PID
            proc = subprocess.Popen(self.node_argv(i), stdout=subprocess.PIPE, stderr=log,
                                    stdin=subprocess.DEVNULL, cwd=HERE.parent,
                                    env={**os.environ, **self.node_env},
                                    start_new_session=True)
        self.nodes[i] = proc
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("listening on"):
            proc.kill()  # (gone already, as a rule: it says why in its log)
            proc.wait()
            why = last_line(path)
            if "Address already in use" in why:
                raise PortTaken(f"node{i + 1} did not start: {why}")
            raise RuntimeError(f"node{i + 1} did not start: {why}")
        wait_healthy(self.node_url(i), time.monotonic() + timeout, proc)

    def start_nodes(self, timeout: float, taken: set[int]) -> None:
        """Start every node. A node's port was only picked, not held, so another
        process may take it first (a connection's own port, on a busy machine):
        then every node is stopped and started again on new ports (the mesh's
        nodes name each other's), three times at most."""
        for attempt in range(3):
            try:
                for i in range(len(self.nodes)):
                    self.start_node(i, timeout)
                return
            except PortTaken:
                if attempt == 2:
                    raise
                self.stop_nodes()
                taken |= set(self.node_ports)
                self.node_ports = [port_not_in(taken) for _ in self.node_ports]

    def stop_nodes(self) -> None:
        """SIGTERM each node started, and wait for it (SIGKILL after 10 s)."""
        started = [p for p in self.nodes if p is not None]
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.nodes = [None] * len(self.nodes)

    def start(self, timeout: float = 30.0) -> LocalCluster:
        taken: set[int] = set()  # ports the nodes must not be given
        try:
            if self.engine == "redis":
                self.redis = RedisServer()
                self.redis.start()
            elif self.engine == "redis-cluster":
                self.redis_cluster = RedisCluster(primaries=3, replicas=1)
                self.redis_cluster.start()
                # the nodes' ports were only picked, not held: one the cluster took
                # since (a node's port, or its bus port: port + 10000) is picked again
                taken = {q for p in self.redis_cluster.ports for q in (p, p + 10000)}
                self.node_ports = [port_not_in(taken) if p in taken else p
                                   for p in self.node_ports]
            self.start_nodes(timeout, taken)
            if self.haproxy_procs:
                if self.tls is True and not self.tls_pem:
                    self.tls_pem = str(self_signed_pem(self.workdir))
                cfg = self.workdir / "haproxy.cfg"
                cfg.write_text(haproxy_config(self.front_port, self.node_ports,
                                              self.web_backend, balance=self.balance,
                                              tls_pem=self.tls_pem,
                                              longest_poll_s=self.longest_poll_s))
                for k in range(self.haproxy_procs):
                    self.haproxies.append(self.spawn_haproxy(k))
                try:
                    wait_healthy(self.front_url, time.monotonic() + timeout,
                                 self.haproxies[0], self.front_context())
                except RuntimeError:
                    raise RuntimeError("haproxy did not start: " + last_line(
                        self.workdir / "haproxy1.log")) from None
                self.wait_haproxies_listening(timeout)
                self.wait_backends_up(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def spawn_haproxy(self, k: int) -> subprocess.Popen:
        with open(self.workdir / f"haproxy{k + 1}.log", "ab") as log:
            return subprocess.Popen(["haproxy", "-db", "-f", str(self.workdir / "haproxy.cfg")],
                                    stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

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
        context = self.front_context()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = set()
            for _ in range(len(want) * 3):
                try:
                    node_id = get_json(self.front_url + "/health", 1.0,
                                       context)[1].get("node_id", "")
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
        for proc in self.haproxies:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        self.stop_nodes()
        for proc in self.haproxies:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.haproxies.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        if self.redis_cluster is not None:
            self.redis_cluster.stop()
            self.redis_cluster = None
        if self.own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PortTaken(RuntimeError):
    """A node could not listen: another process took its port first."""


def port_not_in(taken: set[int]) -> int:
    """A free port, none of ``taken``."""
    while (port := free_port()) in taken:
        pass
    return port


def last_line(path: Path) -> str:
    """A log's last non-empty line: what a process said before it gave up."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1].strip()[:300] if lines else f"nothing in {path}"


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Something listens on ``port`` (a bind as HAProxy does it, SO_REUSEADDR, fails)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def ended(code: int) -> str:
    """How a process ended, from its exit status."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


class Watch:
    """Reports each process of the cluster that dies, and restarts it (a node is
    left dead with ``restart`` off; a node that dies three times in a minute is
    left dead too: it would only die again)."""

    def __init__(self, cluster: LocalCluster, restart: bool = True) -> None:
        self.cluster = cluster
        self.restart = restart
        self.deaths: dict[int, list[float]] = {}
        self.dead: set[int] = set()  # nodes left dead
        self.redis_dead: dict[int, float] = {}  # Redis Cluster node's port -> when it died

    def policy(self) -> str:
        return ("a node that dies is reported and restarted; the others serve meanwhile"
                if self.restart else
                "a node that dies is reported and left dead; the others serve its clients")

    def check(self) -> None:
        """One look at every process (call it a few times a second)."""
        c = self.cluster
        for i, proc in enumerate(c.nodes):
            if proc is None or proc.poll() is None:
                continue
            c.nodes[i] = None
            now = time.monotonic()
            recent = [t for t in self.deaths.get(i, []) if now - t < 60] + [now]
            self.deaths[i] = recent
            again = self.restart and len(recent) < 3
            alive = sum(p is not None for p in c.nodes)
            say(f"node{i + 1} (pid {proc.pid}, {c.node_url(i)}) {ended(proc.returncode)}; "
                + (f"restarting it; {alive} of {len(c.nodes)} nodes serve meanwhile" if again
                   else f"left dead ({'it died 3 times in a minute; ' if self.restart else ''}"
                        f"see {c.workdir / f'node{i + 1}.log'}); {alive} of "
                        f"{len(c.nodes)} nodes serve"))
            if not again:
                self.dead.add(i)
                continue
            try:
                c.start_node(i)
            except (RuntimeError, TimeoutError, OSError) as e:
                say(f"node{i + 1} did not restart ({e}); left dead")
                self.dead.add(i)
                self.kill_quietly(i)
                continue
            say(f"node{i + 1} is back (pid {c.nodes[i].pid})")  # type: ignore[union-attr]
        for k, proc in enumerate(c.haproxies):
            if proc.poll() is not None:
                say(f"haproxy (pid {proc.pid}) {ended(proc.returncode)}; restarting it "
                    "(the front is down until it is back)")
                c.haproxies[k] = c.spawn_haproxy(k)
                say(f"haproxy is back (pid {c.haproxies[k].pid})")
        if c.redis is not None and c.redis.exited():
            say("redis-server died; restarting it, empty (nodes answer 503 "
                "engine_unavailable until it is back)")
            try:
                c.redis.restart()
                say(f"redis-server is back (pid {c.redis.pid})")
            except RedisServerError as e:
                say(f"redis-server did not restart: {str(e).splitlines()[0]}")
        if c.redis_cluster is not None:
            self.check_redis_cluster(c.redis_cluster)

    def check_redis_cluster(self, cluster: RedisCluster) -> None:
        """A Redis Cluster node that died is restarted on its port with its nodes.conf,
        once no slot is its own any more: a primary only after its replica took its
        slots over. Restarted sooner, it would come back empty still owning them, its
        replica would sync that emptiness, and every message it held would be lost
        (a gap). It rejoins as a replica and syncs from its primary; a primary whose
        slots nobody took over (no replica) is restarted after FAILOVER_TIMEOUT."""
        now = time.monotonic()
        for port, node in cluster.nodes.items():
            if port not in self.redis_dead and node.exited():
                process = node._process  # (exited: it was started, and has ended)
                assert process is not None
                self.redis_dead[port] = now
                say(f"redis 127.0.0.1:{port} (pid {process.pid}) {ended(process.returncode)}; "
                    "restarting it once its slots are served by another node (its replica, "
                    "if it has one, takes them over); it rejoins the Redis Cluster")
        for port, since in list(self.redis_dead.items()):
            try:
                owns = port in cluster.slot_owners().values()
            except (OSError, RedisServerError, hiredis.ReplyError):
                owns = True  # no node answers: wait for the timeout
            if owns and now - since < FAILOVER_TIMEOUT:
                continue
            del self.redis_dead[port]
            try:
                cluster.restart(port)
                say(f"redis 127.0.0.1:{port} is back (pid {cluster.nodes[port].pid})")
            except RedisServerError as e:
                say(f"redis 127.0.0.1:{port} did not restart: {str(e).splitlines()[0]}")

    def kill_quietly(self, i: int) -> None:
        proc = self.cluster.nodes[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.cluster.nodes[i] = None


def run(cluster: LocalCluster, restart: bool, banner: Callable[[], list[str]],
        stop: Callable[[], None] = lambda: None) -> int:
    """Start ``cluster``, print ``banner()``, watch it until Ctrl-C or SIGTERM, stop.

    Every failure to start is one line (exit 1), never a traceback; ``stop``
    is called after the cluster is stopped (``make demo``: its web server).
    """
    watch = Watch(cluster, restart)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    # both, explicitly: a launcher started in the background inherits SIGINT ignored
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    code = 0
    try:
        say(watch.policy())
        say(f"logs: {cluster.workdir}/ (node*.log, haproxy*.log)")
        cluster.start()
        for line in banner():
            print(line, flush=True)
        while True:
            watch.check()
            time.sleep(0.2)
    except KeyboardInterrupt:
        say("stopping the cluster")
    except (RuntimeError, TimeoutError, OSError, RedisServerError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"launch: the cluster did not start: {first} (logs in {cluster.workdir}/)",
              file=sys.stderr, flush=True)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cluster.stop()
        stop()
    return code


def node_lines(cluster: LocalCluster) -> list[str]:
    """One line per running node, its URL and PID (what to kill to see a
    failover): the banner of `make cluster` and `make demo`."""
    return [f"node{i + 1}: {cluster.node_url(i)} (pid {p.pid})"
            for i, p in enumerate(cluster.nodes) if p is not None]


def redis_lines(cluster: LocalCluster) -> list[str]:
    """One line per Redis Cluster node of ``--engine redis-cluster``: its address, PID
    and role (what to kill to see a failover)."""
    rc = cluster.redis_cluster
    if rc is None:
        return []
    primaries = set(rc.primaries())
    return [f"redis 127.0.0.1:{port}: {'primary' if port in primaries else 'replica'} "
            f"(pid {node.pid})" for port, node in rc.nodes.items()]


def refuse(port: int, what: str) -> str | None:
    """One line saying why the cluster cannot start, or None: the front's port is
    taken, or HAProxy (or redis-server, for ``ENGINE=redis``) is missing."""
    if port_taken(port):
        return (f"launch: port {port} is already in use on 127.0.0.1 (another process "
                f"listens there): stop it, or choose another port: {what}")
    if shutil.which("haproxy") is None:
        return ("launch: haproxy is not installed (`make cluster` installs it: "
                "apt-get install haproxy)")
    return None


def prepare_logs(path: Path) -> Path:
    """The logs directory, without the last run's files (only those: it may be
    a directory of other things too)."""
    path.mkdir(parents=True, exist_ok=True)
    for old in [*path.glob("node[0-9]*.log"), *path.glob("haproxy[0-9]*.log"),
                path / "haproxy.cfg", *path.glob("front*.pem")]:
        old.unlink(missing_ok=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--port", type=int, default=8000, help="HAProxy front port")
    parser.add_argument("--haproxy-procs", type=int, default=1,
                        help="HAProxy processes sharing the port (one holds ~10,000 "
                             "connections under a 20,000 open-files limit)")
    parser.add_argument("--web-backend", default="", help="HOST:PORT for non-PushUp paths")
    parser.add_argument("--engine", default="mesh",
                        help="mesh (peers), redis (a redis-server of our own), redis-cluster "
                             "(a Redis Cluster of our own: 3 primaries, a replica each) "
                             "or a redis:// URL")
    parser.add_argument("--balance", default="roundrobin", choices=BALANCES,
                        help="how HAProxy spreads subscribes: roundrobin, channel (a "
                             "consistent hash of the channels parameter; publishes stay "
                             "round robin), or sticky (leastconn, a keep-alive client "
                             "kept on its last node)")
    parser.add_argument("--logs", default=os.environ.get("PUSHUP_CLUSTER_DIR", str(LOGS)),
                        help="directory of the logs, the last run's removed at start "
                             "(default .cluster/ in the repository)")
    parser.add_argument("--leave-dead", action="store_true",
                        help="leave a node that dies dead (default: restart it)")
    parser.add_argument("--tls", nargs="?", const=True, default=False, metavar="PEM",
                        help="HAProxy terminates TLS and offers HTTP/2 (ALPN h2,http/1.1), "
                             "with this PEM of certificate and key, or without one a "
                             "self-signed certificate made in the logs directory")
    parser.add_argument("extra", nargs="*", help="flags passed to every node (after --)")
    args = parser.parse_args(argv)
    why = refuse(args.port, f"make cluster PORT={args.port + 1}")
    if (why is None and args.engine in ("redis", "redis-cluster")
            and (shutil.which("redis-server") is None or shutil.which("redis-cli") is None)):
        why = (f"launch: redis-server is not installed (`make cluster ENGINE={args.engine}` "
               "installs it)")
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    cluster = LocalCluster(args.nodes, args.port, args.haproxy_procs, args.extra,
                           args.web_backend, workdir=str(prepare_logs(Path(args.logs))),
                           engine=args.engine, balance=args.balance, tls=args.tls)

    def banner() -> list[str]:
        lines = [f"front: {cluster.front_url}"]
        if cluster.tls:
            lines.append(f"front: HTTP/2 and HTTP/1.1 over TLS; its certificate for "
                         f"clients: {cluster.client_certificate}")
        if cluster.engine != "mesh":
            lines.append(f"engine: {cluster.engine_url}")
        return [*lines, *node_lines(cluster), *redis_lines(cluster), "Ctrl-C stops everything"]

    return run(cluster, not args.leave_dead, banner)


if __name__ == "__main__":
    sys.exit(main())
