"""The mesh in memory: Mesh.receive (in-order apply, holes, repeats, lost history, ops)
and when a publish is acknowledged (a fake wire into receiving Clusters)."""

import json

import pytest
from twisted.internet.defer import succeed
from twisted.internet.task import Clock

from pushup.backplane.mesh.mesh import REPAIR_EVERY, Mesh
from pushup.backplane.mesh.outbound import CORK
from pushup.backplane.mesh.wire import Batch, encode_repair, unpack_batch
from pushup.config import Config
from pushup.core.channels import ChannelOp
from pushup.core.cursor import Cursor
from pushup.core.follow import Applied, Hole
from pushup.core.hub import Waiter
from pushup.core.model import Draft, Message, Origin, Query
from pushup.core.service import Service
from pushup.core.store import Retention, Store
from pushup.http.exchange import Pending, Request, Response
from pushup.http.render import poll_body
from pushup.ops.node import Node
from tests.backplane.mesh.pipe import Pipe

S = 1_000_000
P = "peer.x"


class Held:
    def __init__(self):
        self.bodies = []

    def respond(self, delivery, hold=False):
        self.bodies.append(json.loads(poll_body(delivery)))
        return True


@pytest.fixture
def node():
    clock = Clock()
    clock.advance(1_700_000_000)
    store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("me", 0))
    service = Service(store, clock, 120)
    return Mesh(service, Config(cluster_secret="s"), clock, http=None)


def msg(seq, *channels):
    return Message(P, seq, 1_700_000_000 * S + seq, channels or ("c",), b"%d" % seq)


def test_a_batch_in_order_is_applied_and_answers_waiters(node):
    held = Held()
    waiter = node.service.subscribe(Query(("c",), Cursor(()), None, 100), 30, held)
    assert isinstance(waiter, Waiter)
    assert node.receive(Batch(P, False, (msg(1), msg(2)), ())) == Applied(2)
    assert held.bodies == []  # the peer gets its answer first
    node.clock.advance(0)
    assert [m["data"] for m in held.bodies[0]["messages"]] == [1, 2]


def test_a_hole_is_refused_with_the_sequence_expected(node):
    node.receive(Batch(P, False, (msg(1),), ()))
    assert node.receive(Batch(P, False, (msg(3), msg(4)), ())) == Hole(2)
    assert node.store.horizon_of(P) == 1 and node.store.message_count == 1


def test_a_repeated_batch_changes_nothing(node):
    node.receive(Batch(P, False, (msg(1), msg(2)), ()))
    assert node.receive(Batch(P, False, (msg(1), msg(2)), ())) == Applied(2)
    assert node.store.message_count == 2


def test_history_the_origin_no_longer_has_is_skipped_and_reported_as_a_gap(node):
    assert node.receive(Batch(P, True, (msg(5),), ())) == Applied(5)
    behind = node.store.query(Query(("c",), Cursor.of({P: 2}), None, 100))
    assert behind.gap and [m.seq for m in behind.messages] == [5]
    current = node.store.query(Query(("c",), Cursor.of({P: 4}), None, 100))
    assert not current.gap


def test_channel_ops_apply_in_the_origins_order(node):
    ops = (ChannelOp("create", "room", 0, 60 * S, 1_700_000_060 * S),
           ChannelOp("delete", "room", 1))
    received = node.receive(Batch(P, False, (msg(1, "room"), msg(2, "room")), ops))
    assert received == Applied(2)
    # created, got message 1, deleted after it; message 2 came after the delete
    channel = node.store.get("room")
    assert channel.count == 1 and [m.seq for run in channel.runs.values() for m in run] == [2]


def test_nothing_is_accepted_while_catching_up(node):
    node.ready = False
    with pytest.raises(Exception) as e:
        node.receive(Batch(P, False, (msg(1),), ()))
    assert e.value.status == 503 and e.value.code == "catching_up"


# -- when a publish is acknowledged (--publish-ack) ---------------------------

class _Answer:
    """What treq's Response offers a link: a code and its content."""

    def __init__(self, code: int, body: bytes) -> None:
        self.code, self._body = code, body

    def content(self):
        return succeed(self._body)


class Wire(Pipe):
    """A link's connection to a peer's Mesh, held by the test (see pipe.Pipe)."""


def _peer(name: str, clock: Clock, per_channel: int = 100) -> Mesh:
    store = Store(Retention(3600 * S, 3600 * S, per_channel, 10**9), Origin(name, 0))
    return Mesh(Service(store, clock, 120), Config(cluster_secret="s"), clock, http=None)


def mesh(peers: int = 1, **settings) -> tuple[Node, list[Wire]]:
    """Node "a" with ``peers`` peers behind held wires, started, links up."""
    clock = Clock()
    clock.advance(1_700_000_000)
    urls = tuple(f"http://p{i}" for i in range(peers))
    node = Node(Config(node_id="a", cluster_secret="s", peer=urls, **settings), clock)
    wires = [Wire(_peer(f"p{i}", clock)) for i in range(peers)]
    for link, wire in zip(node.mesh.links, wires, strict=True):
        link.http, link.dial = wire, wire.dial
    node.start()
    clock.advance(0)  # each link says hello (an empty batch)...
    for wire in wires:
        wire.deliver()  # ...and its peer answers: up
    assert all(link.state == "up" for link in node.mesh.links)
    return node, wires


def publish(node: Node, *data: int) -> Response | Pending:
    items = [{"channels": ["c"], "data": d} for d in data]
    body = json.dumps({"messages": items}).encode()
    return node.handlers.handle(Request(b"POST", b"/publish", b"", {}, body), None)


def answered(outcome: Response | Pending) -> Response | None:
    """The response, if there is one yet."""
    if isinstance(outcome, Response):
        return outcome
    got: list[Response] = []
    outcome.answer.addCallback(lambda r: got.append(r) or r)
    return got[0] if got else None


def test_a_publish_is_answered_201_only_once_a_peer_holds_it():
    node, [wire] = mesh()
    pending = publish(node, 1, 2)
    assert isinstance(pending, Pending) and answered(pending) is None
    assert len(wire.held) == 1 and answered(pending) is None  # sent, not confirmed yet
    wire.deliver()
    assert answered(pending).status == 201
    assert wire.receiver.store.horizon_of(node.service.store.origin_name) == 2


def test_an_idle_link_sends_a_publish_before_this_node_answers_its_own_subscribers():
    """The peers' subscribers should not wait for ours: on an idle link the
    batch leaves with the publish; the local fan-out runs on the next turn.
    On a busy link (a batch in flight) what follows waits for its answer
    and goes in one batch (peers.CORK)."""
    node, [wire] = mesh()
    held = Held()
    node.service.subscribe(Query(("c",), Cursor(()), None, 100), 30, held)
    hellos = wire.posts
    publish(node, 1)
    assert len(wire.held) == 1 and held.bodies == []
    publish(node, 2)
    publish(node, 3)
    node.reactor.advance(0)
    assert len(wire.held) == 1 and len(held.bodies) == 1  # the turn ended: still one
    wire.deliver()  # its answer lets the other two go, together, at the turn's end
    node.reactor.advance(0)
    wire.deliver()
    assert wire.receiver.store.message_count == 3 and wire.posts - hellos == 2


def test_an_answer_uncorks_the_link_at_the_turns_end_with_the_whole_turns_publishes():
    """The answer to the batch in flight lets what waits go, at the end of the
    turn that read it: a publish read later in that turn goes in the same
    batch rather than waiting behind it for another round trip."""
    node, [wire] = mesh()
    hellos = wire.posts
    publish(node, 1)  # in flight
    publish(node, 2)  # corked behind it
    node.reactor.advance(0)
    wire.deliver()  # the turn reads its answer...
    publish(node, 3)  # ...and then another publish
    assert wire.held == []
    node.reactor.advance(0)  # the turn ends
    [batch] = wire.held
    assert [m.seq for m in unpack_batch(batch[1:]).messages] == [2, 3]
    wire.deliver()
    assert wire.posts - hellos == 2 and wire.receiver.store.message_count == 3


def test_a_busy_link_sends_at_once_when_a_full_batch_waits():
    node, [wire] = mesh()
    publish(node, 1)
    for n in range(CORK):
        publish(node, 2 + n)
    node.reactor.advance(0)
    assert len(wire.held) == 2  # the one in flight, and CORK more without its answer


def test_with_publish_ack_local_the_201_comes_at_once():
    node, [wire] = mesh(publish_ack="local")
    answer = publish(node, 1)
    # answered before any peer holds it (the batch is on its way, unanswered)
    assert isinstance(answer, Response) and answer.status == 201 and len(wire.held) == 1
    assert wire.receiver.store.message_count == 0


def test_the_first_of_two_peers_to_hold_it_is_enough():
    node, [slow, fast] = mesh(peers=2)
    pending = publish(node, 1)
    node.reactor.advance(0)
    fast.deliver()
    assert answered(pending).status == 201 and len(slow.held) == 1


def test_publishes_waiting_together_are_answered_in_order_as_the_peer_confirms():
    node, [wire] = mesh()
    node.mesh.links[0].outbound.cork = 0  # the second batch leaves before the first's answer
    order: list[int] = []
    first = publish(node, 1)
    node.reactor.advance(0)  # the first batch is on the wire...
    rest = [publish(node, 2), publish(node, 3, 4)]
    for i, p in enumerate([first, *rest]):
        p.answer.addCallback(lambda r, i=i: order.append(i) or r)
    node.reactor.advance(0)  # ...and the other two follow it in one batch, unanswered
    assert order == [] and len(wire.held) == 2
    wire.deliver()  # both confirmed: answered in order
    assert order == [0, 1, 2] and all(answered(p).status == 201 for p in rest)


def test_no_peer_confirming_in_time_is_answered_202_and_the_message_still_travels():
    node, [wire] = mesh(publish_ack_timeout=2.0)
    pending = publish(node, 1)
    node.reactor.advance(1.9)
    assert answered(pending) is None
    node.reactor.advance(0.1)
    late = answered(pending)
    assert late.status == 202 and json.loads(late.body)["messages"][0]["id"].startswith("a.")
    assert node.stats()["unconfirmed"] == 1
    _, text = node.metrics()
    assert b"pushup_unconfirmed_total 1.0" in text and b"pushup_ack_waiting 0.0" in text
    wire.deliver()  # stored here all along: the peer still gets it
    assert wire.receiver.store.message_count == 1


def test_with_every_peer_down_a_publish_is_answered_202_at_once_not_after_the_timeout():
    node, [wire] = mesh(publish_ack_timeout=10.0)
    wire.dead = True
    pending = publish(node, 1)  # the link is still up: this one waits...
    started = node.reactor.seconds()
    for _ in range(20):
        node.reactor.advance(0.1)
        if answered(pending) is not None:
            break
    # ...until the link gives the peer up (DOWN_AFTER quick failures), not 10 s
    assert node.mesh.links[0].state == "down"
    assert answered(pending).status == 202 and node.reactor.seconds() - started < 2
    again = publish(node, 2)  # the state is known: no wait at all
    assert isinstance(again, Response) and again.status == 202


def test_a_peer_that_refuses_us_does_not_count():
    node, [good, refusing] = mesh(peers=2)
    refusing.status = 401
    pending = publish(node, 1)
    node.reactor.advance(0)
    assert node.mesh.links[1].state == "refused" and answered(pending) is None
    good.dead = True  # the only peer that counts goes down too (its connection drops)
    for _ in range(10):  # the link retries (backoff) before it calls the peer down
        node.reactor.advance(0.1)
    assert node.mesh.links[0].state == "down" and answered(pending).status == 202
    assert publish(node, 2).status == 202


def test_a_node_without_peers_acknowledges_at_once():
    clock = Clock()
    node = Node(Config(node_id="a", cluster_secret="s"), clock)  # the mesh, alone
    answer = publish(node, 1)
    assert isinstance(answer, Response) and answer.status == 201


def test_with_publish_ack_all_every_live_peer_must_hold_it_but_a_down_one_is_not_waited_for():
    node, [first, second] = mesh(peers=2, publish_ack="all")
    pending = publish(node, 1)
    node.reactor.advance(0)
    first.deliver()
    assert answered(pending) is None  # the second peer does not hold it yet
    second.deliver()
    assert answered(pending).status == 201
    second.dead = True
    pending = publish(node, 2)
    node.reactor.advance(0)
    first.deliver()
    assert node.mesh.links[1].state == "connecting" and answered(pending) is None
    for _ in range(10):  # the second peer is called down: the first one is enough now
        node.reactor.advance(0.1)
    assert node.mesh.links[1].state == "down" and answered(pending).status == 201


# -- repair: a third origin's messages, from a peer that holds them ----------------


def test_a_peer_answers_a_repair_with_what_it_holds_of_a_third_origin(node):
    # This node holds P's messages 1..3; the asker ("asker.x") holds P up to 1.
    node.receive(Batch(P, False, (msg(1), msg(2), msg(3)), ()))
    raw = node.repair(encode_repair("asker.x", {P: 1}))
    batch = unpack_batch(raw)
    assert batch.origin == P and [m.seq for m in batch.messages] == [2, 3]
    assert not batch.first
    # Nothing more to give: the asker holds all, and our own origin is not given.
    node.service.publish([Draft(("c",), b"0")])
    assert node.repair(encode_repair("asker.x", {P: 3})) is None


def test_a_repair_asked_for_some_origins_answers_only_those_and_the_unknown(node):
    node.receive(Batch(P, False, (msg(1), msg(2)), ()))
    assert node.repair(encode_repair("asker.x", {P: 0, "q.y": 0}, want=["q.y"])) is None
    batch = unpack_batch(node.repair(encode_repair("asker.x", {P: 0}, want=[P])))
    assert [m.seq for m in batch.messages] == [1, 2]
    batch = unpack_batch(node.repair(encode_repair("asker.x", {"q.y": 0}, want=["q.y"])))
    assert [m.seq for m in batch.messages] == [1, 2]  # P: the asker never heard of it


class _RepairingPeer(Wire):
    """A peer's HTTP side that answers repair requests, and keeps them."""

    def __init__(self, receiver):
        super().__init__(receiver)
        self.asked: list[dict] = []

    def request(self, method, url, data=None, headers=None, timeout=None, reactor=None):
        if not url.endswith("/peer/repair"):
            return super().request(method, url, data, headers, timeout, reactor)
        self.asked.append(json.loads(data))
        raw = self.receiver.repair(data)
        return succeed(_Answer(200, raw) if raw is not None else _Answer(204, b""))


def test_repair_asks_only_for_origins_that_did_not_move_since_its_last_round():
    """An origin whose own stream brings its messages is not fetched again
    from a peer that read them a moment sooner; one that stopped moving is."""
    node, [wire] = mesh()
    holder = _RepairingPeer(wire.receiver)
    node.mesh.links[0].http = holder
    q = "q.y"
    for seq in (1, 2):  # both origins reach the holder; this node lags on each
        holder.receiver.receive(Batch(P, False, (msg(seq),), ()))
        holder.receiver.receive(Batch(q, False, (Message(q, seq, 1_700_000_000 * S + seq,
                                                         ("c",), b"1"),), ()))
    node.mesh.receive(Batch(P, False, (msg(1),), ()))
    # The first round: nothing seen before, so all it knows is asked for, and
    # what it never heard of (q) comes too.
    node.reactor.advance(REPAIR_EVERY)
    assert holder.asked[0]["want"] == [P] and node.mesh.store.horizon_of(P) == 2
    assert node.mesh.store.horizon_of(q) == 2
    node.mesh.receive(Batch(P, False, (msg(2), msg(3)), ()))  # P moves here; q does not
    holder.receiver.receive(Batch(P, False, (msg(3), msg(4)), ()))
    node.reactor.advance(REPAIR_EVERY)
    assert holder.asked[-1]["want"] == [q] and node.mesh.store.horizon_of(P) == 3
    node.reactor.advance(REPAIR_EVERY)  # P stood still for a round: now it is asked for
    assert holder.asked[-1]["want"] == [P, q] and node.mesh.store.horizon_of(P) == 4


def test_a_repair_batch_applies_in_order_and_a_repeat_changes_nothing():
    clock = Clock()
    clock.advance(1_700_000_000)
    holder, asker = _peer("b", clock), _peer("c", clock)
    holder.receive(Batch(P, False, tuple(msg(i) for i in range(1, 6)), ()))
    asker.receive(Batch(P, False, (msg(1), msg(2)), ()))
    repaired = unpack_batch(holder.repair(encode_repair("c.0", asker.store.horizons())))
    assert asker.receive(repaired) == Applied(5)
    assert asker.receive(repaired) == Applied(5)
    assert asker.store.message_count == 5
    assert holder.repair(encode_repair("c.0", asker.store.horizons())) is None


def test_a_repair_of_history_the_holder_evicted_too_is_a_gap():
    clock = Clock()
    clock.advance(1_700_000_000)
    holder = _peer("b", clock, per_channel=2)
    holder.receive(Batch(P, False, tuple(msg(i) for i in range(1, 6)), ()))  # keeps 4, 5
    batch = unpack_batch(holder.repair(encode_repair("c.0", {P: 1})))
    assert batch.first and [m.seq for m in batch.messages] == [4, 5]


def test_traffic_never_dials_a_down_peer_only_its_own_backoff_timer_does():
    """Every batch from a live peer kicked every failing link to dial at once:
    under load a dead peer was dialled once per batch received. A peer that is
    down is dialled by its own backoff timer, whatever arrives or is published
    meanwhile, and once more when a node starts (a new origin's first batch)."""
    from pushup.backplane.mesh.peers import BACKOFF_MAX, JITTER

    node, [live, dead] = mesh(peers=2)
    link, clock = node.mesh.links[1], node.reactor
    assert node.mesh.receive(Batch(P, False, (), ())) == Applied(0)  # P, heard of
    dialled: list[float] = []

    def dial(protocol):
        dialled.append(clock.seconds())
        return dead.dial(protocol)

    link.dial = dial
    dead.dead = True  # SIGKILLed
    for _ in range(600):  # a minute, quiet: down, its backoff at the cap by now
        clock.advance(0.1)
        live.deliver()
    assert link.state == "down" and node.mesh.links[0].state == "up"
    before, started = len(dialled), clock.seconds()
    for seq in range(1, 2_001):  # 20 s of 100 batches a second in, 100 publishes out
        assert node.mesh.receive(Batch(P, False, (msg(seq),), ())) == Applied(seq)
        publish(node, seq)
        clock.advance(0.01)
        live.deliver()
    elapsed = clock.seconds() - started
    allowed = int(elapsed / ((1 - JITTER) * BACKOFF_MAX)) + 1
    assert len(dialled) - before <= allowed, (len(dialled) - before, allowed)
    assert link.state == "down"

    # A node starts (maybe that peer, restarted): its first batch, not the
    # next ones, has every failing link try at once.
    before = len(dialled)
    started = "p9.k"
    for seq in range(1, 101):
        message = Message(started, seq, 1_700_000_100 * S + seq, ("c",), b"%d" % seq)
        assert node.mesh.receive(Batch(started, False, (message,), ())) == Applied(seq)
        clock.advance(0)
    assert len(dialled) == before + 1 and link.state == "down"


def test_a_node_that_asks_for_a_snapshot_has_failing_links_try_at_once():
    """A node catching up as it starts asks for a snapshot before it has any
    batch to send: a link failing to reach it (it was not listening yet when
    this node dialled) tries at once, not at the end of a backoff of up to
    ``BACKOFF_MAX``, so the first publish after both start is held by a peer
    (201, not 202)."""
    node, [peer] = mesh(peers=1)
    link, clock = node.mesh.links[0], node.reactor
    dialled: list[float] = []

    def dial(protocol):
        dialled.append(clock.seconds())
        return peer.dial(protocol)

    link.dial = dial
    peer.dead = True  # not listening yet
    for _ in range(100):  # 10 s: its backoff grows towards the cap
        clock.advance(0.1)
    assert link.state == "down"
    peer.dead = False  # it listens now, and asks us for a snapshot as it starts
    before = len(dialled)
    node.mesh.snapshot()
    clock.advance(0)
    assert len(dialled) == before + 1
