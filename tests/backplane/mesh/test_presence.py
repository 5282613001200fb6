"""Presence across the mesh (pushup.backplane.mesh.presence) on task.Clock: two
nodes' replicators wired by links that call each other's receive, as the
signed POST /peer/presence does. (Real nodes: tests/cluster/test_presence.py.)"""
from __future__ import annotations

import json

import pytest
from twisted.internet import defer, task

from pushup.backplane.mesh.presence import DEAD_S, TICK_S, MeshPresence
from pushup.core.errors import BadRequest
from pushup.core.presence import Presence


class Desk:
    """What the replicator needs of the presence desk, recording what it is told."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.local = Presence(window=5_000_000)
        self.local_listeners: list = []
        self.told: list[tuple] = []

    def hold(self, key: str, user: str, channel: str) -> None:
        joins = self.local.hold(key, user, None, (channel,))
        changes = self.local.take_counts() + joins  # as the desk says them
        for listener in self.local_listeners:
            listener(changes)

    def node_changes(self, node, changes):
        self.told.append(("changes", node, changes))

    def node_state(self, node, state):
        self.told.append(("state", node, state))

    def node_gone(self, node):
        self.told.append(("gone", node))


class Link:
    """To the peer: its receive, now; ``down`` refuses as a dead peer does."""

    url = "http://peer"

    def __init__(self) -> None:
        self.peer: MeshPresence | None = None
        self.down = False
        self.sent: list[dict] = []

    def request(self, method, path, body=b""):
        if self.down:
            return defer.fail(ConnectionRefusedError())
        self.sent.append(json.loads(body))
        assert self.peer is not None
        answer = self.peer.receive(body)
        return defer.succeed((answer.status, answer.body))


def pair():
    clock = task.Clock()
    a, b = Desk("n1.a"), Desk("n2.b")
    to_b, to_a = Link(), Link()
    ma, mb = MeshPresence(a, [to_b], clock, "n1.a"), MeshPresence(b, [to_a], clock, "n2.b")
    to_b.peer, to_a.peer = mb, ma
    ma.start()
    mb.start()
    return clock, a, b, to_b, ma, mb


def test_a_peer_gets_the_whole_state_first_then_the_changes():
    clock, a, b, to_b, _, _ = pair()
    a.hold("k1", "ann", "room")
    clock.advance(TICK_S)
    assert b.told[0] == ("state", "n1.a", {"room": (1, {"ann": None})})
    a.hold("k2", "bob", "room")
    clock.advance(TICK_S)
    kind, node, changes = b.told[-1]
    assert (kind, node) == ("changes", "n1.a")
    assert [type(c).__name__ for c in changes] == ["Count", "Join"]
    assert [m.get("seq") for m in to_b.sent] == [1, 2]


def test_a_lost_message_makes_the_peer_ask_for_the_state_again():
    clock, a, b, to_b, _, mb = pair()
    clock.advance(TICK_S)
    to_b.down = True
    a.hold("k1", "ann", "room")  # this change never reaches b
    clock.advance(TICK_S)
    to_b.down = False
    clock.advance(TICK_S)
    assert b.told[-1] == ("state", "n1.a", {"room": (1, {"ann": None})})
    # a delta out of order is refused with 409: the sender starts again
    body = json.dumps({"node": "n1.a", "boot": "n1.a", "seq": 99, "changes": []}).encode()
    assert mb.receive(body).status == 409


def test_a_peer_not_heard_from_is_gone_once():
    clock, a, b, to_b, ma, _ = pair()
    clock.advance(TICK_S)
    ma.stop()  # n1 stops talking (killed)
    clock.pump([TICK_S] * int(DEAD_S / TICK_S + 2))
    assert [t for t in b.told if t[0] == "gone"] == [("gone", "n1.a")]


def test_a_malformed_message_is_400():
    _, _, _, _, _, mb = pair()
    for body in (b"not json", b'{"node": "x"}',
                 json.dumps({"node": "x", "boot": "x", "seq": 1, "state": {"c": [1, 2]}}).encode(),
                 json.dumps({"node": "n2.b", "boot": "n2.b", "seq": 1, "state": {}}).encode()):
        with pytest.raises(BadRequest):
            mb.receive(body)


def test_a_node_that_stalled_does_not_take_its_peers_for_dead():
    clock, a, b, to_b, ma, mb = pair()
    clock.advance(TICK_S)
    ma.stop()  # a says nothing while b's loop is stalled...
    clock.advance(DEAD_S + 1)  # ...for seconds: b's next turn comes that late
    ma.start()
    clock.advance(TICK_S)
    assert [t for t in b.told if t[0] == "gone"] == []
