"""In-memory nodes for the unit tests: a real ``Node`` on a ``task.Clock``, no sockets.

Each ``Conn`` is one connection through the node's real ``Front`` (so
``/stats`` counts it) into the real ``HTTPProtocol``, over a
``StringTransport``: we write raw HTTP bytes in and parse the raw response
bytes out. Time only moves with ``clock.advance``.
"""

from __future__ import annotations

import gc
import json
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure

from deploy.redis_cluster import RedisCluster
from deploy.redis_server import RedisServer
from pushup.config import Config
from pushup.ops.node import Node
from tests.contract import assert_error
from tests.sse_client import dechunk
from tests.toolkit import serve  # noqa: F401  (a fixture for every test)

# The nodes the suite starts get SIGINT as they would from a terminal, however
# the suite itself was started: a background job (`make test &`) inherits SIGINT
# ignored, and a node leaves an inherited SIG_IGN alone (README, Operations), so
# the Ctrl-C tests would test nothing. A Python handler is reset at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

START = 1_763_800_000.0  # a realistic Unix time for the clock to start at


@dataclass
class Response:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return None if values is None else ", ".join(values)

    @property
    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.body[:300]!r}>"


def parse_responses(raw: bytes, head_only: Callable[[int], bool] = lambda i: False,
                    ) -> tuple[list[Response], bytes]:
    """Complete HTTP responses in ``raw`` (Content-Length framed, or chunked: an
    event stream), and the rest."""
    out = []
    while b"\r\n\r\n" in raw:
        head, rest = raw.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split(" ", 2)
        status = int(status_line[1])
        headers: dict[str, list[str]] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.setdefault(name.strip().lower(), []).append(value.strip())
        if status == 100:
            raw = rest
            continue
        if "transfer-encoding" in headers:  # only an event stream is chunked
            assert headers["transfer-encoding"] == ["chunked"], headers
            assert "content-length" not in headers, headers
            assert headers["content-type"] == ["text/event-stream; charset=utf-8"], headers
            body, end = dechunk(rest)
            if end is None:
                break
            out.append(Response(status, headers, body))
            raw = rest[end:]
            continue
        length = int(headers.get("content-length", ["0"])[0])
        if head_only(len(out)) or status in (204, 304):
            length = 0
        if len(rest) < length:
            break
        out.append(Response(status, headers, rest[:length]))
        raw = rest[length:]
    return out, raw


class _Transport(StringTransport):
    """A StringTransport that can half-close, as a TCP transport can."""

    def loseWriteConnection(self) -> None:
        self.loseConnection()


class Conn:
    """One client connection to a node: write bytes, read responses."""

    def __init__(self, harness: Harness, kind: type[_Transport] | None = None) -> None:
        """``kind``: the client's transport (default ``_Transport``; a subclass
        for a client that behaves otherwise, e.g. never reads)."""
        self.harness = harness
        self.transport = (kind or _Transport)(
            peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        self.protocol = harness.node.front.buildProtocol(self.transport.getPeer())
        self.protocol.makeConnection(self.transport)
        self.lost = False
        self.sent: list[bytes] = []  # every chunk the client wrote
        self._heads: list[bool] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)
        self.protocol.dataReceived(data)
        # The reactor's next iteration: answers queued by this request (a
        # publish's fan-out starts after the publisher's own 201) go out now.
        self.harness.turn()
        self._settle()

    def request(self, method: str, path: str, body: bytes | str | Any = None,
                headers: dict[str, str] | None = None) -> None:
        if body is not None and not isinstance(body, bytes | str):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode("utf-8")
        lines = [f"{method} {path} HTTP/1.1"]
        if not any(h.lower() == "host" for h in headers or {}):
            lines.append("Host: pushup.test")  # HTTP/1.1 needs exactly one
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if body is not None and not any(h.lower() in ("content-length", "transfer-encoding")
                                        for h in headers or {}):
            lines.append(f"Content-Length: {len(body)}")
        self._heads.append(method == "HEAD")
        self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))

    def responses(self) -> list[Response]:
        found, _ = parse_responses(self.transport.value(),
                                   lambda i: i < len(self._heads) and self._heads[i])
        return found

    @property
    def response(self) -> Response | None:
        """The first response on this connection, or None while it is held."""
        found = self.responses()
        return found[0] if found else None

    def close(self, reason: type[Exception] = ConnectionLost) -> None:
        """The client went away (or the server's close completed)."""
        if not self.lost:
            self.lost = True
            self.protocol.connectionLost(Failure(reason()))

    def _settle(self) -> None:
        # A StringTransport only records loseConnection; complete it as the
        # reactor would once the output is flushed.
        if self.transport.disconnecting and not self.lost:
            self.close(ConnectionDone)


@dataclass
class Harness:
    """A node on a Clock plus helpers to talk HTTP to it."""

    config: Config
    clock: Clock = field(default_factory=Clock)
    conns: list[Conn] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.clock.seconds() == 0:  # a clock given already set is kept (restarts)
            self.clock.advance(START)
        self.node = Node(self.config, reactor=self.clock)
        assert self.node.front.clock is self.clock  # idle timeouts run on our clock too

    @property
    def service(self) -> Any:
        return self.node.service

    def connect(self, kind: type[_Transport] | None = None) -> Conn:
        conn = Conn(self, kind)
        self.conns.append(conn)
        return conn

    def open(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> Conn:
        """Send one request on a new connection and leave it open (e.g. held)."""
        conn = self.connect()
        conn.request(method, path, body, headers)
        return conn

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> Response:
        """One request on a new connection, answered at once; then hang up."""
        conn = self.open(method, path, body, headers)
        response = conn.response
        assert response is not None, f"{method} {path} was not answered at once"
        conn.close(ConnectionDone)
        return response

    def get(self, path: str, **kw: Any) -> Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Response:
        return self.request("POST", path, body, **kw)

    def publish(self, channels: list[str] | str, data: Any = None, **kw: Any) -> Response:
        if isinstance(channels, str):
            channels = [channels]
        return self.post("/publish", {"channels": channels, "data": data}, **kw)

    def subscribe(self, channels: str, **params: Any) -> Conn:
        """A subscribe on its own connection (maybe held; see ``conn.response``)."""
        query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
        path = f"/subscribe?channels={quote(channels, safe=',')}" + (f"&{query}" if query else "")
        return self.open("GET", path)

    def stats(self) -> dict[str, Any]:
        response = self.get("/stats")
        assert response.status == 200, response
        return response.json  # type: ignore[no-any-return]

    def pending_times(self) -> list[float]:
        """When each scheduled call on the clock is due."""
        return sorted(call.getTime() for call in self.clock.getDelayedCalls())

    def turn(self) -> int:
        """Run the calls due now, as one reactor iteration would; returns how many.

        ``Clock.advance(0)`` also runs calls scheduled *while* it runs (a
        ``callLater(0)`` made by a due call), so it cannot show that work was
        split across turns. A real reactor runs those on its next iteration;
        this does the same.
        """
        now = self.clock.seconds()
        due = [c for c in self.clock.getDelayedCalls() if c.getTime() <= now]
        for call in due:
            if call.active():
                self.clock.calls.remove(call)
                call.called = 1
                call.func(*call.args, **call.kw)
        return len(due)

    def answered(self, conns: list[Conn]) -> int:
        return sum(1 for c in conns if c.transport.value())


# Tests that use the whole machine (CPU cgroups, figures of CPU, network namespaces,
# apt, make in the checkout) run one after another on one worker under `make
# test`'s pytest-xdist workers (--dist loadgroup); the rest share them all.
MACHINE = ("tests/loadtest/", "tests/cluster/test_launcher.py",
           "tests/cluster/test_faults.py",  # network namespaces, as the faults bench's
           "tests/test_system_packages.py", "tests/test_make_targets.py")


@pytest.hookimpl(tryfirst=True)  # before xdist names each item's group in its node id
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(MACHINE):
            item.add_marker(pytest.mark.xdist_group("machine"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Locust imports gevent, which monkey-patches socket and threading in the
    importing process: the cluster and end-to-end tests (threads and blocking
    sockets) would then misbehave. Locust runs only in subprocesses."""
    import socket

    if socket.socket.__module__ != "socket":
        raise pytest.UsageError("a test module imported locust/gevent into the pytest "
                                "process; run Locust in a subprocess instead")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if call.when == "call":
        item.call_failed = outcome.get_result().failed  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def no_logged_failures(request: pytest.FixtureRequest) -> Iterator[list[dict[str, Any]]]:
    """Fail a test in which anything logged a failure (e.g. a 500's traceback).

    A test that already failed is not failed twice for it.
    """
    failures: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if "log_failure" in event:
            failures.append(event)

    globalLogPublisher.addObserver(observe)
    yield failures
    globalLogPublisher.removeObserver(observe)
    if getattr(request.node, "call_failed", False):
        return
    assert not failures, [e["log_failure"].getTraceback() for e in failures]


@pytest.fixture
def make_node() -> Iterator[Callable[..., Harness]]:
    """``make_node(**config)``: a fresh in-memory node with those settings
    (``clock=``: on that clock, as it reads, e.g. to restart a node)."""
    made: list[Harness] = []

    def make(clock: Clock | None = None, **settings: Any) -> Harness:
        settings.setdefault("node_id", "test")
        harness = Harness(Config(**settings), clock=clock or Clock())
        made.append(harness)
        return harness

    yield make
    for harness in made:
        for conn in harness.conns:
            conn.close(ConnectionDone)


@pytest.fixture
def node(make_node: Callable[..., Harness]) -> Harness:
    return make_node()


@pytest.fixture
def check_error() -> Callable[[Response, int, str | None], dict[str, str]]:
    return assert_error


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh ``redis-server`` of this test's own (see deploy/redis_server.py), stopped
    by PID at teardown whatever the test did to it."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_cluster() -> Iterator[RedisCluster]:
    """A fresh Redis Cluster of this test's own: 3 primaries with one replica each
    (see deploy/redis_cluster.py), every node stopped by PID at teardown."""
    cluster = RedisCluster(primaries=3, replicas=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The garbage collector off for the test, so what stays alive is what
    something still refers to, not what no collection has freed yet."""
    gc.collect()  # what earlier tests left, so the counts start from the living
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
