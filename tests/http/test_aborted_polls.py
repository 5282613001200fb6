"""A long poll whose client resets the connection leaves nothing behind.

Issue 26: ~2.5 KB stayed per aborted poll, for good. A closed connection's
parser held the connection's bound methods, a cycle only a full collection
frees, and issue 18's GC thresholds make that almost never (what lives past a
few young collections waits for a full one); and the hub's deadline index kept
a forgotten poll's entry, and through it the connection, until the deadline
came. So the rule: a closed connection is freed by reference counting alone,
at once, whatever its poll's deadline. The test runs a node in this process
on the real reactor, real sockets, with the collector off (so only reference
counting frees anything, as it must), and counts the live connections.
"""

from __future__ import annotations

import gc
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from pushup.config import Config
from pushup.http.protocol import HTTPProtocol
from pushup.ops.node import Node
from tests.real_reactor import reactor, run_until, wait_for

POLLS = 200


@pytest.fixture
def node() -> Iterator[Node]:
    node = Node(Config(host="127.0.0.1", port=0), reactor=reactor)
    node.listen()
    yield node
    wait_for(node.stop(), timeout=15)


def connections_alive() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, HTTPProtocol))


def poll(node: Node, channel: str, timeout: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", node.port.getHost().port))  # type: ignore[union-attr]
    s.sendall(f"GET /subscribe?channels={channel}&timeout={timeout} HTTP/1.1\r\n"
              f"Host: x\r\n\r\n".encode())
    return s


def reset(s: socket.socket) -> None:
    """Close with an RST, as a client that gives up does (SO_LINGER 0)."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_aborted_long_polls_free_their_connections_at_once(node: Node, no_collector: Any,
                                                           ) -> None:
    hub, front = node.service.hub, node.front
    # One poll stays held, its deadline before the others': their deadline
    # entries are behind its own, where a lazily dropped entry waits.
    staying = poll(node, "stay", 60)
    run_until(lambda: len(hub) == 1, 10, "the first poll held")
    before = connections_alive()
    for _ in range(3):
        clients = [poll(node, "x", 120) for _ in range(POLLS)]
        run_until(lambda: len(hub) == POLLS + 1, 20, f"{POLLS} more polls held")
        assert connections_alive() == before + POLLS  # they were counted
        for s in clients:
            reset(s)
        run_until(lambda: len(hub) == 1 and len(front.protocols) == 1, 20,
                  "the aborted polls forgotten and their connections lost")
        # long before their deadline, and with no collection at all
        assert connections_alive() == before
    staying.close()


def stream_poll(node: Node, timeout: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", node.port.getHost().port))  # type: ignore[union-attr]
    s.sendall(f"GET /v1/stream/s?offset=-1&live=long-poll&timeout={timeout} HTTP/1.1\r\n"
              f"Host: x\r\n\r\n".encode())
    return s


def test_aborted_stream_long_polls_free_their_connections_at_once(node: Node, no_collector: Any,
                                                                  ) -> None:
    """Issue 35, item 6: a Durable Stream's long poll whose client resets is
    freed at once, also while another poll of its group (same offset, same
    cursor) is held; it stayed in the group with its connection (+2,130 bytes)."""
    streams, front = node.handlers.streams, node.front
    create = socket.create_connection(("127.0.0.1", node.port.getHost().port))  # type: ignore[union-attr]
    create.sendall(b"PUT /v1/stream/s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                   b"Connection: close\r\n\r\n")
    run_until(lambda: streams.streams.at("/v1/stream/s") is not None, 10, "the stream created")
    create.close()
    staying = stream_poll(node, 60)
    run_until(lambda: streams.long_polls == 1 and len(front.protocols) == 1, 10,
              "the first poll held")
    before = connections_alive()
    for _ in range(3):
        clients = [stream_poll(node, 120) for _ in range(POLLS)]
        run_until(lambda: streams.long_polls == POLLS + 1, 20, f"{POLLS} more polls held")
        assert connections_alive() == before + POLLS  # they were counted
        for s in clients:
            reset(s)
        run_until(lambda: streams.long_polls == 1 and len(front.protocols) == 1, 20,
                  "the aborted polls forgotten and their connections lost")
        assert connections_alive() == before  # with no collection at all
    staying.close()
