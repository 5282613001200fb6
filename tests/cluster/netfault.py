"""Network faults for real nodes: every node in a network namespace of its own,
cut and healed with nftables, slowed with ``tc tbf``; whatever is made here is
removed here, even when the test fails.

The topology (``Lab``): a hub namespace holding a bridge; each node's namespace
has ``eth0`` on that bridge (a veth pair), and the root namespace joins it
through one more veth, so the test process (and a redis-server it runs) reach
every node at its own address of a private /24 nobody else routes. Traffic
only ever goes to loopback or to these namespaces.

Faults are context managers acting inside one node's namespace, so a fault
never touches the machine's own firewall or qdiscs:

  ``cut(host, peers)``          drop every packet between ``host`` and ``peers``
  ``cut(host, peers, "out")``   drop only what ``host`` sends to them (one way)
  ``cut_port(host, addr, port)`` drop ``host``'s traffic with one service (Redis)
  ``slow(host, rate)``          a token bucket of ``rate`` on both ends of its link

``skip_reason()`` says why this machine cannot run them (not root, a tool
missing, namespaces refused), or None. ``NetCluster`` is ``LocalCluster``
with each node started by ``ip netns exec`` in its namespace, listening on its
address; it stops them by PID like ``LocalCluster`` does. ``mesh(n)`` and
``on_redis(n)`` make the lab and such a cluster in one ``with``.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from deploy.launch import LocalCluster, get_json
from deploy.redis_server import RedisServer

TOOLS = ("ip", "nft", "tc")
TABLE = "pushup_fault"  # the nft table a fault makes in a node's namespace


def run(*argv: str, stdin: str | None = None) -> str:
    """One command's output; its stderr is the error when it fails."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def in_ns(ns: str, *argv: str, stdin: str | None = None) -> str:
    return run("ip", "netns", "exec", ns, *argv, stdin=stdin)


def skip_reason() -> str | None:
    """Why network faults cannot run here, or None."""
    if os.geteuid() != 0:
        return "network faults need root (namespaces, nftables, tc)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"network faults need {', '.join(missing)} (make system-packages)"
    probe = f"pushup-probe-{secrets.token_hex(3)}"
    try:
        run("ip", "netns", "add", probe)
    except RuntimeError as e:
        return f"network namespaces are refused here: {e}"
    run("ip", "netns", "del", probe)
    return None


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.200.0.0/13 that no route of the root namespace overlaps."""
    routes = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"],
                            capture_output=True, text=True, check=True).stdout
    taken = []
    for line in routes.splitlines():
        dest = line.split()[0] if line.split()[0] not in ("local", "broadcast") \
            else line.split()[1]
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.ip_network(dest, strict=False))
    rng = random.Random()
    for _ in range(100):
        net = ipaddress.IPv4Network(f"10.{rng.randrange(200, 208)}.{rng.randrange(256)}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    raise RuntimeError("no free /24 in 10.200.0.0/13")


@dataclass(frozen=True)
class Host:
    """A namespace on the lab's bridge: its name, its address, its interface."""
    ns: str
    addr: str
    hub_end: str  # its veth's other end, on the bridge in the hub namespace


class Lab:
    """The hub, the root namespace's way in, and every host added; ``close``
    deletes the namespaces (their veths go with them) and the root veth."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(2)  # interface names: at most 15 characters
        self.net = free_subnet()
        self.hub = f"pushup-{self.tag}-hub"
        self.root_if = f"pf{self.tag}r"
        self.root_addr = str(self.net[1])
        self.hosts: list[Host] = []
        self.namespaces: list[str] = []

    def __enter__(self) -> Lab:
        try:
            self._add_ns(self.hub)
            in_ns(self.hub, "ip", "link", "add", "br0", "type", "bridge")
            in_ns(self.hub, "ip", "link", "set", "br0", "up")
            self._veth(self.root_if, f"pf{self.tag}R")
            run("ip", "addr", "add", f"{self.root_addr}/24", "dev", self.root_if)
            run("ip", "link", "set", self.root_if, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_ns(self, ns: str) -> None:
        run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        in_ns(ns, "ip", "link", "set", "lo", "up")

    def _veth(self, near: str, hub_end: str) -> None:
        """A veth pair: ``near`` stays where it is made, ``hub_end`` joins the bridge."""
        run("ip", "link", "add", near, "type", "veth", "peer", "name", hub_end)
        run("ip", "link", "set", hub_end, "netns", self.hub)
        in_ns(self.hub, "ip", "link", "set", hub_end, "master", "br0")
        in_ns(self.hub, "ip", "link", "set", hub_end, "up")

    def add_host(self, name: str) -> Host:
        k = len(self.hosts)
        host = Host(ns=f"pushup-{self.tag}-{name}", addr=str(self.net[10 + k]),
                    hub_end=f"pf{self.tag}h{k}")
        self._add_ns(host.ns)
        near = f"pf{self.tag}n{k}"
        self._veth(near, host.hub_end)
        run("ip", "link", "set", near, "netns", host.ns)
        in_ns(host.ns, "ip", "link", "set", near, "name", "eth0")
        in_ns(host.ns, "ip", "addr", "add", f"{host.addr}/24", "dev", "eth0")
        in_ns(host.ns, "ip", "link", "set", "eth0", "up")
        self.hosts.append(host)
        return host

    def close(self) -> None:
        errors = []
        for ns in reversed(self.namespaces):
            try:
                run("ip", "netns", "del", ns)
            except RuntimeError as e:
                errors.append(str(e))
        self.namespaces.clear()
        # a veth's ends go together when its namespace does; these are ends left
        # in the root namespace by a setup that failed half-way
        for line in run("ip", "-o", "link").splitlines():
            name = line.split(": ")[1].split("@")[0]
            if name.startswith(f"pf{self.tag}"):
                with contextlib.suppress(RuntimeError):
                    run("ip", "link", "del", name)
        if errors:
            raise RuntimeError("; ".join(errors))


def _table(chains: dict[str, Sequence[str]]) -> str:
    body = "".join(
        f"  chain {hook} {{ type filter hook {hook} priority 0; policy accept;\n"
        + "".join(f"    {rule} counter drop\n" for rule in rules) + "  }\n"
        for hook, rules in chains.items())
    return f"table inet {TABLE} {{\n{body}}}\n"


@contextlib.contextmanager
def _nft(host: Host, chains: dict[str, Sequence[str]]) -> Iterator[dict[str, int]]:
    """The rules for as long as the ``with`` lasts; what it yields is filled
    on the way out with ``dropped``, the packets they dropped (proof that the
    fault held)."""
    held: dict[str, int] = {}
    in_ns(host.ns, "nft", "-f", "-", stdin=_table(chains))
    try:
        yield held
    finally:
        try:
            table = json.loads(in_ns(host.ns, "nft", "-j", "list", "table", "inet", TABLE))
            held["dropped"] = sum(e["counter"]["packets"] for item in table["nftables"]
                                  for e in item.get("rule", {}).get("expr", [])
                                  if "counter" in e)
        finally:
            in_ns(host.ns, "nft", "delete", "table", "inet", TABLE)


def cut(host: Host, peers: Sequence[str],
        direction: str = "both") -> contextlib.AbstractContextManager[dict[str, int]]:
    """Drop packets between ``host`` and the addresses ``peers``: ``both`` ways,
    or only ``out`` (what ``host`` sends them; what they send arrives)."""
    assert direction in ("both", "out"), direction
    them = "{ " + ", ".join(peers) + " }"
    chains: dict[str, Sequence[str]] = {"output": [f"ip daddr {them}"]}
    if direction == "both":
        chains["input"] = [f"ip saddr {them}"]
    return _nft(host, chains)


def cut_port(host: Host, addr: str,
             port: int) -> contextlib.AbstractContextManager[dict[str, int]]:
    """Drop ``host``'s traffic with one service (``addr:port``) both ways; its
    clients, on the same address, still reach it."""
    return _nft(host, {"output": [f"ip daddr {addr} tcp dport {port}"],
                       "input": [f"ip saddr {addr} tcp sport {port}"]})


@contextlib.contextmanager
def slow(lab: Lab, host: Host, rate: str = "1mbit") -> Iterator[dict[str, int]]:
    """``host``'s link limited to ``rate`` each way (a token bucket on both veth
    ends; past 200 ms of queue, packets are dropped and TCP resends them). What
    it yields is filled on the way out: ``overlimits`` (packets the bucket held
    back: proof that the link was slowed) and ``dropped``."""
    ends = [(host.ns, "eth0"), (lab.hub, host.hub_end)]
    made = []
    held: dict[str, int] = {}
    try:
        for ns, dev in ends:
            in_ns(ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                  "burst", "16kb", "latency", "200ms")
            made.append((ns, dev))
        yield held
    finally:
        for ns, dev in made:
            try:
                for q in json.loads(in_ns(ns, "tc", "-s", "-j", "qdisc", "show", "dev", dev)):
                    if q.get("kind") == "tbf":
                        held["overlimits"] = held.get("overlimits", 0) + q["overlimits"]
                        held["dropped"] = held.get("dropped", 0) + q["drops"]
            finally:
                in_ns(ns, "tc", "qdisc", "del", "dev", dev, "root")


class NetCluster(LocalCluster):
    """``LocalCluster`` (no HAProxy) with node ``i`` in ``hosts[i]``'s namespace,
    on its address and one port; everything else (secrets in the environment,
    logs, stop by PID) as ``LocalCluster`` does it."""

    PORT = 8080

    def __init__(self, hosts: Sequence[Host], engine: str = "mesh",
                 node_args: Sequence[str] = ()) -> None:
        super().__init__(nodes=len(hosts), haproxy=False, engine=engine, node_args=node_args)
        self.hosts = list(hosts)
        self.bases = [self.node_url(i) for i in range(len(hosts))]

    def __enter__(self) -> NetCluster:
        self.start()
        return self

    def node_url(self, i: int) -> str:
        return f"http://{self.hosts[i].addr}:{self.PORT}"

    def node_argv(self, i: int) -> list[str]:
        argv = super().node_argv(i)
        argv[argv.index("--port") + 1] = str(self.PORT)
        # not loopback: without a token, publishing there needs saying so
        return ["ip", "netns", "exec", self.hosts[i].ns, *argv,
                "--host", self.hosts[i].addr, "--allow-open-publish"]


def links_up(c: NetCluster) -> bool:
    return all(p["state"] == "up" and p["queued"] == 0
               for b in c.bases for p in get_json(b + "/stats")[1]["peers"])


@contextlib.contextmanager
def mesh(nodes: int = 3) -> Iterator[tuple[Lab, list[Host], NetCluster]]:
    """A lab and ``nodes`` peered nodes in it, every link up."""
    with Lab() as lab:
        hosts = [lab.add_host(f"n{i}") for i in range(nodes)]
        # a publish cut off from every peer is answered 202 after this, not 2 s
        with NetCluster(hosts, node_args=["--publish-ack-timeout", "0.5"]) as c:
            deadline = time.monotonic() + 30
            while not links_up(c):
                if time.monotonic() > deadline:
                    raise RuntimeError("the peer links did not come up in 30 s")
                time.sleep(0.05)
            yield lab, hosts, c


@contextlib.contextmanager
def on_redis(nodes: int) -> Iterator[tuple[Lab, list[Host], NetCluster, RedisServer]]:
    """A lab, a redis-server of our own on the root namespace's lab address
    (and loopback), and ``nodes`` nodes on it."""
    with Lab() as lab:
        redis = RedisServer("--bind", "127.0.0.1", lab.root_addr, "--protected-mode", "no")
        redis.start()
        try:
            hosts = [lab.add_host(f"n{i}") for i in range(nodes)]
            with NetCluster(hosts, engine=f"redis://{lab.root_addr}:{redis.port}") as c:
                yield lab, hosts, c, redis
        finally:
            redis.stop()
