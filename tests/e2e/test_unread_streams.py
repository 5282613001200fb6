"""An event stream that ends while its client reads nothing is cut off after
``--send-timeout``: its close does not wait for good on output never taken.

A real node; clients with a 4 KiB receive buffer that never read, streaming
megabytes of history until their tokens expire.
"""

from __future__ import annotations

import socket
import time

import jwt

from tests.e2e.support import uniq

SECRET = "s" * 32


def test_streams_ended_by_their_tokens_while_unread_are_closed(start_node):
    node = start_node("--subscribe-secret", SECRET, "--send-timeout", "6")
    ch = uniq("unread")
    blob = "x" * 60_000
    for _ in range(7):  # ~6.7 MB of history: far more than the sockets' buffers
        r = node.publish_batch([{"channels": [ch], "data": blob} for _ in range(16)])
        assert r.status == 201, r
    # Expires in 2 to 3 s: before the send timeout since the clients stopped reading.
    token = jwt.encode({"channels": [ch], "exp": int(time.time()) + 3}, SECRET,
                       algorithm="HS256")
    clients = []
    for _ in range(3):
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect((node.host, node.port))
        client.sendall(f"GET /subscribe?channels={ch}&since=0&token={token} HTTP/1.1\r\n"
                       "Host: x\r\nAccept: text/event-stream\r\n\r\n".encode())
        clients.append(client)
    try:
        node.wait_stat("connections", lambda n: n == 4)  # the streams and this /stats
        # Each stream ends at its token's expiry with its page unsent; send_timeout
        # later (about 6 s after they stopped reading) the node has cut them off.
        node.wait_stat("connections", lambda n: n == 1, timeout=30)
    finally:
        for client in clients:
            client.close()
