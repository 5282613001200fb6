"""What the replication stream refuses: each refusal closes the connection,
is counted (``peer_refused`` in /stats) and leaves nothing applied.

A stranger's first frame longer than a handshake's; a batch that is not the
sender's to send or that would poison what the node serves (its own origin,
an origin or sequence no cursor can hold, data that is not JSON); an answer
that claims more than was ever published. Driven with bytes on
StringTransports, as a peer would send them."""

from __future__ import annotations

import struct

import pytest
from twisted.internet.testing import StringTransport

from pushup.backplane.mesh.mesh import Mesh
from pushup.backplane.mesh.replication import PeerStream, proof, request_head
from pushup.backplane.mesh.wire import Batch, pack_batch
from pushup.config import Config
from pushup.core.model import Message
from pushup.ops.node import Node
from tests.backplane.mesh.pipe import frames
from tests.backplane.mesh.test_replication import (
    NONCE_C,
    _clock,
    _cluster,
    _held,
    _linked_up,
    _published,
    frame,
)


def _opened(receiver: Mesh) -> tuple[PeerStream, StringTransport]:
    """A stream into ``receiver`` past its handshake (the dialer knows the secret)."""
    stream, wire = PeerStream(receiver), StringTransport()
    stream.makeConnection(wire)
    stream.dataReceived(frame(b"h" + NONCE_C))
    nonce_s = frames(wire.value())[0][1:17]
    stream.dataReceived(frame(b"p" + proof("s", b"client", nonce_s, NONCE_C)))
    wire.clear()
    return stream, wire


def test_a_stranger_announcing_a_long_first_frame_is_closed_at_its_length_prefix():
    """Before the handshake only a hello (17 bytes) or a proof (33) may come:
    a longer frame is refused as soon as its length is read, and what comes
    with it is not kept (a batch-sized frame would be buffered whole)."""
    clock = _clock()
    node = Node(Config(node_id="b", cluster_secret="s", peer=("http://p",)), clock)
    node.mesh.ready = True
    transport = StringTransport()
    http = node.front.buildProtocol(None)
    http.makeConnection(transport)
    http.dataReceived(request_head("b"))
    assert transport.value().startswith(b"HTTP/1.1 101 ")
    transport.clear()
    http.dataReceived(struct.pack("!I", 16 * 1024 * 1024 - 1) + b"x" * 65536)
    assert transport.disconnecting
    assert frames(transport.value())[-1].startswith(b"ea frame of 16777215 bytes")
    assert node.mesh.refused == 1
    http.dataReceived(b"x" * 65536)  # read before the close took effect
    assert http._upgraded_to._unprocessed == b""


def _message(origin: str, seq: int = 1, data: bytes = b'"hi"') -> Message:
    return Message(origin, seq, 1_700_000_000_000_000 + seq, ("x",), data)


@pytest.mark.parametrize("origin, seq, data", [
    ("b.0", 1, b'"forged"'),  # the receiver's own origin: only it writes there
    ("bad origin!:x", 1, b'"hi"'),  # no cursor can name it: every cursor would be refused
    ("a.0", 10**18, b'"hi"'),  # 19 digits: no cursor can hold it
    ("a.0", 1, b'{"x":'),  # not JSON: every answer on its channel would not be either
], ids=["own origin", "origin no cursor can name", "sequence no cursor can hold",
        "data that is not JSON"])
def test_a_batch_that_would_poison_what_the_node_serves_is_refused_and_counted(
        origin, seq, data):
    clock = _clock()
    receiver = _cluster(clock, name="b")  # its origin: b.0
    receiver.ready = True
    stream, wire = _opened(receiver)
    batch = Batch(origin, seq != 1, (_message(origin, seq, data),), ())
    stream.dataReceived(frame(b"b" + pack_batch(batch)))
    [answer] = frames(wire.value())
    assert answer[:1] == b"e" and wire.disconnecting and receiver.refused == 1
    assert receiver.store.message_count == 0 and _held(receiver.store) == []
    assert receiver.stats()["peer_refused"] == 1


@pytest.mark.parametrize("answer", [b"a1000000000", b"n1000000001"])
def test_an_answer_past_what_was_ever_published_closes_the_link_and_counts_nothing_held(
        answer):
    """The peer was sent one message; an ack (or a hole) far past it cannot be
    true, and a 201 must not count it as held."""
    clock = _clock()
    sender, receiver, pipe, link = _linked_up(clock)
    _published(sender, clock, 1)
    link.poke()
    pipe.client.dataReceived(frame(answer))  # the peer's answer, not what it holds
    assert link.holds == 0 and link.violations == 1
    assert pipe.ct.disconnecting


def test_a_peer_sending_the_dialer_a_frame_longer_than_any_answer_is_dropped_at_its_prefix():
    """A dialer reads a challenge and short answers, never a batch: whoever
    answers at the peer's address cannot make it buffer a batch-sized frame."""
    clock = _clock()
    sender, receiver, pipe, link = _linked_up(clock)
    pipe.client.dataReceived(struct.pack("!I", 16 * 1024 * 1024 - 1) + b"x" * 65536)
    assert pipe.ct.disconnecting
    assert pipe.client._unprocessed == b""
