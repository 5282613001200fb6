"""SIGTERM ends event streams cleanly: the stream closes and the node exits 0."""

from __future__ import annotations

import signal

from tests.e2e.support import uniq
from tests.sse_client import SSE, data_of


def test_sigterm_ends_an_open_event_stream(start_node):
    node = start_node()
    ch = uniq("sse")
    stream = SSE(node.host, node.port, [ch])
    try:
        node.publish([ch], "x")
        assert data_of(stream.events(1)) == ["x"]
        node.wait_subscribers(ch, 1)
        node.proc.send_signal(signal.SIGTERM)
        stream.sock.settimeout(15)  # hang guard
        while stream.sock.recv(65536):
            pass  # read to the end: the server closes the stream
    finally:
        stream.close()
    assert node.proc.wait(15) == 0  # hang guard
