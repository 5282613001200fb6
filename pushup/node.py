"""The composition root: build a node from a Config, listen, drain on stop.

Only this module and :mod:`pushup.cli` know the real reactor. A node is a
``Service`` behind a ``Web`` front, behind a ``Gate`` that counts bytes and
connections and refuses connections past the limit with a 503 of its own.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from twisted.internet import defer
from twisted.internet.interfaces import IAddress, IListeningPort
from twisted.internet.protocol import Protocol
from twisted.internet.tcp import makeBinding
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory

from pushup import errors
from pushup.cluster import PEER_FLUSH, Cluster
from pushup.config import Config
from pushup.fleet import Fleet
from pushup.metrics import Counters, prometheus_text, registry_for, rss_bytes
from pushup.model import Origin
from pushup.peers import http_client
from pushup.service import Service
from pushup.store import Retention, Store
from pushup.web import PushUpSite, Web, canned_response

log = Logger()
SELECT_CONNECTIONS = 900  # select() cannot watch descriptors past 1023
REFUSING_AT_ONCE = 64  # refusals answered politely at a time; past that, hang up
DRAIN_LIMIT = 4.0  # seconds a drain may take in all (the README promises exit within 5 s)


class _Counted(ProtocolWrapper):
    def dataReceived(self, data: bytes) -> None:
        self.factory.counters.bytes_in += len(data)
        super().dataReceived(data)

    def write(self, data: bytes) -> None:
        self.factory.counters.bytes_out += len(data)
        super().write(data)

    def writeSequence(self, data: Any) -> None:
        self.factory.counters.bytes_out += sum(map(len, data))
        super().writeSequence(data)

    def write_now(self, data: bytes) -> None:
        """Write ``data``, straight to the socket when nothing is queued before it.

        Twisted queues every write until the reactor's next turn (ask for
        writability, wait, send, stop asking): three system calls and a turn
        per response. With nothing queued we send at once, as asyncio does,
        and queue only what the socket did not take.
        """
        self.factory.counters.bytes_out += len(data)
        t = self.transport
        sock = getattr(t, "socket", None)
        if (sock is not None and t.connected and not t.disconnecting
                and not t._tempDataBuffer and len(t.dataBuffer) == t.offset):
            try:
                data = data[sock.send(data):]
            except OSError:
                pass  # would block, or broken: Twisted's own write path copes
        if data:
            t.write(data)


class _Refusal(Protocol):
    """Reads the request head, answers 503 overloaded, closes."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.seen = b""

    def connectionMade(self) -> None:
        self.gate.refusing += 1
        self.gate.counters.refused += 1
        self.transport.write(self.gate.refusal)
        self.timer = self.gate.clock.callLater(2.0, self.transport.abortConnection)

    def dataReceived(self, data: bytes) -> None:
        self.seen = (self.seen + data)[-4:]
        if b"\r\n\r\n" in self.seen or len(data) > 16384:
            self.transport.loseConnection()

    def connectionLost(self, reason: object = None) -> None:
        self.gate.refusing -= 1
        if self.timer.active():
            self.timer.cancel()


class Gate(WrappingFactory):
    """Counts connections and bytes; past ``limit`` open, answers 503 itself."""

    protocol = _Counted
    noisy = False

    def __init__(self, site: PushUpSite, counters: Counters, limit: int, clock: Any) -> None:
        super().__init__(site)
        self.counters = counters
        self.limit = limit
        self.clock = clock
        self.refusing = 0
        self.refusal = canned_response(
            errors.Unavailable(f"this node holds its limit of {limit} connections; retry later"),
            site.web.config.cors_origin)
        self._on_empty: list[defer.Deferred[None]] = []

    def buildProtocol(self, addr: IAddress) -> Any:
        if self.counters.connections >= self.limit:
            if self.refusing >= REFUSING_AT_ONCE:
                self.counters.refused += 1
                return None  # Twisted closes the socket at once
            return _Refusal(self)
        self.counters.connections += 1
        return super().buildProtocol(addr)

    def unregisterProtocol(self, p: Any) -> None:
        super().unregisterProtocol(p)
        self.counters.connections -= 1
        if not self.counters.connections:
            waiting, self._on_empty = self._on_empty, []
            for d in waiting:
                d.callback(None)

    def close_all(self) -> defer.Deferred[None]:
        """Close every connection once its pending output is sent."""
        for p in list(self.protocols):
            p.transport.loseConnection()
        d: defer.Deferred[None] = defer.Deferred()
        if self.counters.connections:
            self._on_empty.append(d)
        else:
            d.callback(None)
        return d


class Node:
    """One PushUp node: store, hub, HTTP, limits; ``listen`` then ``stop``."""

    def __init__(self, config: Config, reactor: Any) -> None:
        self.config = config
        self.reactor = reactor
        node_id = config.node_id or "n" + secrets.token_hex(4)
        origin = Origin(node_id, time.time_ns() // 1000)
        retention = Retention(
            message_ttl=round(config.message_ttl * 1e6),
            channel_ttl=round(config.channel_ttl * 1e6),
            max_per_channel=config.max_messages_per_channel,
            max_bytes=config.max_cached_bytes,
        )
        self.service = Service(Store(retention, origin), reactor, config.max_timeout)
        self.registry = registry_for(self.stats)
        self.web = Web(self.service, config, self.stats, self.metrics)
        self.site = PushUpSite(self.web, reactor)
        limit = config.max_connections
        if config.reactor == "select" and limit > SELECT_CONNECTIONS:
            log.warn("select reactor: capping connections at {n}", n=SELECT_CONNECTIONS)
            limit = SELECT_CONNECTIONS
        self.gate = Gate(self.site, self.service.counters, limit, reactor)
        self.port: IListeningPort | None = None
        self.fleet: Fleet | None = None  # with --workers: the whole node's figures
        self.cluster: Cluster | None = None
        if config.peer or config.cluster_secret:
            self.cluster = Cluster(self.service, config, reactor, http_client(reactor))
            self.web.cluster = self.cluster

    def listen(self, reuse_port: bool = False) -> int:
        """Start accepting connections; returns the port (useful with port 0).

        With ``reuse_port`` the port is shared (SO_REUSEPORT) with the other
        workers of ``--workers``.
        """
        port: Any = self.config.port
        if reuse_port:
            port = makeBinding(self.config.host, port, reuseAddress=True, reusePort=True)
        self.port = self.reactor.listenTCP(port, self.gate, backlog=4096,
                                           interface=self.config.host)
        return self.port.getHost().port  # type: ignore[no-any-return]

    def adopt(self, fd: int) -> None:
        """Also serve on an inherited listening socket (a worker's private port)."""
        self.private_port = self.reactor.adoptStreamPort(fd, socket.AF_INET, self.gate)
        os.close(fd)

    def start(self) -> defer.Deferred[None]:
        """Join the cluster: catch up from a peer, then start the links."""
        if self.cluster is None:
            return defer.succeed(None)
        d: defer.Deferred[None] = self.cluster.start()
        d.addErrback(lambda f: log.failure("joining the cluster failed", failure=f))
        return d

    def stats(self) -> dict[str, Any]:
        if self.fleet is not None:
            return self.fleet.stats()
        return self.worker_stats()

    def worker_stats(self) -> dict[str, Any]:
        """This process's figures (the node's, unless it is one of ``--workers``)."""
        peers = self.cluster.stats() if self.cluster is not None else []
        stats = self.service.snapshot(peers=peers, rss=rss_bytes())
        if self.cluster is not None:
            stats["peer_refused"] = self.cluster.refused
        return stats

    def metrics(self) -> tuple[bytes, bytes]:
        if self.fleet is not None:
            return CONTENT_TYPE_LATEST.encode(), self.fleet.metrics_text()
        return CONTENT_TYPE_LATEST.encode(), prometheus_text(self.registry)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        """Drain, all within ``DRAIN_LIMIT`` seconds, in this order.

        The public port closes at once (a load balancer's next connection goes
        to another node); every held subscriber is answered; peers get what
        they lack for at most ``PEER_FLUSH`` seconds (a worker's private port,
        which its siblings flush to, stays open meanwhile); then connections
        close once their answers are sent, or when the limit is reached.
        """
        started = self.reactor.seconds()
        if self.port is not None:
            yield self.port.stopListening()
        log.info("stopped listening; draining: answering {n} waiting subscribers",
                 n=len(self.service.hub))
        self.service.drain()
        self.gate.close_all()  # idle and answered connections go now, not after the flush
        if self.cluster is not None:
            yield self.cluster.stop(PEER_FLUSH)
        private = getattr(self, "private_port", None)
        if private is not None:
            yield private.stopListening()
        closed = self.gate.close_all()
        left = max(0.0, DRAIN_LIMIT - (self.reactor.seconds() - started))
        closed.addTimeout(left, self.reactor)
        try:
            yield closed
        except defer.TimeoutError:
            log.warn("drain: some clients did not read their answers in time")
        log.info("drained")
