"""The replication stream's frames and its receiving end.

One long-lived connection per link carries Int32-length-prefixed frames
(Twisted's ``Int32StringReceiver``; no parser of ours). A frame's first byte
says what it is:

- ``h`` nonce_c: the dialing node's hello (16 fresh random bytes);
- ``c`` nonce_s proof: the answering node's challenge and its proof,
  HMAC(secret, "server" | nonce_c | nonce_s);
- ``p`` proof: the dialing node's proof, HMAC(secret, "client" | nonce_s | nonce_c);
- ``b`` batch: a batch of the dialer's own messages and ops (``wire.pack_batch``);
- ``a`` horizon / ``n`` expected: the answer to each batch, in order (an ack
  with how far we hold its origin, or a hole with the sequence we expect);
  the answers to the batches of one read leave in one write;
- ``r`` batch: a batch another node sent the dialer, relayed by a worker to
  its sibling (``--workers``); applied like any, answered by an empty ``r``.
  A worker relays what arrives on a stream from another node (TCP), never
  what a sibling sent it (a Unix socket);
- ``e`` reason: the sender refuses or fails; the connection closes after it.

Both sides bring a fresh nonce, so a recorded handshake replayed is refused;
the secret never travels. Until a connection has proven itself, a frame
longer than the longest handshake frame is refused at its length prefix
(counted, closed), so a stranger cannot make a node buffer a batch-sized
frame; the batch limit applies once the handshake is done. A connection
that has not proven itself within ``HANDSHAKE_TIMEOUT``, or says nothing for
``IDLE_TIMEOUT`` (a dialer sends a heartbeat every 2 s), is closed; the
HTTP front that handed it over after ``101 Switching Protocols`` still
counts it against ``--max-connections``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from typing import Protocol

from twisted.internet.address import UNIXAddress
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.protocols.basic import Int32StringReceiver, StringTooLongError

from pushup._twisted import write_now
from pushup.backplane.mesh.phases import ReceivingEvent, ReceivingPhase, receiving_after
from pushup.backplane.mesh.wire import PEER_BODY_LIMIT, Batch, unpack_batch
from pushup.core.errors import BadRequest, PushUpError
from pushup.core.follow import Applied, Followed

log = Logger()
NONCE = 16
PROOF = 32
HANDSHAKE_FRAME = 1 + PROOF  # the longest frame before the handshake is done (``p``)
ANSWER_LIMIT = 64 * 1024  # the longest frame a dialer reads: answers, reasons, a challenge
HANDSHAKE_TIMEOUT = 10.0  # seconds for a dialer to prove it holds the secret
IDLE_TIMEOUT = 30.0  # seconds of silence after which a stream is given up
UPGRADE = b"pushup-peer"
PATH = "/peer/stream"
_HELLO, _PROOF = ReceivingPhase.HELLO, ReceivingPhase.PROOF
_OPEN, _CLOSED = ReceivingPhase.OPEN, ReceivingPhase.CLOSED


def nonce() -> bytes:
    return os.urandom(NONCE)


def proof(secret: str, role: bytes, first: bytes, second: bytes) -> bytes:
    """HMAC-SHA256 over a role and both nonces: a proof for this handshake only."""
    return hmac.new(secret.encode(), role + b"|" + first + b"|" + second, hashlib.sha256).digest()


def answer_frame(received: Followed) -> bytes:
    if isinstance(received, Applied):
        return b"a%d" % received.horizon
    return b"n%d" % received.expected


def request_head(host: str) -> bytes:
    """The HTTP request that asks a peer's front for the stream."""
    return (f"GET {PATH} HTTP/1.1\r\nHost: {host}\r\nUpgrade: pushup-peer\r\n"
            "Connection: Upgrade\r\n\r\n").encode()


class Frames(Int32StringReceiver):
    """Int32 frames, each sent at once when nothing is queued before it
    (``write_now``): an answer leaves in the turn its batch arrived, not on
    the reactor's next, which is most of a publish's wait for its peer."""

    MAX_LENGTH = PEER_BODY_LIMIT

    def sendString(self, string: bytes) -> None:  # Twisted's name
        self.send_frame(string)

    def send_frame(self, string: bytes) -> bool:
        """Send one frame; True when the socket took all of it (and so every
        frame before it) at once, False when some of it waits in Twisted."""
        return write_now(self.transport, self.framed(string))

    def framed(self, string: bytes) -> bytes:
        if len(string) >= 2 ** (8 * self.prefixLength):
            raise StringTooLongError(f"a frame of {len(string)} bytes")
        return struct.pack(self.structFormat, len(string)) + string


class Receiver(Protocol):
    """What the receiving end needs of its node (the ``Mesh``)."""

    secret: str
    refused: int
    clock: IReactorTime

    def receive(self, batch: Batch) -> Followed: ...

    def relay(self, payload: bytes) -> None: ...


class PeerStream(Frames):
    """A peer's stream into this node: handshake, then batches in, answers out.

    Nothing is applied before the dialer has proven it holds the secret; a
    bad or replayed proof, any frame out of turn or too long (before the
    handshake, longer than ``HANDSHAKE_FRAME``), or a batch the node refuses
    (malformed, or not the sender's to send: ``Mesh.receive``) is counted
    in the node's ``refused`` and closes the connection. Each batch is
    answered once, in order; a batch the node cannot take now (catching up)
    is answered ``e`` and the connection closes (the dialer retries).
    Its ``phase`` moves by :mod:`pushup.backplane.mesh.phases`'s table only.
    """

    MAX_LENGTH = HANDSHAKE_FRAME  # PEER_BODY_LIMIT once the dialer has proven itself

    def __init__(self, node: Receiver) -> None:
        self.node = node
        self.phase = _HELLO
        self._nonce_c = b""
        self._nonce_s = b""
        self.from_node = True  # from another node (TCP), not a sibling worker (Unix)
        self._heard = 0.0  # when the last frame came
        self._timer: IDelayedCall | None = None
        # Answers to the batches of one read, sent together once it is done.
        self._answers: list[bytes] | None = None

    def connectionMade(self) -> None:  # Twisted's name
        assert self.transport is not None
        self.from_node = not isinstance(self.transport.getHost(), UNIXAddress)
        self._heard = self.node.clock.seconds()
        self._timer = self.node.clock.callLater(HANDSHAKE_TIMEOUT, self._check)

    def _move(self, event: ReceivingEvent) -> None:
        self.phase = receiving_after(self.phase, event)

    def _check(self) -> None:
        """Close a stream still unproven, or silent for too long."""
        self._timer = None
        if self.phase is _CLOSED:
            return
        if self.phase is not _OPEN:
            self._close(b"eno handshake in time")
            return
        quiet = self.node.clock.seconds() - self._heard
        if quiet >= IDLE_TIMEOUT:
            self._close(b"eidle for too long")
        else:
            self._timer = self.node.clock.callLater(IDLE_TIMEOUT - quiet, self._check)

    def connectionLost(self, reason: object = None) -> None:  # Twisted's name
        self._move(ReceivingEvent.LOST)
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def dataReceived(self, data: bytes) -> None:  # Twisted's name
        """Frames in, then their answers out in one write: a dialer that sent
        several batches while we were busy reads one answer per read of ours,
        not one per batch."""
        if self.phase is _CLOSED:
            return  # refused: what still comes is read into nothing
        self._answers = []
        try:
            super().dataReceived(data)  # type: ignore[no-untyped-call]
        finally:
            self._flush_answers()

    def _answer(self, frame: bytes) -> None:
        if self._answers is None:
            self.sendString(frame)
        else:
            self._answers.append(self.framed(frame))

    def _flush_answers(self) -> None:
        answers, self._answers = self._answers, None
        if answers and self.transport is not None:
            write_now(self.transport, b"".join(answers))

    def stringReceived(self, frame: bytes) -> None:  # Twisted's name
        kind, payload = frame[:1], frame[1:]
        self._heard = self.node.clock.seconds()
        if self.phase is _OPEN and kind == b"b":
            try:
                received = self.node.receive(unpack_batch(payload))
            except BadRequest as e:  # malformed, or not the sender's to send
                self._refuse(f"{e}")
                return
            except PushUpError as e:  # catching up: the dialer retries
                self._close(b"e" + str(e).encode())
                return
            self._answer(answer_frame(received))
            if self.from_node and isinstance(received, Applied):
                self.node.relay(payload)
        elif self.phase is _OPEN and kind == b"r":
            try:  # a hole, or not ready yet: repair brings it later
                self.node.receive(unpack_batch(payload))
            except BadRequest as e:
                self._refuse(f"{e}")
                return
            except PushUpError as e:
                log.debug("a relayed batch was not applied: {e}", e=e)
            self._answer(b"r")
        elif self.phase is _HELLO and kind == b"h" and len(payload) == NONCE:
            self._nonce_c, self._nonce_s = payload, nonce()
            self._move(ReceivingEvent.HELLO)
            self.sendString(b"c" + self._nonce_s
                            + proof(self.node.secret, b"server", self._nonce_c, self._nonce_s))
        elif (self.phase is _PROOF and kind == b"p" and hmac.compare_digest(
                payload, proof(self.node.secret, b"client", self._nonce_s, self._nonce_c))):
            self._move(ReceivingEvent.PROVEN)
            self.MAX_LENGTH = PEER_BODY_LIMIT
        elif self.phase is not _CLOSED:
            self.node.refused += 1
            log.warn("a peer stream was refused: {kind!r} while {state}",
                     kind=kind, state=self.phase.value)
            self._close(b"erefused")

    def _refuse(self, why: str) -> None:
        """A protocol violation: counted, and the connection closed."""
        self.node.refused += 1
        log.warn("a peer stream was refused: {why}", why=why)
        self._close(b"e" + why.encode())

    def _close(self, frame: bytes) -> None:
        self._move(ReceivingEvent.CLOSE)
        self._flush_answers()  # what was answered goes before the reason
        self.sendString(frame[:1024])  # a reason, not a payload (ANSWER_LIMIT)
        if self.transport is not None:
            self.transport.loseConnection()

    def lengthLimitExceeded(self, length: int) -> None:
        self._unprocessed = b""  # what Twisted kept of it: not held until the close
        if self.phase is not _CLOSED:  # (refused already: what follows is not read)
            self._refuse(f"a frame of {length} bytes is too long while {self.phase.value}")
