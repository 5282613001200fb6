"""demo/chat.py's publisher: a line it retries on another node is stored once."""
from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from demo.chat import Chat


class Unsure(http.server.BaseHTTPRequestHandler):
    """A node that answers every publish 504 outcome_unknown, noting its key."""

    keys: list[str | None] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # http.server's interface
        self.rfile.read(int(self.headers["Content-Length"]))
        self.keys.append(self.headers.get("Idempotency-Key"))
        body = b'{"error":{"code":"outcome_unknown","message":"maybe"}}'
        self.send_response(504)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def unsure_nodes() -> Iterator[list[str]]:
    servers = [http.server.HTTPServer(("127.0.0.1", 0), Unsure) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    Unsure.keys = []
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_every_try_of_one_line_carries_the_same_idempotency_key(unsure_nodes):
    chat = Chat(unsure_nodes, "token", "secret", b"cookie")
    assert chat.publish("ann", "hello") is None  # neither node could say
    first = Unsure.keys
    assert len(first) == 2 and first[0] and first[0] == first[1]
    Unsure.keys = []
    chat.publish("ann", "hello")  # the next line said: a new key
    assert Unsure.keys[0] not in (None, first[0])
