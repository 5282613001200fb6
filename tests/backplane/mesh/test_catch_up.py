"""Mesh.start in memory: whom a starting node waits for, and whom it does not.

The peers are a fake HTTP client on a ``task.Clock``: each URL answers with
a fixed status (or refuses the connection).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock

from pushup.backplane.mesh.mesh import CATCH_UP_TIMEOUT, Mesh
from pushup.backplane.mesh.wire import export_snapshot
from pushup.config import Config
from pushup.core.model import Draft, Origin
from pushup.core.service import Service
from pushup.core.store import Retention, Store

S = 1_000_000
REFUSED = -1  # the connection is refused: the peer is not running


class Response:
    def __init__(self, code: int, body: bytes) -> None:
        self.code = code
        self.body = body

    def content(self) -> defer.Deferred[bytes]:
        return defer.succeed(self.body)


class FakePeers:
    """``http.request`` as treq has it; ``answers`` maps a base URL to a status."""

    def __init__(self, answers: dict[str, int], snapshot: bytes = b"") -> None:
        self.answers = answers
        self.errors: dict[str, bytes] = {}  # a base URL -> its error body, if not the default
        self.snapshot = snapshot
        self.asked: list[str] = []

    def request(self, method: str, url: str, **kw: Any) -> defer.Deferred[Response]:
        base = url.split("/peer/")[0]
        self.asked.append(base)
        code = self.answers[base]
        if code == REFUSED:
            return defer.fail(ConnectionRefusedError())
        body = self.snapshot if code == 200 else self.errors.get(base, b'{"error": {}}')
        return defer.succeed(Response(code, body))


def make_cluster(answers: dict[str, int], snapshot: bytes = b"") -> tuple[Mesh, Clock]:
    clock = Clock()
    clock.advance(1_763_800_000)
    store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin("me", 0))
    config = Config(peer=tuple(answers), cluster_secret="s")
    return Mesh(Service(store, clock, 120), config, clock, FakePeers(answers, snapshot)), clock


def start(cluster: Mesh) -> list[object]:
    done: list[object] = []
    cluster.start().addBoth(done.append)
    return done


def states(cluster: Mesh) -> dict[str, str]:
    return {link.url: link.state for link in cluster.links}


def test_peers_that_refuse_us_or_catch_up_themselves_are_not_waited_for() -> None:
    cluster, clock = make_cluster({"http://wrong-secret": 401, "http://starting": 503,
                                   "http://not-running": REFUSED})
    done = start(cluster)
    assert done == [None] and cluster.ready  # at once: no clock time passed
    assert states(cluster)["http://wrong-secret"] == "refused"


def test_every_node_starting_together_resolves_at_once() -> None:
    cluster, _ = make_cluster({"http://a": 503, "http://b": 503})
    assert start(cluster) == [None] and cluster.ready


def test_a_refusing_peer_is_asked_once_then_left_to_its_link() -> None:
    cluster, clock = make_cluster({"http://wrong-secret": 401, "http://failing": 500})
    done = start(cluster)
    assert not done  # the 500 may be a node that will serve: it is asked again
    clock.advance(0.5)
    asked = cluster.links[0].http.asked  # type: ignore[attr-defined]
    assert asked.count("http://wrong-secret") == 1
    assert asked.count("http://failing") == 2
    clock.pump([0.5] * int(CATCH_UP_TIMEOUT * 2 + 2))
    assert done == [None] and cluster.ready


def test_a_serving_peer_gives_its_snapshot() -> None:
    source, _ = make_cluster({})
    source.service.publish([Draft(("c",), b"1")])
    cluster, _ = make_cluster({"http://wrong-secret": 401, "http://good": 200},
                              snapshot=export_snapshot(source.store))
    assert start(cluster) == [None]
    assert cluster.store.message_count == 1


def test_a_full_peer_is_waited_for_until_it_gives_its_snapshot() -> None:
    """A worker restarted beside a sibling at --max-connections (503 overloaded)
    must not start empty: that sibling holds the cache and will answer."""
    source, _ = make_cluster({})
    source.service.publish([Draft(("c",), b"1")])
    cluster, clock = make_cluster({"http://full": 503}, snapshot=export_snapshot(source.store))
    peers = cluster.links[0].http  # type: ignore[attr-defined]
    peers.errors["http://full"] = b'{"error":{"code":"overloaded","message":"too many"}}'
    done = start(cluster)
    assert not done and not cluster.ready
    peers.answers["http://full"] = 200  # a connection of its frees up
    clock.advance(0.5)
    assert done == [None] and cluster.store.message_count == 1
