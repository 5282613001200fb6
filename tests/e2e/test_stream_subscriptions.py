"""Durable Streams subscriptions (protocol §6-7) on one real `pushup serve`,
with real webhook receivers of the test's own (HTTP servers in threads on
loopback ports): a delivery's Ed25519 signature checked with `cryptography`
against the node's JWKS for the key of ``--stream-webhook-key``; a dead
receiver retried with backoff, one POST at a time, the node serving on; the
bounded delivery queue, its refusals counted in /metrics; the malformed
requests' 4xx. (The protocol's own suite: tests/conformance/test_durable_streams.py.)"""
from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from pushup.ops.webhook_key import new_key_pem
from tests.e2e.support import JSON_CT, Node, assert_error, uniq
from tests.toolkit import ServedNode

SUB = "/v1/stream/__ds/subscriptions/"


class Receiver:
    """Records each POST (raw body, signature header); answers ``answer``
    (JSON), or 500 with ``failing``, or never with ``silent``."""

    def __init__(self, answer: dict | None = None, failing: bool = False,
                 silent: bool = False) -> None:
        self.posts: list[tuple[bytes, str]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.posts.append((body, self.headers.get("Webhook-Signature", "")))
                if silent:
                    receiver.release.wait(60)
                    return
                out = json.dumps(answer or {}).encode()
                self.send_response(500 if failing else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self) -> int:
        with self.lock:
            return len(self.posts)

    def wait(self, n: int, guard: float = 20.0) -> list[tuple[bytes, str]]:
        deadline = time.monotonic() + guard
        while self.count() < n:
            assert time.monotonic() < deadline, f"hang guard: {n} POSTs not within {guard} s"
            time.sleep(0.02)
        with self.lock:
            return list(self.posts)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[type[Receiver]]:
    made: list[Receiver] = []

    class Made(Receiver):
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)  # type: ignore[arg-type]
            made.append(self)
    yield Made
    for receiver in made:
        receiver.close()


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "webhook.pem"
    path.write_bytes(new_key_pem())
    return path


def served(*flags: str) -> Node:
    node = ServedNode("--host", "127.0.0.1", *flags, healthy=True)
    return Node(node.proc, node.host, node.port, flags, node)


@pytest.fixture(scope="module")
def node(key_file: Path) -> Iterator[Node]:
    one = served("--stream-webhook-key", str(key_file), "--stream-webhook-queue", "1")
    yield one
    assert one.served is not None and one.served.stop() == 0


def subscribe(node: Node, url: str, pattern: str, sub_id: str | None = None) -> dict:
    sub_id = sub_id or uniq("sub")
    r = node.request("PUT", SUB + sub_id, {"type": "webhook", "pattern": pattern,
                                           "webhook": {"url": url}, "lease_ttl_ms": 1000})
    assert r.status == 201, (r.status, r.body)
    return r.json


def assert_refused(response, status: int, code: str) -> None:
    """PushUp's error shape; the code as given (the protocol's are upper case,
    which tests/contract.py's snake_case check would refuse)."""
    if code.islower():
        assert_error(response, status, code)
        return
    assert response.status == status, response
    assert response.header("content-type") == JSON_CT, response
    assert set(response.json) == {"error"} and response.json["error"]["code"] == code, response
    assert response.json["error"]["message"].strip(), response


def b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def test_a_delivery_is_signed_by_the_configured_key_as_the_jwks_publishes_it(
        node: Node, key_file: Path, receivers: type[Receiver]) -> None:
    receiver = receivers(answer={"done": True})
    prefix = uniq("signed")
    sub = subscribe(node, receiver.url, prefix + "/*")
    jwks = node.get("/v1/stream/__ds/jwks.json")
    assert jwks.status == 200 and jwks.header("Content-Type") == "application/jwk-set+json"
    [jwk] = jwks.json["keys"]
    assert sub["webhook"]["signing"]["kid"] == jwk["kid"]
    private = serialization.load_pem_private_key(key_file.read_bytes(), None)
    assert isinstance(private, Ed25519PrivateKey)
    raw = private.public_key().public_bytes(serialization.Encoding.Raw,
                                            serialization.PublicFormat.Raw)
    assert b64url(jwk["x"]) == raw  # the file's key, not one made at start

    r = node.request("PUT", f"/v1/stream/{prefix}/a", raw_body=b'{"n": 1}',
                     headers={"Content-Type": "application/json"})
    assert r.status == 201
    [(body, header)] = receiver.wait(1)
    fields = dict(part.split("=", 1) for part in header.split(","))
    assert fields["kid"] == jwk["kid"]
    public = Ed25519PublicKey.from_public_bytes(b64url(jwk["x"]))
    public.verify(b64url(fields["ed25519"]), fields["t"].encode() + b"." + body)  # raises if not
    wake = json.loads(body)
    assert [s["path"] for s in wake["streams"]] == [f"{prefix}/a"]
    # {"done": true} acked the snapshot: the link's ack is the stream's tail
    tail = wake["streams"][0]["tail_offset"]
    deadline = time.monotonic() + 10
    while node.get(SUB + sub["id"]).json["streams"][0]["acked_offset"] != tail:
        assert time.monotonic() < deadline, "the done answer never acked the snapshot"
        time.sleep(0.02)


def test_the_kid_is_the_keys_own_so_every_node_of_the_file_publishes_the_same(
        node: Node, key_file: Path) -> None:
    other = served("--stream-webhook-key", str(key_file))
    try:
        assert other.get("/v1/stream/__ds/jwks.json").json == \
            node.get("/v1/stream/__ds/jwks.json").json
    finally:
        assert other.served is not None and other.served.stop() == 0


def test_a_failing_receiver_is_retried_with_backoff_one_post_at_a_time(
        node: Node, receivers: type[Receiver]) -> None:
    receiver = receivers(failing=True)
    prefix = uniq("failing")
    sub = subscribe(node, receiver.url, prefix + "/*")
    path = f"/v1/stream/{prefix}/a"
    assert node.request("PUT", path, raw_body=b"x",
                        headers={"Content-Type": "text/plain"}).status == 201
    receiver.wait(1)
    deadline = time.monotonic() + 10
    while node.get(SUB + sub["id"]).json["status"] != "failed":  # §6.3: a retry is scheduled
        assert time.monotonic() < deadline, "the 500 never made the subscription failed"
        time.sleep(0.02)
    for _ in range(50):  # appends while the receiver fails add no POST
        assert node.request("POST", path, raw_body=b"y",
                            headers={"Content-Type": "text/plain"}).status == 204
    receiver.wait(2)  # the retry, about 1 s later (backoff from 1 s)
    assert receiver.count() == 2
    [first, second] = [json.loads(body) for body, _ in receiver.wait(2)]
    assert (second["wake_id"], second["generation"]) == (first["wake_id"],
                                                         first["generation"])
    # the retry carries the tail as it is now
    assert second["streams"][0]["tail_offset"] > first["streams"][0]["tail_offset"]
    assert any("webhook delivery failed" in line for line in node.stderr_lines)
    assert sum("webhook delivery failed" in line and sub["id"] in line
               for line in node.stderr_lines) == 1  # said once per outage
    node.request("DELETE", SUB + sub["id"])


def test_past_the_queue_a_delivery_is_refused_and_counted(
        node: Node, receivers: type[Receiver]) -> None:
    """64 POSTs under way at most, then ``--stream-webhook-queue`` (1 here)
    waiting; the rest are refused at once, counted, and backed off."""
    receiver = receivers(silent=True)
    prefix = uniq("silent")
    ids = [subscribe(node, receiver.url, prefix + "/*")["id"] for _ in range(70)]
    before = node.stats()["stream_subscriptions"]["dropped"]
    assert node.request("PUT", f"/v1/stream/{prefix}/a", raw_body=b"x",
                        headers={"Content-Type": "text/plain"}).status == 201
    stats = node.wait_stat("stream_subscriptions", lambda s: s["in_flight"] == 64
                           and s["queued"] == 1 and s["dropped"] - before == 5)
    assert stats["stream_subscriptions"]["in_flight"] == 64
    metrics = node.get("/metrics").body.decode()
    assert f"pushup_stream_webhook_dropped_total {float(before + 5)}" in metrics
    node.alive_check()  # the node serves on
    for sub_id in ids:
        assert node.request("DELETE", SUB + sub_id).status == 204


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), [
    ("PUT", SUB + "s1", b"{", 400, "bad_json"),
    ("PUT", SUB + "s1", b'{"type": "webhook", "pattern": "a/*"}', 400, "bad_parameter"),
    ("PUT", SUB + "s1", b'{"type": "pull-wake", "wake_stream": "w"}', 400, "bad_parameter"),
    ("PUT", SUB + "s1", b'{"type": "webhook", "pattern": "a/*", "webhook": '
     b'{"url": "https://169.254.169.254/"}}', 400, "WEBHOOK_URL_REJECTED"),
    ("PUT", SUB + "s1", b'{"type": "webhook", "pattern": "a/*", "webhook": '
     b'{"url": "http://127.0.0.1/"}, "lease_ttl_ms": 999}', 400, "bad_parameter"),
    ("PUT", SUB + "bad%20id", b"{}", 400, "bad_parameter"),
    ("PUT", "/v1/stream/__ds/mine", b"", 400, "bad_parameter"),
    ("GET", SUB + "nobody", b"", 404, "not_found"),
    ("PATCH", SUB + "nobody", b"", 405, "method_not_allowed"),
])
def test_a_malformed_request_gets_its_4xx(node: Node, method: str, path: str, body: bytes,
                                          status: int, code: str) -> None:
    assert_refused(node.request(method, path, raw_body=body,
                                headers={"Content-Type": "application/json"}), status, code)
    node.alive_check()


def test_a_callback_needs_the_wakes_token_and_a_stale_one_is_fenced(
        node: Node, receivers: type[Receiver]) -> None:
    receiver = receivers()  # answers {}: the wake waits for its callback
    prefix = uniq("callback")
    sub = subscribe(node, receiver.url, prefix + "/*")
    node.request("PUT", f"/v1/stream/{prefix}/a", raw_body=b"x",
                 headers={"Content-Type": "text/plain"})
    wake = json.loads(receiver.wait(1)[0][0])
    url = SUB + sub["id"] + "/callback"
    ack = {"wake_id": wake["wake_id"], "generation": wake["generation"], "done": True,
           "acks": [{"stream": f"{prefix}/a", "offset": wake["streams"][0]["tail_offset"]}]}
    assert_error(node.post(url, ack), 401, "unauthorized")
    assert_error(node.post(url, ack, token="not-a-jwt"), 401, "unauthorized")
    assert_refused(node.post(url, {**ack, "wake_id": "w_other"},
                             token=wake["callback_token"]), 409, "FENCED")
    ok = node.post(url, ack, token=wake["callback_token"])
    assert (ok.status, ok.json) == (200, {"ok": True, "next_wake": False})
    assert_refused(node.post(url, ack, token=wake["callback_token"]), 409, "FENCED")
    node.request("DELETE", SUB + sub["id"])


def test_a_bad_key_file_stops_the_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key\n")
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pushup", "serve", "--port", str(port),
                           "--stream-webhook-key", str(bad)], capture_output=True,
                          timeout=20, check=False)
    assert done.returncode == 2
    assert b"--stream-webhook-key" in done.stderr and b"PEM" in done.stderr


def test_with_a_data_dir_subscriptions_their_acks_retries_and_key_survive_a_restart(
        tmp_path: Path, receivers: type[Receiver]) -> None:
    receiver = receivers(failing=True)
    data = str(tmp_path / "data")
    first = served("--data-dir", data)
    try:
        kid = first.get("/v1/stream/__ds/jwks.json").json["keys"][0]["kid"]
        pull = uniq("pull")
        assert first.request("PUT", "/v1/stream/wake/" + pull, raw_body=b"[]",
                             headers={"Content-Type": "application/json"}).status == 201
        assert first.request("PUT", SUB + pull, {"type": "pull-wake", "pattern": "p/*",
                                                 "wake_stream": "wake/" + pull}).status == 201
        first.request("PUT", "/v1/stream/p/a", raw_body=b"x",
                      headers={"Content-Type": "text/plain"})
        claim = first.post(SUB + pull + "/claim", {"worker": "w1"}).json
        tail = claim["streams"][0]["tail_offset"]
        done = first.post(SUB + pull + "/ack", {
            "wake_id": claim["wake_id"], "generation": claim["generation"], "done": True,
            "acks": [{"stream": "p/a", "offset": tail}]}, token=claim["token"])
        assert done.json == {"ok": True, "next_wake": False}
        hook = subscribe(first, receiver.url, "h/*")
        first.request("PUT", "/v1/stream/h/a", raw_body=b"x",
                      headers={"Content-Type": "text/plain"})
        [(body, _)] = receiver.wait(1)
        deadline = time.monotonic() + 10
        while first.get(SUB + hook["id"]).json["status"] != "failed":
            assert time.monotonic() < deadline, "the 500 never made the subscription failed"
            time.sleep(0.02)
    finally:
        assert first.served is not None and first.served.stop() == 0
    again = served("--data-dir", data)
    try:
        assert again.get("/v1/stream/__ds/jwks.json").json["keys"][0]["kid"] == kid
        kept = again.get(SUB + pull).json
        assert kept["streams"] == [{"path": "p/a", "link_type": "glob", "acked_offset": tail}]
        # (its status is not read here: the kept retry may be due at once,
        # and while it is under way the subscription is "active")
        retried = json.loads(receiver.wait(2)[1][0])  # the kept schedule, honoured
        assert (retried["wake_id"], retried["generation"]) == (
            json.loads(body)["wake_id"], json.loads(body)["generation"])
        callback = again.post(urlsplit(retried["callback_url"]).path, {
            "wake_id": retried["wake_id"], "generation": retried["generation"], "done": True,
            "acks": []}, token=retried["callback_token"])
        assert callback.status == 200, callback  # the token of before the restart holds
    finally:
        assert again.served is not None and again.served.stop() == 0
