"""Cluster.receive in memory: in-order apply, holes, repeats, lost history, ops."""

import json

import pytest
from twisted.internet.task import Clock

from pushup.backplane import Applied, ChannelOp, Hole
from pushup.cluster import Cluster
from pushup.config import Config
from pushup.cursor import Cursor
from pushup.hub import Waiter
from pushup.model import Message, Origin, Query
from pushup.replica import Batch
from pushup.service import Service
from pushup.store import Retention, Store

S = 1_000_000
P = "peer.x"


class Held:
    def __init__(self):
        self.bodies = []

    def respond(self, body, hold=False):
        self.bodies.append(json.loads(body))
        return True


@pytest.fixture
def node():
    clock = Clock()
    clock.advance(1_700_000_000)
    store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("me", 0))
    service = Service(store, clock, 120)
    return Cluster(service, Config(cluster_secret="s"), clock, http=None)


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
    assert node.store.horizon[P] == 1 and node.store.message_count == 1


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
