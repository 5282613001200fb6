"""A webhook receiver of the tests' own: a real HTTP server on a free loopback
port, in a thread, that records every POST (its headers and body), checks
its signature, and answers as the test says (200, a 500 first, or never)."""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """``answers``: statuses for the first requests, in order (then 200);
    ``silent``: accept each request and never answer it."""

    def __init__(self, secret: str, answers: list[int] | None = None,
                 silent: bool = False) -> None:
        self.secret = secret
        self.answers = list(answers or [])
        self.silent = silent
        self.requests: list[dict] = []  # every POST, as {"status", "body", "headers", "valid"}
        self.lock = threading.RLock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                stamp = self.headers.get("X-PushUp-Webhook-Timestamp", "")
                given = self.headers.get("X-PushUp-Webhook-Signature", "")
                expected = "sha256=" + hmac.new(receiver.secret.encode(),
                                                stamp.encode() + b"." + body,
                                                hashlib.sha256).hexdigest()
                with receiver.lock:
                    status = receiver.answers.pop(0) if receiver.answers else 200
                    receiver.requests.append({
                        "status": None if receiver.silent else status, "body": json.loads(body),
                        "headers": dict(self.headers),
                        "valid": hmac.compare_digest(expected, given)
                        and abs(time.time() - int(stamp or 0)) < 60})
                if receiver.silent:
                    receiver._release.wait(60)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def accepted(self) -> list[dict]:
        """Every event of the requests answered 2xx, in order."""
        with self.lock:
            return [e for r in self.requests if r["status"] and 200 <= r["status"] < 300
                    for e in r["body"]["events"]]

    def wait(self, condition, what: str, guard: float = 20.0):
        deadline = time.monotonic() + guard
        while True:
            with self.lock:
                value = condition(self)
            if value:
                return value
            assert time.monotonic() < deadline, f"hang guard: {what} not within {guard} s"
            time.sleep(0.05)

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
