"""A link's connection to a peer, held by the test: the link's ``dial``
connects its stream to the peer's ``PeerStream`` over two StringTransports,
and nothing crosses until ``deliver``. With ``dead`` the connection drops and
every dial fails (a peer that is not running); with ``status`` it drops and
the peer's front answers the stream request that (e.g. 401: no mesh there)."""

from __future__ import annotations

import struct

from twisted.internet.address import UNIXAddress
from twisted.internet.defer import fail, succeed
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from pushup.backplane.mesh.replication import PeerStream

SWITCHED = (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: pushup-peer\r\n"
            b"Connection: Upgrade\r\n\r\n")


def frames(data: bytes) -> list[bytes]:
    out = []
    while len(data) >= 4:
        (n,) = struct.unpack("!I", data[:4])
        out.append(data[4:4 + n])
        data = data[4 + n:]
    return out


class _Socket:
    """What ``_twisted.write_now`` sends on: takes ``takes`` bytes a call
    (all, when None) into the transport's buffer, as a socket would."""

    def __init__(self, transport: StringTransport, takes: int | None) -> None:
        self.transport = transport
        self.takes = takes

    def send(self, data: bytes) -> int:
        n = len(data) if self.takes is None else min(self.takes, len(data))
        self.transport.io.write(bytes(data[:n]))
        return n


class KernelTransport(StringTransport):
    """A client transport whose writes go through a socket (``write_now``'s
    direct path), so the link can tell what the socket took whole."""

    def __init__(self, takes: int | None) -> None:
        super().__init__()
        self.socket = _Socket(self, takes)
        self.connected = 1
        self._tempDataBuffer: list[bytes] = []
        self.dataBuffer = b""
        self.offset = 0

    def write(self, data: bytes) -> None:
        """What the socket did not take waits in Twisted until the pipe
        delivers it (the reactor's turn that would write it out)."""
        self._tempDataBuffer.append(data)
        super().write(data)

    def clear(self) -> None:
        super().clear()
        self._tempDataBuffer = []


class Pipe:
    def __init__(self, receiver, unix: bool = False, kernel: bool = False,
                 takes: int | None = None) -> None:
        self.receiver = receiver
        self.unix = unix  # the peer's end is a Unix socket (a sibling worker's)
        # The link writes through a socket-like transport taking ``takes``
        # bytes a send (all, when None); else Twisted's buffered write path.
        self.kernel = kernel
        self.takes = takes
        self._dead = False
        self._status = 0
        self.client = self.server = None
        self.ct = self.st = None
        self.posts = 0  # batches delivered to the peer
        self.dials = 0

    def dial(self, protocol):
        self.dials += 1
        if self._dead:
            return fail(ConnectionRefusedError())
        self.client = protocol
        self.ct = KernelTransport(self.takes) if self.kernel else StringTransport()
        protocol.makeConnection(self.ct)
        self.ct.clear()  # the stream request: the peer's front reads it
        if self._status:
            protocol.dataReceived(b"HTTP/1.1 %d No\r\nContent-Length: 0\r\n\r\n" % self._status)
            self._lose()
            return succeed(protocol)
        host = UNIXAddress(b"\0sibling") if self.unix else None
        self.server, self.st = PeerStream(self.receiver), StringTransport(hostAddress=host)
        self.server.makeConnection(self.st)
        protocol.dataReceived(SWITCHED)
        return succeed(protocol)

    @property
    def held(self) -> list[bytes]:
        """Batches the link sent that the peer has not read yet."""
        if self.ct is None:
            return []
        return [f for f in frames(self.ct.value()) if f[:1] == b"b"]

    def deliver(self) -> None:
        """Let everything cross, both ways, until the line is quiet."""
        while self.ct is not None:
            up, down = self.ct.value(), self.st.value() if self.st is not None else b""
            self.ct.clear()
            if self.st is not None:
                self.st.clear()
            if not (up or down):
                break
            if up and self.server is not None:
                self.posts += sum(1 for f in frames(up) if f[:1] == b"b")
                self.server.dataReceived(up)
            if down:
                self.client.dataReceived(down)
        if self.ct is not None and (self.ct.disconnecting
                                    or (self.st is not None and self.st.disconnecting)):
            self._lose()

    def notice(self) -> None:
        """The link closed or aborted its end: the connection is lost (nothing crosses)."""
        if self.ct is not None and self.ct.disconnecting:
            self._lose()

    def _lose(self) -> None:
        client, server = self.client, self.server
        self.client = self.server = self.ct = self.st = None
        if server is not None:
            server.connectionLost(Failure(ConnectionDone()))
        if client is not None:
            client.connectionLost(Failure(ConnectionDone()))

    @property
    def dead(self) -> bool:
        return self._dead

    @dead.setter
    def dead(self, value: bool) -> None:
        self._dead = value
        if value:
            self._lose()

    @property
    def status(self) -> int:
        return self._status

    @status.setter
    def status(self, value: int) -> None:
        self._status = value
        self._lose()

    def request(self, method, url, data=None, headers=None, timeout=None, reactor=None):
        """Snapshots and repair stay HTTP: the peer is not serving / holds nothing."""
        from tests.backplane.mesh.test_mesh import _Answer

        if self._dead:
            return fail(ConnectionRefusedError())
        if self._status:
            return succeed(_Answer(self._status, b"{}"))
        if method == "GET":
            return succeed(_Answer(503, b"{}"))
        return succeed(_Answer(204, b""))
