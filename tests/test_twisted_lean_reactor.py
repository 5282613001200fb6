"""pushup/_twisted.py's ``LeanEPollReactor``: what it copies from Twisted is still
what Twisted does (the source it stands in for and the private names it reads
are pinned), and on real loopback sockets it reads, writes, logs errors and
disconnects as Twisted's epoll reactor does, without a log context per plain
event."""

from __future__ import annotations

import hashlib
import inspect
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from twisted.internet import epollreactor
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import globalLogPublisher
from twisted.python import log
from twisted.python.failure import Failure

from pushup._twisted import PINNED, LeanEPollReactor, pinned_sources

SOURCES: dict[str, Callable[..., Any]] = pinned_sources()


def digest(f: Callable[..., Any]) -> str:
    return hashlib.sha256(inspect.getsource(f).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_twisted_source_the_lean_reactor_copies_is_unchanged(name: str) -> None:
    assert digest(SOURCES[name]) == PINNED[name]


def test_the_private_names_it_reads_are_there() -> None:
    reactor = LeanEPollReactor()
    try:
        assert isinstance(reactor._selectables, dict)
        assert callable(reactor._poller.poll)
        assert list(inspect.signature(reactor._disconnectSelectable).parameters)[:3] == \
            ["selectable", "why", "isRead"]
        assert reactor.doIteration == reactor.doPoll  # the reactor's loop calls ours
        assert epollreactor.EPollReactor._POLL_IN == 1  # EPOLLIN: our plain read event
    finally:
        reactor._poller.close()


class Recorder(Protocol):
    def __init__(self, fail_on: bytes | None = None) -> None:
        self.data = b""
        self.lost: Failure | None = None
        self.fail_on = fail_on

    def dataReceived(self, data: bytes) -> None:  # Twisted's
        self.data += data
        if self.fail_on is not None and self.fail_on in self.data:
            raise ValueError("the protocol failed")
        self.transport.write(data.upper())  # type: ignore[union-attr]

    def connectionLost(self, reason: Failure = ConnectionDone) -> None:  # type: ignore[assignment]
        self.lost = reason


class Served:
    """A lean reactor (not installed) listening on loopback, and a plain client socket."""

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.reactor = LeanEPollReactor()
        self.server: list[Recorder] = []

        def build(_addr: object) -> Recorder:
            self.server.append(Recorder(fail_on))
            return self.server[-1]

        self.port = self.reactor.listenTCP(0, _factory(build), interface="127.0.0.1")
        self.client = socket.create_connection(("127.0.0.1", self.port.getHost().port))
        self.client.setblocking(False)
        self.turn_until(lambda: bool(self.server))

    def receive(self, n: int) -> bytes:
        """Turn the reactor until the client has read ``n`` bytes, or the end."""
        got = [b""]

        def read() -> bool:
            try:
                chunk = self.client.recv(1 << 20)
            except BlockingIOError:
                return False
            got[0] += chunk
            return not chunk or len(got[0]) >= n

        self.turn_until(read)
        return got[0]

    def turn_until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "waited 5 s"
            self.reactor.iterate(0.05)

    def close(self) -> None:
        self.client.close()
        self.port.stopListening()
        for _ in range(3):
            self.reactor.iterate(0)
        self.reactor._poller.close()


def _factory(build: Callable[[object], Recorder]) -> Factory:
    class F(Factory):
        def buildProtocol(self, addr: object) -> Recorder:
            return build(addr)

    return F()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


@pytest.fixture
def log_contexts(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every selectable the reactor sets a per-event log context for."""
    seen: list[object] = []
    real = log.callWithLogger

    def counting(logger: object, f: Callable[..., Any], *a: Any, **kw: Any) -> Any:
        seen.append(logger)
        return real(logger, f, *a, **kw)

    monkeypatch.setattr(log, "callWithLogger", counting)
    return seen


def test_plain_reads_and_writes_run_without_a_log_context_each(served, log_contexts) -> None:
    for word in (b"one", b"two", b"three"):
        served.client.sendall(word)
        served.turn_until(lambda w=word: served.server[0].data.endswith(w))
        assert served.receive(len(word)) == word.upper()
    # a large answer the socket does not take at once goes out on write events
    served.server[0].transport.write(b"x" * 8_000_000)  # type: ignore[union-attr]
    assert served.receive(8_000_000) == b"x" * 8_000_000
    assert log_contexts == []


def test_a_closed_peer_is_disconnected_cleanly(served) -> None:
    served.client.close()
    served.turn_until(lambda: served.server[0].lost is not None)
    assert served.server[0].lost.check(ConnectionDone)  # type: ignore[union-attr]


def test_an_error_in_doread_is_logged_and_disconnects_the_connection() -> None:
    failures: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("isError"):  # what log.err sends, as Twisted's reactor calls it
            failures.append(event)

    globalLogPublisher.addObserver(observe)
    s = Served(fail_on=b"boom")
    try:
        s.client.sendall(b"boom")
        s.turn_until(lambda: s.server[0].lost is not None)
        assert s.server[0].lost.check(ValueError)  # type: ignore[union-attr]
        assert [e["failure"].value.args for e in failures] == [("the protocol failed",)]
        assert s.receive(1) == b""  # the reactor closed the socket
    finally:
        globalLogPublisher.removeObserver(observe)
        s.close()


def test_pushup_serve_runs_the_lean_reactor_for_epoll() -> None:
    code = ("from pushup.ops.cli import install_reactor; install_reactor('epoll'); "
            "from twisted.internet import reactor; print(type(reactor).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.strip() == "LeanEPollReactor"


def test_a_twisted_whose_copied_source_changed_runs_its_own_reactor_and_says_so() -> None:
    """An install that resolves a newer Twisted never runs an unverified copy
    of its event loop: the pins are checked at start."""
    changed = {**PINNED, "EPollReactor.doPoll": "0" * 64}
    code = ("from pushup._twisted import PINNED, install_lean_epoll; "
            f"note = install_lean_epoll({changed!r}); "
            "from twisted.internet import reactor; print(type(reactor).__name__); print(note)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True)
    name, note = out.stdout.strip().splitlines()
    assert name == "EPollReactor"
    assert "EPollReactor.doPoll differs" in note


def test_a_start_on_an_unverified_twisted_logs_which_reactor_runs() -> None:
    code = ("import pushup._twisted as t; t.PINNED['EPollReactor.doPoll'] = '0' * 64; "
            "t.install_lean_epoll.__defaults__ = (t.PINNED,); "
            "from pushup.ops.cli import main; main(['serve', '--port', '0'])")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "reactor:" in line:
                break
        assert "Twisted's epoll reactor, not the lean one" in lines[-1], lines
    finally:
        proc.terminate()
        proc.wait(timeout=10)
