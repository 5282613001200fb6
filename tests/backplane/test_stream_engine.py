"""pushup/backplane/stream_engine.py: the seam between a node's Durable Streams
and its cluster, driven through the HTTP endpoints with a recording engine
(what every engine is handed, and that the endpoints branch on nothing but
what the engine says) and the local engine as a value."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.internet import defer
from twisted.internet.task import Clock

from pushup.backplane import Alone, Relayed
from pushup.backplane.stream_engine import LocalStreams, StreamRequest
from pushup.config import Config
from pushup.core.errors import Unauthorized
from pushup.core.model import Origin
from pushup.core.service import Service
from pushup.core.store import Retention, Store
from pushup.http.exchange import Pending, Request, Response
from pushup.http.handlers import Handlers
from pushup.http.streams import new_streams

START = 1_763_800_000.0


class RecordingEngine:
    """An engine that records what it is handed, and answers as told."""

    def __init__(self, shared: bool = False, internal: bool = False,
                 answer: Callable[[Callable[[], object]], object] = lambda run: run()) -> None:
        self.shared = shared
        self._internal = internal
        self._answer = answer
        self.served: list[tuple[list[str], bytes]] = []
        self.drained = 0

    def internal(self, request: StreamRequest) -> bool:
        if request.headers.get(b"x-forged"):
            raise Unauthorized("a hop not signed with the cluster secret")
        return self._internal

    def serve(self, paths: Sequence[str], run: Callable[[], object],
              request: StreamRequest | None = None, client: object = None) -> object:
        assert request is not None
        self.served.append((list(paths), request.method))
        return self._answer(run)

    def drain(self) -> None:
        self.drained += 1


def handlers(engine: RecordingEngine, **config: object) -> Handlers:
    clock = Clock()
    clock.advance(START)
    settings = Config(node_id="s", **config)  # type: ignore[arg-type]
    service = Service(Store(Retention(10**9, 10**9, 100, 10**6), Origin("s", 1)), clock,
                      settings.max_timeout)
    return Handlers(service, settings, dict, lambda: (b"", b""), Alone(service),
                    streams=new_streams(settings), stream_engine=engine)


def ask(node: Handlers, method: bytes, path: bytes, body: bytes = b"",
        **headers: bytes) -> object:
    request = Request(method, path, b"", {k.replace("_", "-").encode(): v
                                          for k, v in headers.items()}, body)
    return node.handle(request, None)  # type: ignore[arg-type]


def test_the_local_engine_runs_the_decision_here_now():
    engine = LocalStreams()
    request = Request(b"GET", b"/v1/stream/s", b"", {})
    assert engine.shared is False and engine.internal(request) is False
    assert engine.serve(["/v1/stream/s"], lambda: "decided", request) == "decided"
    engine.drain()


def test_every_request_is_handed_to_the_engine_with_its_paths_a_fork_its_source_first():
    engine = RecordingEngine()
    node = handlers(engine)
    assert isinstance(ask(node, b"PUT", b"/v1/stream/a", content_type=b"text/plain"), Response)
    made = ask(node, b"PUT", b"/v1/stream/b", stream_forked_from=b"/v1/stream/a")
    assert isinstance(made, Response) and made.status == 201
    ask(node, b"GET", b"/v1/stream/b")
    assert engine.served == [(["/v1/stream/a"], b"PUT"),
                             (["/v1/stream/a", "/v1/stream/b"], b"PUT"),
                             (["/v1/stream/b"], b"GET")]
    node.streams.drain()
    assert engine.drained == 1


def test_another_nodes_answer_is_rendered_and_a_later_one_is_pending():
    relayed = Relayed(200, b"text/plain", ((b"Stream-Next-Offset", b"1_1"),), b"x")
    node = handlers(RecordingEngine(answer=lambda run: relayed))
    answer = ask(node, b"GET", b"/v1/stream/a")
    assert isinstance(answer, Response)
    assert (answer.status, answer.body, answer.content_type, answer.headers) == (
        200, b"x", b"text/plain", ((b"Stream-Next-Offset", b"1_1"),))
    later: defer.Deferred[object] = defer.Deferred()
    node = handlers(RecordingEngine(answer=lambda run: later))
    pending = ask(node, b"GET", b"/v1/stream/a")
    assert isinstance(pending, Pending)
    later.callback(relayed)
    assert pending.answer.result.body == b"x"  # type: ignore[attr-defined]


def test_only_an_engines_own_question_skips_the_clients_authorization():
    token = {"publish_token": "t"}
    refused = ask(handlers(RecordingEngine(), **token), b"PUT", b"/v1/stream/a")
    assert isinstance(refused, Response) and refused.status == 401
    engine = RecordingEngine(internal=True)
    allowed = ask(handlers(engine, **token), b"PUT", b"/v1/stream/a")
    assert isinstance(allowed, Response) and allowed.status == 201
    forged = ask(handlers(RecordingEngine(internal=True), **token), b"PUT", b"/v1/stream/a",
                 x_forged=b"1")
    assert isinstance(forged, Response) and forged.status == 401


def test_a_shared_engines_long_poll_is_held_through_a_deferred_and_expired_streams_are_its_own():
    engine = RecordingEngine(shared=True)
    node = handlers(engine)
    ask(node, b"PUT", b"/v1/stream/a", content_type=b"text/plain", stream_ttl=b"1")
    node.service.clock.advance(20)  # type: ignore[attr-defined]
    ask(node, b"HEAD", b"/v1/stream/b")
    assert node.streams.streams.at("/v1/stream/a") is not None  # not swept here
    request = Request(b"GET", b"/v1/stream/c", b"offset=-1&live=long-poll", {})
    ask(node, b"PUT", b"/v1/stream/c", content_type=b"text/plain")
    held = node.handle(request, None)  # type: ignore[arg-type]
    assert isinstance(held, Pending) and not held.answer.called
