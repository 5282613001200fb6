"""The replication stream: frames, its handshake, its window, its failures.

The receiving end is driven with bytes on a StringTransport; a link talks to
a peer's ``PeerStream`` through ``pipe.Pipe`` (nothing crosses until the test
says so)."""

from __future__ import annotations

import struct
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from pushup.backplane.mesh.mesh import Mesh
from pushup.backplane.mesh.outbound import WINDOW
from pushup.backplane.mesh.peers import RELAY_WINDOW, PeerLink
from pushup.backplane.mesh.replication import (
    HANDSHAKE_TIMEOUT,
    IDLE_TIMEOUT,
    PeerStream,
    proof,
    request_head,
)
from pushup.backplane.mesh.wire import backlog, pack_batch
from pushup.config import Config
from pushup.core.channels import ChannelOp
from pushup.core.cursor import Cursor
from pushup.core.model import Draft, Origin, Query
from pushup.core.service import Service
from pushup.core.store import Retention, Store
from pushup.ops.node import Node
from tests.backplane.mesh.pipe import Pipe, frames

S = 1_000_000
NONCE_C = b"c" * 16


def _store(name: str) -> Store:
    return Store(Retention(3600 * S, 3600 * S, 1000, 10**9), Origin(name, 0))


def _cluster(clock: Clock, name: str = "b", secret: str = "s") -> Mesh:
    return Mesh(Service(_store(name), clock, 120), Config(cluster_secret=secret), clock,
                   http=None)


def _clock() -> Clock:
    clock = Clock()
    clock.advance(1_700_000_000)
    return clock


def frame(payload: bytes) -> bytes:
    return struct.pack("!I", len(payload)) + payload


def _published(store: Store, clock: Clock, n: int, channel: str = "x") -> None:
    for i in range(n):
        store.publish([Draft((channel,), b"%d" % i)], int(clock.seconds() * S))


def _held(store: Store, channel: str = "x") -> list[bytes]:
    """The data of the messages ``store`` holds on ``channel``, in order."""
    result = store.query(Query((channel,), Cursor(()), None, 10_000))
    return [m.data_json for m in result.messages]


def _linked(clock: Clock, secret: str = "s", receiver_secret: str = "s"):
    sender = _store("a")
    receiver = _cluster(clock, secret=receiver_secret)
    pipe = Pipe(receiver)
    link = PeerLink("http://b", sender, secret, http=pipe, clock=clock, dial=pipe.dial)
    return sender, receiver, pipe, link


def _linked_up(clock: Clock):
    """``_linked``, started, its handshake done: the link is up."""
    sender, receiver, pipe, link = _linked(clock)
    link.start()
    clock.advance(0)
    pipe.deliver()
    assert link.state == "up"
    return sender, receiver, pipe, link


# -- frames split at every byte -------------------------------------------------


def test_the_upgrade_and_every_frame_read_one_byte_at_a_time_apply_once_in_order():
    """The HTTP front reads the stream request, switches the connection to the
    mesh's stream, and every byte after it (head, handshake, three batches and
    a channel op) arrives alone."""
    clock = _clock()
    node = Node(Config(node_id="b", cluster_secret="s", peer=("http://p",)), clock)
    node.mesh.ready = True
    transport = StringTransport()
    http = node.front.buildProtocol(None)
    transport.protocol = http
    http.makeConnection(transport)

    def feed(data: bytes) -> None:
        for i in range(len(data)):
            transport.protocol.dataReceived(data[i:i + 1])

    feed(request_head("b") + frame(b"h" + NONCE_C))
    head, _, rest = transport.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ") and isinstance(http._upgraded_to, PeerStream)
    [challenge] = frames(rest)
    nonce_s = challenge[1:17]
    assert challenge[17:] == proof("s", b"server", NONCE_C, nonce_s)
    transport.clear()
    sender = _store("a")
    _published(sender, clock, 5)
    stream = frame(b"p" + proof("s", b"client", nonce_s, NONCE_C))
    for after in (0, 2, 4):
        batch = backlog(sender, sender.origin_name, after, (sender.own_seq, sender.last_ts))
        batch = type(batch)(batch.origin, batch.first, batch.messages[:2], batch.ops)
        if after == 4:
            batch = type(batch)(batch.origin, batch.first, batch.messages,
                                (ChannelOp("delete", "gone", 5),))
        stream += frame(b"b" + pack_batch(batch))
    feed(stream)
    assert frames(transport.value()) == [b"a2", b"a4", b"a5"]
    assert _held(node.service.store) == [b"0", b"1", b"2", b"3", b"4"]
    assert node.mesh.refused == 0


def _upgraded(node: Node, clock: Clock) -> tuple[object, StringTransport]:
    """A connection to ``node``'s front, upgraded to the replication stream."""
    transport = StringTransport()
    http = node.front.buildProtocol(None)
    http.makeConnection(transport)
    http.dataReceived(request_head("b"))
    assert transport.value().startswith(b"HTTP/1.1 101 ")
    return http, transport


def _mesh_node(clock: Clock, **kw) -> Node:
    node = Node(Config(node_id="b", cluster_secret="s", peer=("http://p",), **kw), clock)
    node.mesh.ready = True
    return node


def test_an_upgraded_stream_counts_against_max_connections_until_it_closes():
    clock = _clock()
    node = _mesh_node(clock, max_connections=2)
    http, transport = _upgraded(node, clock)
    _upgraded(node, clock)
    assert node.service.counters.connections == 2
    refused = node.front.buildProtocol(None)  # the limit holds for streams too

    class HalfClosing(StringTransport):
        def loseWriteConnection(self) -> None:
            pass
    wire = HalfClosing()
    refused.makeConnection(wire)
    assert b" 503 " in wire.value().split(b"\r\n", 1)[0]
    http.connectionLost(None)
    assert node.service.counters.connections == 1


def test_a_stream_that_does_not_prove_itself_in_time_is_closed():
    clock = _clock()
    node = _mesh_node(clock)
    http, transport = _upgraded(node, clock)
    transport.clear()
    clock.advance(HANDSHAKE_TIMEOUT)
    assert frames(transport.value()) == [b"eno handshake in time"] and transport.disconnecting
    assert node.service.store.message_count == 0


def test_a_stream_silent_for_the_idle_timeout_is_closed_and_one_that_speaks_is_not():
    clock = _clock()
    node = _mesh_node(clock)
    http, transport = _upgraded(node, clock)
    http.dataReceived(frame(b"h" + NONCE_C))
    nonce_s = frames(transport.value().partition(b"\r\n\r\n")[2])[0][1:17]
    http.dataReceived(frame(b"p" + proof("s", b"client", nonce_s, NONCE_C)))
    sender = _store("a")
    for _ in range(3):  # a heartbeat (an empty batch) every 20 s keeps it open
        clock.advance(20)
        http.dataReceived(frame(b"b" + pack_batch(backlog(sender, sender.origin_name, 0, (0, 0)))))
    assert not transport.disconnecting
    transport.clear()
    clock.advance(IDLE_TIMEOUT)
    assert frames(transport.value()) == [b"eidle for too long"] and transport.disconnecting


def test_a_drain_leaves_peer_streams_open_until_the_peers_flushed_then_closes_them():
    clock = _clock()
    node = _mesh_node(clock)
    http, transport = _upgraded(node, clock)
    node.front.close_all(upgraded=False)
    assert not transport.disconnecting
    node.front.close_all()
    assert transport.disconnecting


def test_a_node_without_a_mesh_refuses_the_stream_request_as_an_unknown_path():
    """No engine mounts ``/peer/`` on a lone node: the request is a path it
    does not serve (404, as HAProxy's front answers it), never an upgrade."""
    node = Node(Config(node_id="b"), _clock())
    transport = StringTransport()
    http = node.front.buildProtocol(None)
    transport.protocol = http
    http.makeConnection(transport)
    http.dataReceived(request_head("b") + frame(b"h" + NONCE_C))
    assert transport.value().startswith(b"HTTP/1.1 404 ")
    assert transport.protocol is http


# -- the handshake -------------------------------------------------------------------


def test_a_link_with_another_secret_is_refused_and_nothing_is_applied():
    clock = _clock()
    sender, receiver, pipe, link = _linked(clock, secret="other")
    _published(sender, clock, 3)
    link.start()
    clock.advance(0)
    pipe.deliver()
    assert link.state == "refused" and receiver.refused == 1
    assert receiver.store.message_count == 0 and link.after == 0


def test_a_replayed_handshake_is_refused_and_nothing_is_applied():
    """What a good peer sent (hello, proof, a batch) replayed on a new
    connection: the new challenge has a fresh nonce, the old proof fails."""
    clock = _clock()
    receiver = _cluster(clock)
    sender = _store("a")
    _published(sender, clock, 2)
    first, wire = PeerStream(receiver), StringTransport()
    first.makeConnection(wire)
    recorded = frame(b"h" + NONCE_C)
    first.dataReceived(recorded)
    nonce_s = frames(wire.value())[0][1:17]
    recorded += frame(b"p" + proof("s", b"client", nonce_s, NONCE_C))
    batch = backlog(sender, sender.origin_name, 0, (2, sender.last_ts))
    recorded += frame(b"b" + pack_batch(batch))
    first.dataReceived(recorded[len(frame(b"h" + NONCE_C)):])
    assert frames(wire.value())[-1] == b"a2"  # the genuine connection: applied
    again = _cluster(clock)  # a node that never saw the genuine connection
    replay, wire2 = PeerStream(again), StringTransport()
    replay.makeConnection(wire2)
    replay.dataReceived(recorded)
    assert frames(wire2.value())[-1] == b"erefused" and wire2.disconnecting
    assert again.refused == 1 and again.store.message_count == 0
    assert not any(f[:1] in (b"a", b"n") for f in frames(wire2.value()))


# -- the window: a reconnect in the middle of it, a peer that stops reading -------


def test_a_reconnect_in_the_middle_of_a_window_loses_nothing_and_repeats_nothing():
    clock = _clock()
    sender, receiver, pipe, link = _linked_up(clock)
    link.outbound.cork = 0  # each turn's batch leaves with others in flight
    for i in range(4):  # four batches in flight, one per reactor turn
        _published(sender, clock, 3)
        if i == 3:
            link.add_op(ChannelOp("delete", "gone", sender.own_seq))
        link.poke()
        clock.advance(0)
    assert len(pipe.held) == 4 and len(link.outbound.in_flight) == 4
    # The peer reads the first two batches, answers them; the connection
    # breaks before the answers arrive.
    sent = pipe.ct.value()
    two = sum(4 + len(f) for f in frames(sent)[:2])
    pipe.server.dataReceived(sent[:two])
    assert receiver.store.horizon_of(sender.origin_name) == 6
    pipe.ct.clear()
    pipe.dead = True
    assert link.after == 0 and link.state == "connecting" and not link.outbound.in_flight
    pipe.dead = False
    clock.advance(0)  # the first failure after success: reconnect at once
    pipe.deliver()
    assert link.state == "up" and link.after == 12 and link.settled
    assert _held(receiver.store) == [b"%d" % (i % 3) for i in range(12)]
    assert receiver.store.message_count == 12


def test_a_peer_that_stops_reading_holds_a_window_at_most_and_is_down_after_the_timeout():
    clock = _clock()
    sender, receiver, pipe, link = _linked(clock)
    link.start()
    clock.advance(0)
    pipe.deliver()
    for _ in range(50):  # the peer reads nothing from now on
        _published(sender, clock, 10)
        link.poke()
        clock.advance(0)
    assert len(pipe.held) == WINDOW and len(link.outbound.in_flight) == WINDOW
    assert link.queued == 500 and link.state == "up"
    clock.advance(link.timeout)
    assert pipe.ct.disconnecting  # the link aborts the connection...
    pipe.notice()
    assert link.state == "down" and pipe.ct is None  # ...and calls the peer down
    assert link.after == 0 and not link.outbound.in_flight


def _five_held_then_the_peer_restarts_empty(clock: Clock) -> tuple[Any, Any, Any, Mesh]:
    """A link whose peer held 5 of our messages, then a new, empty process
    behind the same address: (sender, pipe, link, the new process)."""
    sender, receiver, pipe, link = _linked(clock)
    link.start()
    clock.advance(0)
    _published(sender, clock, 5)
    link.poke()
    clock.advance(0)
    pipe.deliver()
    assert link.after == 5 and receiver.store.message_count == 5
    pipe.dead = True
    pipe.receiver = fresh = _cluster(clock)
    pipe.dead = False
    return sender, pipe, link, fresh


def test_a_hole_with_batches_in_flight_rewinds_once_and_resends_everything_in_order(
        monkeypatch):
    """A peer that lost our history (a fresh node behind the same URL) answers
    each of three pipelined batches with a hole: the link rewinds once, to
    what it expects, ignores the answers to the other two, and resends."""
    monkeypatch.setattr("pushup.backplane.mesh.wire.BATCH", 2)
    clock = _clock()
    sender, pipe, link, fresh = _five_held_then_the_peer_restarts_empty(clock)
    _published(sender, clock, 6)
    clock.advance(0)  # reconnect at once
    posts = pipe.posts
    # The handshake; three batches out, a hole back for the first: the link
    # rewinds to 0 and resends at once (nothing in flight); the two other
    # holes answer batches sent before the rewind and are ignored.
    pipe.deliver()
    assert pipe.posts - posts == 3 + 6  # the three, then 11 messages again, two a batch
    assert link.after == 11 and link.settled and link.state == "up" and link.outbound.stale == 0
    assert _held(fresh.store) == [b"%d" % i for i in range(5)] + [b"%d" % i for i in range(6)]


def test_a_peer_restarted_empty_gets_everything_again_though_nothing_new_was_published():
    """The new process behind the peer's address holds none of us: its answer
    to the new connection's hello (an empty batch) says so, and the link
    resends from there, not from what the old process had acknowledged."""
    clock = _clock()
    _, pipe, link, fresh = _five_held_then_the_peer_restarts_empty(clock)
    clock.advance(0)  # reconnect at once
    pipe.deliver()
    assert _held(fresh.store) == [b"%d" % i for i in range(5)]
    assert link.after == 5 and link.settled and link.state == "up"


# -- --workers: what another node sends one worker reaches its siblings ------------


def _worker_with_sibling(clock: Clock):
    """Worker ``b`` of a node, its sibling ``c`` behind a Unix-socket pipe, and
    node ``a`` linked to ``b`` over TCP (as another machine reaches one worker)."""
    b = Mesh(Service(_store("b"), clock, 120), Config(cluster_secret="s"), clock,
                http=None, siblings=("http+unix://c",))
    c = _cluster(clock, name="c")
    to_c = Pipe(c, unix=True)
    b.siblings[0].dial = to_c.dial
    b.siblings[0].http = to_c
    b.ready = True
    a = _store("a")
    to_b = Pipe(b)
    link = PeerLink("http://b", a, "s", http=to_b, clock=clock, dial=to_b.dial)
    for one in (b.siblings[0], link):
        one.start()
    clock.advance(0)
    to_c.deliver()
    to_b.deliver()
    to_c.deliver()  # a's hello, relayed
    assert b.siblings[0].state == "up" and link.state == "up"
    assert b.siblings[0]._stream.relays == 0 and b.siblings[0].unrelayed == 0
    return a, b, c, link, to_b, to_c


def test_a_worker_relays_to_its_sibling_what_another_node_sent_it_in_order():
    clock = _clock()
    a, b, c, link, to_b, to_c = _worker_with_sibling(clock)
    for _ in range(3):
        _published(a, clock, 4)
        link.poke()
        clock.advance(0)
        to_b.deliver()
    assert link.after == 12
    assert [f[:1] for f in frames(to_c.ct.value())].count(b"r") >= 3
    to_c.deliver()
    assert _held(c.store) == [b"%d" % (i % 4) for i in range(12)]
    assert c.store.message_count == 12 and b.siblings[0]._stream.relays == 0


def test_what_a_sibling_sends_is_not_relayed_on():
    """A batch on a Unix socket came from a sibling, which sends its own to
    every sibling itself: relaying it would only repeat it."""
    clock = _clock()
    b = Mesh(Service(_store("b"), clock, 120), Config(cluster_secret="s"), clock,
                http=None, siblings=("http+unix://c",))
    b.ready = True
    relayed = []
    b.relay = relayed.append
    sibling = _store("d")
    pipe = Pipe(b, unix=True)
    link = PeerLink("http+unix://b", sibling, "s", http=pipe, clock=clock, dial=pipe.dial)
    link.start()
    _published(sibling, clock, 3)
    clock.advance(0)
    pipe.deliver()
    assert link.after == 3 and b.store.message_count == 3
    assert relayed == []


def test_relays_a_sibling_does_not_answer_stop_at_the_window_and_are_counted():
    clock = _clock()
    a, b, c, link, to_b, to_c = _worker_with_sibling(clock)
    for _ in range(RELAY_WINDOW + 10):
        _published(a, clock, 1)
        link.poke()
        clock.advance(0)
        to_b.deliver()  # the sibling reads nothing meanwhile
    assert link.after == RELAY_WINDOW + 10  # node a is answered all the same
    assert [f[:1] for f in frames(to_c.ct.value())].count(b"r") == RELAY_WINDOW
    assert b.siblings[0].unrelayed == 10
