"""The listening side of the HTTP front: ``Front`` builds one ``HTTPProtocol``
per connection up to its limit, and counts them.

Past the limit a connection never reaches HTTP: it gets a canned 503 at once
(the only bytes written outside ``protocol``), a moment to read it, and the
close; past ``REFUSING_AT_ONCE`` such refusals, the socket is closed at once.
The front also ends what spans connections: a fan-out's end lets the
connections it paused answer on, and a drain closes them all. What happens on
one connection is ``protocol``'s.
"""

from __future__ import annotations

from typing import cast

from twisted.internet import defer
from twisted.internet.interfaces import IAddress
from twisted.internet.protocol import Factory, Protocol

from pushup.core import errors
from pushup.core.clock import Clock
from pushup.core.counters import Counters
from pushup.http.exchange import Writer
from pushup.http.phase import Answering
from pushup.http.protocol import HTTPProtocol
from pushup.http.seams import App, Connection

REFUSING_AT_ONCE = 1024  # refusals being answered at a time; past that, hang up
REFUSAL_LINGER = 2.0  # seconds a refused client has to read its 503


class _Refusal(Protocol):
    """Past the connection limit: answer 503 at once, let the client read it, close."""

    def __init__(self, front: Front) -> None:
        self.front = front

    def connectionMade(self) -> None:
        self.front.refusing += 1
        self.front.counters.refused += 1
        self.conn = cast(Connection, self.transport)
        self.conn.write(self.front.refusal)
        self.conn.loseWriteConnection()  # FIN after the answer; read until theirs
        self.timer = self.front.clock.callLater(REFUSAL_LINGER, self.conn.abortConnection)

    def dataReceived(self, data: bytes) -> None:
        pass  # their request: read and dropped, so closing sends no RST over the 503

    def connectionLost(self, reason: object = None) -> None:
        self.front.refusing -= 1
        if self.timer.active():
            self.timer.cancel()


class Front(Factory):
    """Builds a protocol per connection, up to ``limit`` open; counts them."""

    noisy = False

    def __init__(self, app: App, writer: Writer, counters: Counters, clock: Clock, *,
                 limit: int, max_target: int, header_timeout: float,
                 keepalive_timeout: float, send_timeout: float, max_event_id: int = 0) -> None:
        self.app = app
        self.writer = writer
        self.counters = counters
        self.clock = clock
        self.limit = limit
        self.max_target = max_target
        self.max_event_id = max_event_id  # a Last-Event-ID this long is not counted
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.send_timeout = send_timeout
        self.draining = False
        self.protocols: set[HTTPProtocol] = set()
        self.held: list[HTTPProtocol] = []  # answered during a fan-out, not read on
        self.refusing = 0
        writer.tick(clock.seconds())
        self.refusal = writer.canned(errors.Unavailable(
            f"this node holds its limit of {limit} connections; retry later"))
        self._on_empty: list[defer.Deferred[None]] = []

    def buildProtocol(self, addr: IAddress | None) -> Protocol | None:
        if len(self.protocols) >= self.limit:
            if self.refusing >= REFUSING_AT_ONCE:
                self.counters.refused += 1
                return None  # Twisted closes the socket at once
            return _Refusal(self)
        protocol = HTTPProtocol(self)
        self.protocols.add(protocol)
        self.counters.connections = len(self.protocols)
        return protocol

    def lost(self, protocol: HTTPProtocol) -> None:
        self.protocols.discard(protocol)
        self.counters.connections = len(self.protocols)
        if not self.protocols:
            waiting, self._on_empty = self._on_empty, []
            for d in waiting:
                d.callback(None)

    def release(self) -> None:
        """A fan-out is done: drop its cached responses; its clients' next
        requests may be answered."""
        self.writer.release_shared()
        held, self.held = self.held, []
        for protocol in held:
            protocol.release()

    def close_all(self, upgraded: bool = True, streaming: bool = True) -> defer.Deferred[None]:
        """Close every connection once its pending output is sent; those
        upgraded to another protocol (a peer's replication stream) only with
        ``upgraded`` (a draining node takes what its peers flush to it first),
        those holding an event stream only with ``streaming`` (a drain window
        ends them one by one)."""
        self.draining = True
        for protocol in list(self.protocols):
            answering = protocol.answering
            if ((upgraded or answering is not Answering.UPGRADED)
                    and (streaming or answering is not Answering.STREAMING)):
                protocol.close()
        d: defer.Deferred[None] = defer.Deferred()
        if self.protocols:
            self._on_empty.append(d)
        else:
            d.callback(None)
        return d
