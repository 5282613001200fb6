"""pushup/_twisted.py: the Twisted internals ``write_now`` reads are still what it
assumes. This fails on a Twisted upgrade that renames or reshapes them."""

from __future__ import annotations

from twisted.internet import abstract

from pushup._twisted import write_now


class _Reactor:
    def addWriter(self, fd: object) -> None:  # Twisted's interface
        pass

    def removeWriter(self, fd: object) -> None:
        pass


class _Socket:
    def __init__(self, takes: int) -> None:
        self.takes = takes
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> int:
        self.sent.append(bytes(data[: self.takes]))
        return min(self.takes, len(data))


def _transport(takes: int) -> abstract.FileDescriptor:
    t = abstract.FileDescriptor(reactor=_Reactor())
    t.connected = 1
    t.socket = _Socket(takes)  # type: ignore[attr-defined]
    return t


def test_an_idle_transport_sends_at_once_and_queues_the_rest():
    t = _transport(takes=3)
    assert write_now(t, b"abcdef") is False  # not all of it reached the socket
    assert t.socket.sent == [b"abc"]  # type: ignore[attr-defined]
    assert t._tempDataBuffer == [b"def"] and t._tempDataLen == 3


def test_queued_output_keeps_its_order():
    t = _transport(takes=100)
    t.write(b"first")  # Twisted's own path: queued until the reactor's next turn
    assert t._tempDataBuffer == [b"first"]
    assert write_now(t, b"second") is False
    assert t.socket.sent == []  # type: ignore[attr-defined]  # not ahead of "first"
    assert t._tempDataBuffer == [b"first", b"second"]


def test_a_partly_sent_buffer_counts_as_queued():
    t = _transport(takes=100)
    t.dataBuffer, t.offset = b"0123456789", 4  # what doWrite leaves after a short send
    assert write_now(t, b"x") is False
    assert t.socket.sent == []  # type: ignore[attr-defined]
    assert t._tempDataBuffer == [b"x"]
    assert write_now(t, b"") is False  # nothing new, but not all is in the socket


def test_data_the_socket_takes_whole_is_said_to_be_sent():
    t = _transport(takes=100)
    assert write_now(t, b"all of it") is True
    assert t.socket.sent == [b"all of it"]  # type: ignore[attr-defined]
    assert t._tempDataBuffer == []


def test_the_quiet_pool_builds_its_connections_with_the_quiet_factory():
    import inspect

    from twisted.internet.task import Clock
    from twisted.web.client import HTTPConnectionPool

    from pushup._twisted import quiet_pool

    pool = quiet_pool(Clock())
    assert pool._factory.noisy is False
    assert pool._factory is not HTTPConnectionPool._factory
    # the pool still builds new connections from that attribute
    assert "self._factory" in inspect.getsource(HTTPConnectionPool._newConnection)
