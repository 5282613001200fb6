"""A TCP proxy in front of a real redis-server, on the test's reactor, that can
make the subscriber connections stay up but stop forwarding: what Redis sends
them is held back while their TCP connections stay open (a middlebox that
stalled, a half-open connection). A connection counts as a subscriber once it
sent ``SSUBSCRIBE``. Connections made after ``stall_subscribers`` forward as usual."""

from __future__ import annotations

from typing import Any

from twisted.internet import protocol

from tests.real_reactor import reactor


class _ToRedis(protocol.Protocol):
    def __init__(self, client: _FromNode) -> None:
        self.client = client

    def connectionMade(self) -> None:
        self.client.redis = self
        if self.client.pending:
            self.transport.write(b"".join(self.client.pending))
            self.client.pending = []

    def dataReceived(self, data: bytes) -> None:
        if not self.client.stalled:
            self.client.transport.write(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.client.transport.loseConnection()


class _FromNode(protocol.Protocol):
    def __init__(self, proxy: StallingProxy) -> None:
        self.proxy = proxy
        self.redis: _ToRedis | None = None
        self.pending: list[bytes] = []
        self.subscriber = False
        self.stalled = False

    def connectionMade(self) -> None:
        self.proxy.connections.append(self)
        factory = protocol.ClientFactory()
        factory.protocol = lambda: _ToRedis(self)  # type: ignore[assignment,misc]
        reactor.connectTCP("127.0.0.1", self.proxy.redis_port, factory)

    def dataReceived(self, data: bytes) -> None:
        self.subscriber = self.subscriber or b"SSUBSCRIBE" in data.upper()
        if self.redis is None:
            self.pending.append(data)
        else:
            self.redis.transport.write(data)

    def connectionLost(self, reason: Any = None) -> None:
        self.proxy.connections.remove(self)
        if self.redis is not None:
            self.redis.transport.loseConnection()


class StallingProxy:
    """``url``: Redis through the proxy; ``stall_subscribers()``: see the module."""

    def __init__(self, redis_port: int) -> None:
        self.redis_port = redis_port
        self.connections: list[_FromNode] = []
        factory = protocol.Factory()
        factory.protocol = lambda: _FromNode(self)  # type: ignore[assignment,misc]
        self._port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.url = f"redis://127.0.0.1:{self._port.getHost().port}"

    def stall_subscribers(self) -> int:
        """Hold back what Redis sends every subscriber connection open now; how many."""
        stalled = [c for c in self.connections if c.subscriber]
        for c in stalled:
            c.stalled = True
        return len(stalled)

    def close(self) -> None:
        self._port.stopListening()
        for c in list(self.connections):
            c.transport.abortConnection()
