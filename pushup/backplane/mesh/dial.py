"""Dialling a peer: the connection a link's stream and its HTTP requests ride on.

``Dial`` is one connection of the replication stream, dialling end: it asks
the peer's front for the stream (HTTP ``Upgrade``), proves this node holds
the cluster secret and checks that the peer does (the challenge-response of
:mod:`pushup.backplane.mesh.stream`), then hands every frame and the loss of
the connection to its link (:mod:`pushup.backplane.mesh.peers`), which owns
every other decision. What holds for one connection only lives on it and
goes with it. ``http_client`` is the treq client for the rare signed
requests (snapshots, repair); ``http_agent``, the Agent beneath it, also
hands Durable Streams requests to their owner. Both connect to an IP
literal directly, and to a sibling worker (``--workers``) over a Unix socket: its URL is
``http+unix://NAME``, NAME a socket in Linux's abstract namespace (no file).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any
from typing import Protocol as TypingProtocol
from urllib.parse import urlsplit

from twisted.internet import defer
from twisted.internet.endpoints import UNIXClientEndpoint, connectProtocol
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Protocol

from pushup.backplane import client_endpoint
from pushup.backplane.mesh.outbound import PeerError
from pushup.backplane.mesh.stream import ANSWER_LIMIT, PROOF, Frames, nonce, proof, request_head


class PeerRefused(PeerError):
    """A peer refuses us: another cluster secret, or not a PushUp peer URL."""


class DialingLink(TypingProtocol):
    """What a ``Dial`` needs of its link (``PeerLink``)."""

    url: str

    def stream_opened(self, stream: Dial) -> None: ...

    def stream_frame(self, stream: Dial, frame: bytes) -> None: ...

    def stream_failed(self, stream: Dial, why: Exception) -> None: ...

    def stream_lost(self, stream: Dial, reason: Any) -> None: ...


UNIX_SCHEME = "http+unix"


def unix_url(name: str) -> str:
    """The URL of a sibling worker listening on abstract Unix socket ``name``."""
    return f"{UNIX_SCHEME}://{name}"


def unix_address(name: str) -> str:
    """The socket address of abstract name ``name`` (Linux: a leading NUL)."""
    return "\0" + name


def endpoint_for_url(reactor: Any, url: str) -> Any:
    """The client endpoint of a peer's URL: TCP, or a sibling's Unix socket."""
    parts = urlsplit(url)
    if parts.scheme == UNIX_SCHEME:
        return UNIXClientEndpoint(reactor, unix_address(parts.netloc), timeout=5)  # type: ignore[no-untyped-call]
    return client_endpoint(reactor, parts.hostname or "127.0.0.1", parts.port or 80, timeout=5)


class Dial(Frames):
    """One connection to a peer, dialling end: asks the peer's front for the
    stream (HTTP ``Upgrade``), says hello, answers the peer's challenge, then
    hands every frame to its link.

    The handshake: the peer's ``c`` frame must carry its proof for our nonce
    and its own, HMAC(secret, "server" | nonce_c | nonce_s); we answer ours
    (``p``) and tell the link ``stream_opened``. A wrong proof is answered
    ``erefused``, and it, a refusal (``e``) or any other frame before the
    handshake is done is the link's ``stream_failed`` (:class:`PeerRefused`
    for the first two). The rest of this object is the link's notes on this
    one connection, dropped with it (``PeerLink.stream_lost``).
    """

    # What a peer sends the dialer is its challenge and short answers (an
    # ack, a hole, a reason), never a batch: a longer frame is refused at
    # its length prefix instead of buffered up to the batch limit.
    MAX_LENGTH = ANSWER_LIMIT

    def __init__(self, link: DialingLink, secret: str, now: float) -> None:
        self.link = link
        self.secret = secret
        self.nonce_c = nonce()
        self._head: bytes | None = b""  # the HTTP answer, until it is complete
        self.open = False  # authenticated both ways
        # The link's notes on this connection:
        self.dialled_at = now
        self.dialling: defer.Deferred[Any] | None = None  # until it connects
        self.answering = False  # the peer has acked a batch on it
        self.relays = 0  # relayed batches sent on it and not yet answered
        self.flush_call: IDelayedCall | None = None  # a flush due at the turn's end
        self.why: Exception | None = None  # why the link closed it

    def connectionMade(self) -> None:  # Twisted's names
        assert self.transport is not None
        self.transport.write(request_head(urlsplit(self.link.url).netloc or "peer"))

    def dataReceived(self, data: bytes) -> None:
        if self._head is None:
            super().dataReceived(data)  # type: ignore[no-untyped-call]
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > 8192:
                self.stringReceived(b"enot a PushUp peer (no HTTP answer)")
            return
        head, rest = self._head[:end], self._head[end + 4:]
        self._head = None
        status = head.split(b" ", 2)[1:2]
        if status != [b"101"]:
            code = int(status[0]) if status and status[0].isdigit() else 0
            why = f"answered {code} to the stream request"
            self.stringReceived((b"e" if 400 <= code < 500 else b"x") + why.encode())
            return
        self.sendString(b"h" + self.nonce_c)
        if rest:
            super().dataReceived(rest)  # type: ignore[no-untyped-call]

    def stringReceived(self, frame: bytes) -> None:
        if self.open:
            self.link.stream_frame(self, frame)
            return
        kind, payload = frame[:1], frame[1:]
        try:
            if kind == b"c":
                self._challenged(payload)
            elif kind == b"e":
                raise PeerRefused(f"it says: {payload.decode(errors='replace')[:200]}")
            else:
                raise PeerError(f"unexpected frame {frame[:20]!r}")
        except PeerError as e:
            self.link.stream_failed(self, e)
            return
        self.link.stream_opened(self)

    def _challenged(self, payload: bytes) -> None:
        nonce_s, theirs = payload[:-PROOF], payload[-PROOF:]
        if not hmac.compare_digest(theirs, proof(self.secret, b"server", self.nonce_c, nonce_s)):
            self.sendString(b"erefused")
            raise PeerRefused("its handshake proof is wrong (another cluster secret?)")
        self.sendString(b"p" + proof(self.secret, b"client", nonce_s, self.nonce_c))
        self.open = True

    def connectionLost(self, reason: Any = None) -> None:
        call, self.flush_call = self.flush_call, None
        if call is not None and call.active():
            call.cancel()
        self.link.stream_lost(self, reason)

    def lengthLimitExceeded(self, length: int) -> None:
        self._unprocessed = b""  # what Twisted kept of it: not held until the close
        self.stringReceived(b"xa frame of %d bytes, longer than any answer" % length)


def dialer(reactor: Any, url: str) -> Callable[[Protocol], defer.Deferred[Any]]:
    """Dial the peer's HTTP port (IP literals directly: no resolver thread)."""
    def dial(protocol: Protocol) -> defer.Deferred[Any]:
        d: defer.Deferred[Any] = connectProtocol(  # type: ignore[no-untyped-call]
            endpoint_for_url(reactor, url), protocol)
        return d

    return dial


class _Endpoints:
    """Agent's endpoints, by ``endpoint_for_url``."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor

    def endpointForURI(self, uri: Any) -> Any:  # Twisted's interface
        return endpoint_for_url(self.reactor, uri.toBytes().decode())


def http_agent(reactor: Any, idle_per_peer: int) -> Any:
    """A Twisted ``Agent`` with its own persistent pool, keeping at most
    ``idle_per_peer`` idle connections to each peer; an idle one closes
    before the peer's 60 s idle timeout would (Twisted issue #7843)."""
    from twisted.web.client import Agent

    from pushup._twisted import quiet_pool

    pool = quiet_pool(reactor)
    pool.maxPersistentPerHost = idle_per_peer
    pool.cachedConnectionTimeout = 30
    return Agent.usingEndpointFactory(  # type: ignore[no-untyped-call]
        reactor, _Endpoints(reactor), pool=pool)


def http_client(reactor: Any) -> Any:
    """A treq client on ``http_agent`` (the peers' signed requests)."""
    from treq.client import HTTPClient

    return HTTPClient(http_agent(reactor, 2))

