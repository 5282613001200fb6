"""The paper's demo: a chat web application in front of a PushUp cluster.

HAProxy sends /subscribe, /publish, /channels and /pushup.js to PushUp and
everything else here (PushUp's front-end role). This small backend signs a
user in (a name in an HMAC-signed cookie), publishes what they say to the
channel ``chat:lobby`` with the publish token (server side: pages never hold
it), and hands each signed-in page a subscribe token for that channel, and a
fresh one whenever the page asks (before the last expires). ``/cluster`` says
which nodes are up. The page (``chat.html``) uses ``/pushup.js``. Standard
library only.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import random
import re
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from http.cookies import SimpleCookie
from pathlib import Path

import jwt

CHANNEL = "chat:lobby"
PAGE_KEY = re.compile(r"[A-Za-z0-9_-]{8,64}")  # the key a page gives each line it sends
PAGE = (Path(__file__).resolve().parent / "chat.html").read_bytes()


class Chat:
    def __init__(self, node_urls: Sequence[str], publish_token: str, subscribe_secret: str,
                 cookie_key: bytes, token_seconds: float = 3600.0) -> None:
        self.node_urls = list(node_urls)
        self.token_seconds = token_seconds  # how long a page's subscribe token lasts
        self.attempts: list[tuple[str, str, bool]] = []  # (idempotency key, text, sent)
        self.publish_token = publish_token
        self.subscribe_secret = subscribe_secret
        self.cookie_key = cookie_key

    def sign(self, name: str) -> str:
        mac = hmac.new(self.cookie_key, name.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{name}.{mac}"

    def user(self, cookie_header: str | None) -> str | None:
        value = SimpleCookie(cookie_header or "").get("user")
        if value is None or "." not in value.value:
            return None
        name, _, mac = value.value.rpartition(".")
        return name if hmac.compare_digest(self.sign(name), value.value) else None

    def idempotency_key(self, user: str, page_key: str) -> str:
        """The Idempotency-Key of the line a page keys ``page_key``: the same for
        each retry of it, and no one else's (it is signed with the user's name)."""
        return hmac.new(self.cookie_key, f"{user}:{page_key}".encode(),
                        hashlib.sha256).hexdigest()[:32]

    def publish(self, user: str, text: str, key: str | None = None) -> dict[str, str] | None:
        """Publish to any live node (a node may be down: try the others); the
        receipt (its ``id`` names the node that took it), or None.

        Every try carries the same Idempotency-Key (``key``, from the page's
        own for the line, so a page's retry of a failed send carries it too):
        a node that timed out or hung up may have stored the line, and the
        retry must not say it twice.
        """
        body = json.dumps({"channels": [CHANNEL], "data": {"user": user, "text": text}}).encode()
        key = key or secrets.token_urlsafe(16)  # one per line said, whatever node takes it
        for url in random.sample(self.node_urls, len(self.node_urls)):
            request = urllib.request.Request(url + "/publish", data=body, method="POST", headers={
                "Authorization": f"Bearer {self.publish_token}",
                "Content-Type": "application/json", "Idempotency-Key": key})
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status in (201, 202):  # 202: accepted, one node holds it
                        self.attempts.append((key, text, True))
                        receipt: dict[str, str] = json.loads(response.read())
                        return receipt
            except (OSError, ValueError, urllib.error.HTTPError):
                continue
        self.attempts.append((key, text, False))
        return None

    def nodes(self) -> list[dict[str, object]]:
        """Each node's id (node1, ...) and whether its /health is 200 now."""
        out: list[dict[str, object]] = []
        for i, url in enumerate(self.node_urls):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as response:
                    up = response.status == 200
            except (OSError, urllib.error.HTTPError):
                up = False
            out.append({"id": f"node{i + 1}", "up": up})
        return out


def handler_for(chat: Chat) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "application/json",
                  cookie: str = "") -> None:
            self.send_response(status)
            if status != 204:  # a 204 has no body, and says no length
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            if cookie:
                self.send_header("Set-Cookie", f"user={cookie}; Path=/; HttpOnly; SameSite=Strict")
            self.end_headers()
            if status != 204:
                self.wfile.write(body)

        def _json(self) -> dict[str, str]:
            length = int(self.headers.get("Content-Length", "0"))
            try:
                value = json.loads(self.rfile.read(min(length, 65536)) or b"{}")
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}

        def do_GET(self) -> None:  # noqa: N802 (http.server's interface)
            if self.path in ("/", "/index.html"):
                return self._send(200, PAGE, "text/html; charset=utf-8")
            if self.path == "/token":
                user = chat.user(self.headers.get("Cookie"))
                if user is None:
                    return self._send(401, b'{"error":"sign in first"}')
                # sub: who the page is, for presence (the page shows who is online)
                token = jwt.encode({"channels": [CHANNEL], "sub": user,
                                    "exp": int(time.time() + chat.token_seconds)},
                                   chat.subscribe_secret, algorithm="HS256")
                return self._send(200, json.dumps({
                    "token": token, "user": user, "channel": CHANNEL,
                    "expires_in": chat.token_seconds}).encode())
            if self.path == "/cluster":
                return self._send(200, json.dumps({"nodes": chat.nodes()}).encode())
            self._send(404, b'{"error":"not found"}')

        def do_POST(self) -> None:  # noqa: N802
            if self.path == "/login":
                name = str(self._json().get("name", "")).strip()[:40]
                if not name or "." in name or ";" in name:
                    return self._send(400, b'{"error":"a name, without dots"}')
                return self._send(204, b"", cookie=chat.sign(name))
            if self.path == "/send":
                user = chat.user(self.headers.get("Cookie"))
                line = self._json()
                text = str(line.get("text", "")).strip()[:500]
                page_key = str(line.get("key", ""))
                if user is None:
                    return self._send(401, b'{"error":"sign in first"}')
                if not text:
                    return self._send(400, b'{"error":"say something"}')
                if not PAGE_KEY.fullmatch(page_key):
                    return self._send(400, b'{"error":"key: 8 to 64 of A-Z a-z 0-9 _ -"}')
                receipt = chat.publish(user, text, chat.idempotency_key(user, page_key))
                if receipt is None:
                    return self._send(503, b'{"error":"no node took it; retry"}')
                return self._send(200, json.dumps({
                    "id": receipt["id"], "node": receipt["id"].split(".")[0]}).encode())
            self._send(404, b'{"error":"not found"}')

    return Handler


def serve(chat: Chat, port: int = 0) -> http.server.ThreadingHTTPServer:
    """Serve the chat on 127.0.0.1:``port`` in a background thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler_for(chat))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
