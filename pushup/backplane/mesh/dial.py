"""Dialling a peer: the connection a link's stream and its HTTP requests ride on.

``Dial`` is one connection of the replication stream, dialling end: it asks
the peer's front for the stream (HTTP ``Upgrade``), proves this node holds
the cluster secret and checks that the peer does (the challenge-response of
:mod:`pushup.backplane.mesh.replication`), then hands every frame and the loss of
the connection to its link (:mod:`pushup.backplane.mesh.peers`), which owns
every other decision. What holds for one connection only lives on it and
goes with it; its phase moves by the table of :mod:`~pushup.backplane.mesh.phases`,
and the link changes it only through its methods. ``http_client`` is the treq
client for the rare signed
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
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol

from pushup.backplane import client_endpoint
from pushup.backplane.mesh.outbound import PeerError
from pushup.backplane.mesh.phases import DiallingEvent, DiallingPhase, dialling_after
from pushup.backplane.mesh.replication import (
    ANSWER_LIMIT,
    PROOF,
    Frames,
    nonce,
    proof,
    request_head,
)


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
_CONNECTING, _ASKING = DiallingPhase.CONNECTING, DiallingPhase.ASKING
_OPEN, _ANSWERING = DiallingPhase.OPEN, DiallingPhase.ANSWERING


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
    one connection (since when it waits, why the link closed it, what it
    relayed, a flush due), dropped with it (``PeerLink.stream_lost``).
    """

    # What a peer sends the dialer is its challenge and short answers (an
    # ack, a hole, a reason), never a batch: a longer frame is refused at
    # its length prefix instead of buffered up to the batch limit.
    MAX_LENGTH = ANSWER_LIMIT

    def __init__(self, link: DialingLink, secret: str, now: float) -> None:
        self.link = link
        self.secret = secret
        self.nonce_c = nonce()
        self.phase = _CONNECTING
        self._head = b""  # the HTTP answer, until it is complete (ASKING)
        self._dialling: defer.Deferred[Any] | None = None  # the attempt, until it connects
        # The link's notes on this connection:
        self.dialled_at = now
        self.relays = 0  # relayed batches sent on it and not yet answered
        self._flush_call: IDelayedCall | None = None  # a flush due at the turn's end
        self.why: Exception | None = None  # why the link closed it

    def _move(self, event: DiallingEvent) -> None:
        self.phase = dialling_after(self.phase, event)

    @property
    def open(self) -> bool:
        """Authenticated both ways: batches may go."""
        return self.phase is _OPEN or self.phase is _ANSWERING

    @property
    def answering(self) -> bool:
        """The peer has acked a batch on this connection."""
        return self.phase is _ANSWERING

    # -- what the link does with it ---------------------------------------------

    def connect(self, dial: Callable[[Protocol], defer.Deferred[Any]]) -> defer.Deferred[Any]:
        """Dial the peer with ``dial``; the Deferred fails (and the phase is
        CLOSED) when it cannot connect, or when :meth:`abandon` is called first."""
        d = self._dialling = dial(self)
        d.addErrback(self._not_connected)
        return d

    def _not_connected(self, failure: Any) -> Any:
        self._dialling = None
        self._move(DiallingEvent.LOST)
        return failure

    def abandon(self) -> None:
        """Stop dialling (CONNECTING only): the attempt fails as cancelled."""
        if self._dialling is not None:
            self._dialling.cancel()

    def close(self, why: Exception | None = None, abort: bool = False) -> None:
        """The link gives the connection up (``why``: what ``stream_lost``
        reports); ``abort`` drops what waits to be sent (a peer that reads
        nothing), else it goes first. The phase stays until the loss."""
        if why is not None:
            self.why = why
        if self.transport is None:
            return
        if abort:
            self.transport.abortConnection()  # type: ignore[attr-defined]
        else:
            self.transport.loseConnection()

    def relay(self, payload: bytes, window: int) -> bool:
        """Send a relayed batch (``r``) if the stream is open and fewer than
        ``window`` wait for their answer; False when it was not sent."""
        if not self.open or self.relays >= window:
            return False
        self.relays += 1
        self.sendString(b"r" + payload)
        return True

    def relay_answered(self) -> bool:
        """The peer answered a relayed batch; False when none was due."""
        if not self.relays:
            return False
        self.relays -= 1
        return True

    def acked(self) -> None:
        """The peer acked a batch on this connection."""
        self._move(DiallingEvent.ACKED)

    @property
    def flush_due(self) -> bool:
        """A flush is due at this turn's end."""
        return self._flush_call is not None

    def flush_at_turn_end(self, clock: IReactorTime, flush: Callable[[], None]) -> None:
        """Call ``flush`` at this turn's end (once, however often asked)."""
        if self._flush_call is None:
            self._flush_call = clock.callLater(0, flush)

    def flushing(self) -> None:
        """A flush runs now: the one due is no longer waited for (if it still
        runs, it finds nothing more to send)."""
        self._flush_call = None

    def cancel_flush(self) -> None:
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()

    # -- Twisted's side ----------------------------------------------------------

    def connectionMade(self) -> None:  # Twisted's names
        assert self.transport is not None
        self._move(DiallingEvent.CONNECTED)
        self.transport.write(request_head(urlsplit(self.link.url).netloc or "peer"))

    def dataReceived(self, data: bytes) -> None:
        if self.phase is not _ASKING:
            super().dataReceived(data)  # type: ignore[no-untyped-call]
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > 8192:
                self.stringReceived(b"enot a PushUp peer (no HTTP answer)")
            return
        head, rest = self._head[:end], self._head[end + 4:]
        self._head = b""
        self._move(DiallingEvent.ANSWERED)
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
        self._move(DiallingEvent.PROVEN)

    def connectionLost(self, reason: Any = None) -> None:
        self.cancel_flush()
        self._move(DiallingEvent.LOST)
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

