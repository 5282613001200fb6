"""pushup/backplane/mesh/stream_subscriptions.py on a task.Clock with a relay
of the test's own: a node that is not the home tells it its streams' news in
batches, one in flight, one entry a stream; a batch the home did not take
waits (merged under what changed since) and goes again after ``RETRY_S``; a
home that holds no subscription stops the telling until a backfill asks this
node's tails. (On real nodes: tests/cluster/test_stream_subscriptions_mesh.py.)"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import defer, task
from twisted.web.http_headers import Headers

from pushup.backplane.mesh.owners import SUBSCRIPTIONS
from pushup.backplane.mesh.stream_subscriptions import HEARD, HOME, RETRY_S, MeshSubscriptions
from pushup.core.stream_values import START, Position
from pushup.core.streams import Streams

ME, HOME_NODE = "http://b:1", "http://a:1"


class Answer:
    """An IResponse as far as readBody needs it."""

    def __init__(self, code: int, body: bytes) -> None:
        self.code = code
        self.phrase = b"OK"
        self.headers = Headers()
        self.body = body
        self.length = len(body)

    def deliverBody(self, protocol: Any) -> None:  # noqa: N802 (Twisted's name)
        from twisted.python.failure import Failure
        from twisted.web.client import ResponseDone

        protocol.dataReceived(self.body)
        protocol.connectionLost(Failure(ResponseDone()))


class Relay:
    """Records each send; the test answers them in turn."""

    def __init__(self) -> None:
        self.clock = task.Clock()
        self.sent: list[tuple[str, bytes, list[Any], defer.Deferred[Any]]] = []

    def send(self, node: str, kind: str, method: bytes, path: bytes, query: bytes = b"",
             fields: Any = None, body: bytes = b"", wait_s: float = 0.0) -> defer.Deferred[Any]:
        assert kind == SUBSCRIPTIONS
        d: defer.Deferred[Any] = defer.Deferred()
        self.sent.append((node, path, json.loads(body) if body else [], d))
        return d


class Routes:
    def __init__(self) -> None:
        self.me = ME
        self.members = [HOME_NODE, ME]
        self.relay = Relay()

    def owner(self, path: str) -> str:
        return HOME_NODE if path == HOME else ME

    def hop(self, request: Any) -> str:
        return SUBSCRIPTIONS


def told() -> tuple[MeshSubscriptions, Relay]:
    routes = Routes()
    mesh = MeshSubscriptions(routes, Streams(lambda: "u", 10**9), lambda: 0)  # type: ignore[arg-type]
    assert not mesh.is_home
    return mesh, routes.relay


def P(n: int) -> Position:
    return Position(n, n)


def test_changes_while_a_batch_is_in_flight_go_in_the_next_one_a_stream_once() -> None:
    mesh, relay = told()
    mesh.heard("/v1/stream/x", P(1))
    mesh.heard("/v1/stream/a", P(1), created=True)
    for n in (2, 3):
        mesh.heard("/v1/stream/a", P(n))
    mesh.gone("/v1/stream/b")
    assert [(node, path) for node, path, _, _ in relay.sent] == [(HOME_NODE, HEARD)]
    assert relay.sent[0][2] == [["/v1/stream/x", "heard", P(1).offset, False, START.offset]]
    relay.sent[0][3].callback(Answer(200, b'{"subscriptions":1}'))
    # made, then appended to twice: one entry, still "made" (from its start), at the last tail
    assert relay.sent[1][2] == [["/v1/stream/a", "heard", P(3).offset, True, START.offset],
                                ["/v1/stream/b", "gone"]]


def test_a_batch_the_home_did_not_take_goes_again_merged_under_newer_news() -> None:
    mesh, relay = told()
    mesh.heard("/v1/stream/a", P(1))
    mesh.heard("/v1/stream/c", P(1))
    mesh.heard("/v1/stream/a", P(2))  # while the first batch is under way
    relay.sent[0][3].errback(ConnectionRefusedError("the home is down"))
    assert len(relay.sent) == 1  # not at once: after RETRY_S
    relay.clock.advance(RETRY_S)
    assert sorted(relay.sent[1][2]) == [["/v1/stream/a", "heard", P(2).offset, False,
                                         START.offset],
                                        ["/v1/stream/c", "heard", P(1).offset, False,
                                         START.offset]]


def test_a_home_holding_no_subscription_stops_the_news_until_tails_are_asked() -> None:
    mesh, relay = told()
    mesh.heard("/v1/stream/a", P(1))
    relay.sent[0][3].callback(Answer(200, b'{"subscriptions":0}'))
    mesh.heard("/v1/stream/a", P(2))
    assert len(relay.sent) == 1  # nothing told: no subscription to wake
    asked = mesh.internal(_Request(b"GET", b"/v1/stream/__ds/_nodes/tails"), b"_nodes/tails")
    assert asked is not None and asked.status == 200
    mesh.heard("/v1/stream/a", P(3))
    assert len(relay.sent) == 2


class _Request:
    def __init__(self, method: bytes, path: bytes) -> None:
        self.method, self.path, self.query, self.body = method, path, b"", b""
        self.headers: dict[bytes, bytes] = {}
