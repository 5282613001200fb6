"""Where the mesh serves a Durable Streams request (pushup/backplane/mesh/stream_routes.py),
driven with a relay that records what it would send and answers as told."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from twisted.internet import defer, task

from pushup.backplane import Relayed
from pushup.backplane.mesh.owners import NODE, SERVE_HERE, TO_OWNER, WHERE, owner_of
from pushup.backplane.mesh.stream_routes import Placements, StreamRoutes
from pushup.core import errors
from pushup.http.exchange import Request

ME, B, C = "http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"
MEMBERS = sorted([ME, B, C])
HERE = "served here"


def owned_by(node: str, prefix: str = "s") -> str:
    """A stream path (``/v1/stream/...``) whose owner is ``node``."""
    for i in range(10_000):
        path = f"/v1/stream/{prefix}-{i}"
        if owner_of(path, MEMBERS) == node:
            return path
    raise AssertionError("no such path")


@dataclass
class Head:
    """The head of an answer (what ``Relay.send`` fires with)."""

    code: int
    node: str = ""

    @property
    def headers(self) -> Any:
        from twisted.web.http_headers import Headers

        return Headers({NODE: [self.node.encode()]} if self.node else {})


@dataclass
class RecordingRelay:
    clock: task.Clock = field(default_factory=task.Clock)
    handed: list[tuple[str, str, bytes, bytes]] = field(default_factory=list)
    sent: list[tuple[str, str, bytes, bytes]] = field(default_factory=list)
    answers: dict[tuple[str, str, bytes], defer.Deferred[Any]] = field(default_factory=dict)

    def hand_on(self, node: str, kind: str, request: Request, client: object,
                wait_s: float) -> defer.Deferred[Any]:
        self.handed.append((node, kind, request.method, request.path))
        return defer.succeed(Relayed(200, None, (), node.encode()))

    def send(self, node: str, kind: str, method: bytes, path: bytes, *_: Any, **__: Any) -> Any:
        self.sent.append((node, kind, method, path))
        return self.answers.pop((node, kind, path), defer.succeed(Head(404)))

    def drain(self) -> None:
        pass


class KeptPlacements:
    def __init__(self) -> None:
        self.kept: list[tuple[str, str | None]] = []

    def placed(self, path: str, node: str | None) -> None:
        self.kept.append((path, node))


def routes(holds: set[str] | None = None) -> tuple[StreamRoutes, RecordingRelay, KeptPlacements]:
    relay = RecordingRelay()
    kept = KeptPlacements()
    held = holds or set()
    return (StreamRoutes(ME, [B, C], "secret", relay, Placements({}, kept),  # type: ignore[arg-type]
                         lambda path: path in held, 120.0), relay, kept)


def request(method: bytes, path: str, **headers: str) -> Request:
    return Request(method, path.encode(), b"",
                   {name.replace("_", "-").encode(): value.encode()
                    for name, value in headers.items()})


def outcome(routed: object) -> object:
    if isinstance(routed, defer.Deferred):
        return routed.result
    return routed


def test_a_client_request_for_a_path_another_node_owns_is_handed_to_that_owner():
    r, relay, _ = routes()
    path = owned_by(B)
    answer = outcome(r.route(request(b"GET", path), path, None, lambda: HERE, None))
    assert relay.handed == [(B, TO_OWNER, b"GET", path.encode())]
    assert answer == Relayed(200, None, (), B.encode())


def test_a_request_for_a_path_this_node_owns_is_served_here():
    r, relay, _ = routes()
    path = owned_by(ME)
    assert r.route(request(b"POST", path), path, None, lambda: HERE, None) == HERE
    assert r.route(request(b"POST", path), path, None, lambda: HERE, TO_OWNER) == HERE
    assert relay.handed == []


def test_a_request_handed_on_to_a_node_that_does_not_own_the_path_is_503():
    r, relay, _ = routes()
    path = owned_by(B)
    with pytest.raises(errors.EngineUnavailable):
        r.route(request(b"GET", path), path, None, lambda: HERE, TO_OWNER)
    assert relay.handed == []


def test_a_fork_is_placed_on_its_sources_node_and_its_path_follows_it_there():
    r, relay, kept = routes()
    fork, source = owned_by(ME, "fork"), owned_by(B, "source")
    relay.answers[(B, WHERE, source.encode())] = defer.succeed(Head(204, C))  # placed on C
    put = request(b"PUT", fork, stream_forked_from=source)
    assert outcome(r.route(put, fork, None, lambda: HERE, None)) == Relayed(
        200, None, (), C.encode())
    assert kept.kept == [(fork, C)]
    assert relay.handed == [(C, SERVE_HERE, b"PUT", fork.encode())]
    outcome(r.route(request(b"GET", fork), fork, None, lambda: HERE, None))
    assert relay.handed[-1] == (C, SERVE_HERE, b"GET", fork.encode())
    # and the owner says where it is, to a node forking it in turn
    assert r.route(request(b"HEAD", fork), fork, None, lambda: HERE, WHERE) == Relayed(
        204, None, ((NODE, C.encode()),), b"")


def test_a_fork_of_a_source_here_is_made_here():
    r, relay, kept = routes()
    fork, source = owned_by(ME, "fork"), owned_by(ME, "source")
    put = request(b"PUT", fork, stream_forked_from=source)
    assert outcome(r.route(put, fork, None, lambda: HERE, None)) == HERE
    assert (kept.kept, relay.handed, relay.sent) == ([], [], [])


def test_requests_to_a_path_wait_while_a_fork_is_placed_there():
    r, relay, _ = routes()
    fork, source = owned_by(ME, "fork"), owned_by(B, "source")
    located: defer.Deferred[Any] = defer.Deferred()
    relay.answers[(B, WHERE, source.encode())] = located
    placing = r.route(request(b"PUT", fork, stream_forked_from=source), fork, None,
                      lambda: HERE, None)
    waiting = r.route(request(b"GET", fork), fork, None, lambda: HERE, None)
    assert isinstance(waiting, defer.Deferred) and not waiting.called
    located.callback(Head(204, B))
    assert [h[:3] for h in relay.handed] == [(B, SERVE_HERE, b"PUT"), (B, SERVE_HERE, b"GET")]
    assert outcome(placing) == outcome(waiting) == Relayed(200, None, (), B.encode())


def test_a_fork_made_again_moves_its_placement_only_once_nothing_is_left_at_the_old_one():
    r, relay, kept = routes()
    fork, source = owned_by(ME, "fork"), owned_by(ME, "source")
    r.placements.place(fork, C)
    relay.answers[(C, SERVE_HERE, fork.encode())] = defer.succeed(Head(410))
    put = request(b"PUT", fork, stream_forked_from=source)
    outcome(r.route(put, fork, None, lambda: HERE, None))
    assert relay.handed == [(C, SERVE_HERE, b"PUT", fork.encode())]  # C answers (409)
    relay.answers[(C, SERVE_HERE, fork.encode())] = defer.succeed(Head(404))
    assert outcome(r.route(put, fork, None, lambda: HERE, None)) == HERE
    assert kept.kept == [(fork, C), (fork, None)]


def test_only_a_signed_where_hop_is_the_engines_own_question_and_serve_routes_the_last_path():
    """The HTTP layer knows no hop: it asks the engine whether a request is
    a node's own (``internal``: no client's authorization) and hands it to
    ``serve``, which routes it as ``route`` does (moved from the HTTP layer's
    WHERE_HOP, which had to name the owners' WHERE alike)."""
    from pushup.backplane.mesh.owners import HOP, WHERE, hop_mark

    r, relay, _ = routes()
    path = owned_by(ME)
    now = relay.clock.seconds()
    where = request(b"HEAD", path)
    where.headers[HOP] = hop_mark("secret", WHERE, b"HEAD", path.encode(), now)
    to_owner = request(b"GET", path)
    to_owner.headers[HOP] = hop_mark("secret", TO_OWNER, b"GET", path.encode(), now)
    assert r.internal(where) is True
    assert r.internal(to_owner) is False and r.internal(request(b"GET", path)) is False
    forged = request(b"HEAD", path)
    forged.headers[HOP] = hop_mark("other", WHERE, b"HEAD", path.encode(), now)
    with pytest.raises(errors.Unauthorized):
        r.internal(forged)
    assert r.shared is False
    assert r.serve(["/v1/stream/source", path], lambda: HERE, request(b"GET", path)) == HERE
    elsewhere = owned_by(B)
    assert outcome(r.serve([elsewhere], lambda: HERE, request(b"GET", elsewhere))) == Relayed(
        200, None, (), B.encode())
    assert relay.handed == [(B, TO_OWNER, b"GET", elsewhere.encode())]
