"""Fake Redis Cluster nodes behind a ``MemoryReactorClock``, for the client's
own modules (pool.py, slotmap.py, subscriptions.py): each dial the client makes
is accepted (or refused) by the node at its port, and every byte crosses only
when the test ``pump``s, so the order of events is the test's.

The rule: a node answers RESP as Redis does the few commands the client sends
(PING, INFO cluster, CLUSTER SLOTS, SCRIPT LOAD, ASKING, SSUBSCRIBE, SUNSUBSCRIBE,
SPUBLISH, GET, SET), knows which slots it owns (``Cluster.slots``: one map every
node reports), answers ``MOVED`` for a key or channel it does not own, and
tells a subscriber of a channel whose slot moved away ``sunsubscribe``, unasked
(Redis 7). A node can be ``down`` (dials refused, its connections dropped) or
``frozen`` (dials accepted, nothing answered: a SIGSTOPped redis-server). It
stands beside a real cluster (test_cluster.py, tests/cluster/), not for it:
failovers, migrations and the bytes of a real Redis are proved there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hiredis
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from pushup.backplane.redis.client import script_sha
from pushup.backplane.redis.slots import SLOTS, key_slot

HOST = "127.0.0.1"
MOST_PUMPS = 1000  # a pump that goes on this long is a loop: the test's bug


def resp(value: Any) -> bytes:
    """``value`` as Redis sends it (a str is a status, an Exception an error)."""
    if isinstance(value, Exception):
        return b"-" + str(value).encode() + b"\r\n"
    if isinstance(value, str):
        return b"+" + value.encode() + b"\r\n"
    if isinstance(value, int):
        return b":%d\r\n" % value
    if value is None:
        return b"$-1\r\n"
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    return b"*%d\r\n" % len(value) + b"".join(resp(item) for item in value)


@dataclass(eq=False)
class Link:
    """One client connection to a node: the client's protocol, its transport."""

    node: Node
    protocol: Any
    transport: StringTransport
    reader: Any = field(default_factory=hiredis.Reader)
    subscribed: set[bytes] = field(default_factory=set)
    closed: bool = False


@dataclass(eq=False)
class Node:
    """One Redis node at ``port``."""

    cluster: Cluster
    port: int
    down: bool = False
    frozen: bool = False
    links: list[Link] = field(default_factory=list)
    received: list[list[bytes]] = field(default_factory=list)  # every command, in order
    strings: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def count(self, *words: str) -> int:
        """How many commands beginning with ``words`` (e.g. "CLUSTER", "SLOTS") it received."""
        head = [w.upper().encode() for w in words]
        return sum(1 for c in self.received if [w.upper() for w in c[:len(head)]] == head)

    def answer(self, link: Link, command: list[bytes]) -> Any:
        self.received.append(command)
        name = command[0].upper()
        owner = self.cluster.owner_of
        if name == b"PING":
            return "PONG"
        if name == b"INFO":
            return b"cluster_enabled:%d\r\n" % self.cluster.clustered
        if name == b"CLUSTER":
            return self.cluster.cluster_slots()
        if name in (b"ASKING", b"SCRIPT") and command[1:2] != [b"LOAD"]:
            return "OK"
        if name == b"SCRIPT":
            return script_sha(command[2]).encode()
        if name in (b"SSUBSCRIBE", b"GET", b"SET", b"SPUBLISH") and owner(command[1]) is not self:
            return Exception(f"MOVED {key_slot(command[1])} {owner(command[1]).address}")
        if name == b"SSUBSCRIBE":
            link.subscribed.add(command[1])
            return [b"ssubscribe", command[1], len(link.subscribed)]
        if name == b"SUNSUBSCRIBE":
            link.subscribed.discard(command[1])
            return [b"sunsubscribe", command[1], len(link.subscribed)]
        if name == b"SPUBLISH":
            return self.spublish(command[1], command[2])
        if name == b"GET":
            return self.strings.get(command[1])
        if name == b"SET":
            self.strings[command[1]] = command[2]
            return "OK"
        return Exception(f"ERR unknown command '{name.decode()}'")

    def spublish(self, channel: bytes, payload: bytes) -> int:
        """Send ``payload`` to every subscriber of ``channel`` here."""
        told = [link for link in self.links if channel in link.subscribed and not link.closed]
        for link in told:
            self.cluster.outbox.append((link, resp([b"smessage", channel, payload])))
        return len(told)


class Cluster:
    """Nodes on ports ``ports`` (the first ``primaries`` own slots, split evenly);
    ``reactor`` is the client's. ``clustered`` False: one redis-server."""

    def __init__(self, ports: list[int], *, clustered: bool = True) -> None:
        self.reactor = MemoryReactorClock()
        self.clustered = clustered
        self.nodes = {port: Node(self, port) for port in ports}
        share = SLOTS // len(ports)
        self.slots: list[int] = [ports[min(i // share, len(ports) - 1)] for i in range(SLOTS)]
        self.outbox: list[tuple[Link, bytes]] = []
        self._dials = 0

    def owner_of(self, key: bytes) -> Node:
        return self.nodes[self.slots[key_slot(key)]]

    def cluster_slots(self) -> list[Any]:
        ranges: list[Any] = []
        for slot, port in enumerate(self.slots):
            if ranges and ranges[-1][2][1] == port and ranges[-1][1] == slot - 1:
                ranges[-1][1] = slot
            else:
                ranges.append([slot, slot, [HOST.encode(), port, b"id%d" % port]])
        return ranges

    def move(self, key: bytes | str, port: int) -> None:
        """The slot of ``key`` moves to the node at ``port``; subscribers of its
        channels on the old owner are told ``sunsubscribe`` (Redis 7)."""
        slot = key_slot(key)
        old = self.nodes[self.slots[slot]]
        self.slots[slot] = port
        for link in old.links:
            for channel in [c for c in link.subscribed if key_slot(c) == slot]:
                link.subscribed.discard(channel)
                self.outbox.append((link, resp([b"sunsubscribe", channel, 0])))

    def drop(self, port: int) -> None:
        """Every connection to the node at ``port`` goes."""
        for link in list(self.nodes[port].links):
            self._close(link)

    def pump(self) -> None:
        """Dials answered, bytes carried both ways, closes completed, until quiet."""
        for _ in range(MOST_PUMPS):
            if not self._step():
                return
        raise AssertionError("the fake cluster never went quiet")

    def run(self, seconds: float, step: float = 0.1) -> None:
        """``seconds`` of the client's time in turns of ``step``, pumping each."""
        self.pump()
        for _ in range(round(seconds / step)):
            self.reactor.advance(step)
            self.pump()

    def _step(self) -> bool:
        moved = False
        while self._dials < len(self.reactor.tcpClients):
            host, port, factory, *_ = self.reactor.tcpClients[self._dials]
            self._dials += 1
            moved = True
            node = self.nodes.get(port)
            if node is None or node.down:
                factory.clientConnectionFailed(None, Failure(ConnectionRefusedError()))
                continue
            protocol = factory.buildProtocol(None)
            link = Link(node, protocol, StringTransport())
            node.links.append(link)
            protocol.makeConnection(link.transport)
        outbox, self.outbox = self.outbox, []
        for link, data in outbox:
            if not link.closed:
                moved = True
                link.protocol.dataReceived(data)
        for node in self.nodes.values():
            for link in list(node.links):
                moved |= self._serve(link)
        return moved

    def _serve(self, link: Link) -> bool:
        if link.closed:
            return False
        if link.transport.disconnecting or link.node.down:
            self._close(link)
            return True
        sent = link.transport.value()
        if not sent or link.node.frozen:
            return False
        link.transport.clear()
        link.reader.feed(sent)
        command = link.reader.gets()
        while command is not False:
            self.outbox.append((link, resp(link.node.answer(link, command))))
            command = link.reader.gets()
        return True

    def _close(self, link: Link) -> None:
        if not link.closed:
            link.closed = True
            link.node.links.remove(link)
            link.protocol.connectionLost(Failure(ConnectionDone()))
