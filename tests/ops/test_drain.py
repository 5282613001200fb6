"""``Node.stop`` in memory: the port closes first, the whole drain is bounded.

The node runs on a ``MemoryReactorClock``: its peer never answers (the
connection attempt just hangs, as with a peer that is down or stopped) and
one client connection never goes away (a client that does not read). The
drain must still close the listening port at once, give the peer at most
``PEER_FLUSH`` seconds, and be done within ``DRAIN_LIMIT`` seconds.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport

from pushup.backplane.mesh.mesh import PEER_FLUSH
from pushup.config import Config
from pushup.core.model import Draft
from pushup.ops.node import DRAIN_LIMIT, Node


class Port:
    def __init__(self, clock: MemoryReactorClock, port: int) -> None:
        self.clock = clock
        self.port = port
        self.stopped_at: float | None = None

    def getHost(self) -> IPv4Address:  # Twisted's interface
        return IPv4Address("TCP", "127.0.0.1", self.port)

    def stopListening(self) -> None:
        self.stopped_at = self.clock.seconds()


class Reactor(MemoryReactorClock):
    def __init__(self) -> None:
        super().__init__()
        self.ports: list[Port] = []

    def listenTCP(self, port: int, factory: Any, backlog: int = 50,
                  interface: str = "") -> Port:
        self.ports.append(Port(self, port or 40000))
        return self.ports[-1]


def started_node() -> tuple[Node, Reactor]:
    reactor = Reactor()
    config = Config(port=0, peer=("http://127.0.0.1:9",), cluster_secret="s")
    node = Node(config, reactor)
    node.listen()
    assert node.mesh is not None
    node.mesh.ready = True  # as if no peer was serving at start
    for link in node.mesh.links:
        link.start()
    node.service.publish([Draft(("a",), b"1")])  # owed to the peer, which never confirms
    reactor.advance(0)
    client = node.front.buildProtocol(IPv4Address("TCP", "127.0.0.1", 50000))
    client.makeConnection(StringTransport())  # never reads, never goes away
    return node, reactor


def run_stop(node: Node, reactor: Reactor) -> tuple[list[object], float]:
    done: list[object] = []
    node.stop().addBoth(done.append)
    while not done and reactor.seconds() < 60:
        reactor.advance(0.125)  # exact in binary: no drift
    return done, reactor.seconds()


def test_stop_closes_the_listening_port_before_flushing_to_peers() -> None:
    node, reactor = started_node()
    t0 = reactor.seconds()
    done: list[object] = []
    node.stop().addBoth(done.append)
    assert reactor.ports[0].stopped_at == t0  # at once, not after the peer flush
    assert not done
    while not done:
        reactor.advance(0.125)  # exact in binary: no drift


def test_stop_with_a_peer_down_and_a_client_not_reading_ends_within_the_limit() -> None:
    node, reactor = started_node()
    t0 = reactor.seconds()
    done, t1 = run_stop(node, reactor)
    assert done == [None]
    assert t1 - t0 <= DRAIN_LIMIT, t1 - t0
    assert PEER_FLUSH + 1 <= DRAIN_LIMIT <= 5.0
    assert all(link.stopped for link in node.mesh.links)  # type: ignore[union-attr]
