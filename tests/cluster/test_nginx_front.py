"""The shipped nginx front (deploy/nginx-pushup.conf.template) keeps the contract
over HTTPS.

A real nginx (Debian's, installed by `make bench-packages`) with its own
prefix in a temporary directory, a self-signed certificate made here by
`openssl`, and two real nodes upstream: a held poll, an event stream that
delivers a publish as it happens, a publish, and, when no node is up, the
same 503 no_node_available with Retry-After as HAProxy's. nginx's default
60 s read timeout is not waited out; the shipped file's timeout is read and
compared with --max-timeout instead.
"""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from deploy.nginx import SITE_TEMPLATE, PrivateNginx, read_timeout_seconds
from pushup.config import Config
from tests.cluster.clients import uniq, wait_waiting
from tests.toolkit import free_port


def test_the_shipped_site_outlasts_the_longest_poll_and_streams_unbuffered():
    site = SITE_TEMPLATE.read_text()
    assert read_timeout_seconds(site) > Config().max_timeout
    assert "proxy_buffering off;" in site
    assert "proxy_http_version 1.1;" in site and 'proxy_set_header Connection "";' in site
    assert "keepalive " in site


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return str(cert), str(key)


def exchange(conn: http.client.HTTPConnection, method: str, path: str,
             payload: object = None) -> tuple[int, dict[str, str], dict]:
    """One request on ``conn``, then closed: (status, headers, JSON body)."""
    try:
        body = None if payload is None else json.dumps(payload).encode()
        conn.request(method, path, body=body,
                     headers={"Content-Type": "application/json"} if body else {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())
    finally:
        conn.close()


def https(port: int, cafile: str, method: str, path: str, payload: object = None,
          timeout: float = 15.0) -> tuple[int, dict[str, str], dict]:
    """One request over TLS, the certificate verified against ``cafile``."""
    return exchange(http.client.HTTPSConnection(
        "127.0.0.1", port, timeout=timeout, context=ssl.create_default_context(cafile=cafile)),
        method, path, payload)


def nginx_in_front(bases: list[str], certificate: tuple[str, str]) -> tuple[PrivateNginx, int]:
    """A started nginx with TLS on a free loopback port, before ``bases``: (it, its port)."""
    port = free_port()
    front = PrivateNginx(f"127.0.0.1:{port}", [b.removeprefix("http://") for b in bases],
                         *certificate)
    front.start()
    return front, port


def test_over_https_a_held_poll_an_event_stream_and_a_publish(fresh_cluster, certificate):
    c = fresh_cluster(2, haproxy=False)
    cert, _ = certificate
    front, port = nginx_in_front(c.bases, certificate)
    try:
        ch = uniq("tls")
        # An event stream over TLS: the head comes through before any message.
        raw = socket.create_connection(("127.0.0.1", port), timeout=15)
        stream = ssl.create_default_context(cafile=cert).wrap_socket(
            raw, server_hostname="127.0.0.1")
        stream.sendall(f"GET /subscribe?channels={ch} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Accept: text/event-stream\r\n\r\n".encode())
        got = b""
        while b"\r\n\r\n" not in got:
            got += stream.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in got.lower()
        # A publish over TLS reaches the stream as it happens, not when a
        # buffer fills (recv would hit its 15 s hang guard).
        status, _, receipt = https(port, cert, "POST", "/publish",
                                   {"channels": [ch], "data": "over tls"})
        assert status == 201
        while receipt["id"].encode() not in got:
            chunk = stream.recv(65536)
            assert chunk, got
            got += chunk
        assert b'"over tls"' in got
        stream.close()
        # A poll held to its timeout is answered by the node, not cut by nginx.
        status, _, body = https(port, cert, "GET", f"/subscribe?channels={uniq('idle')}"
                                f"&timeout=5")
        assert status == 200 and body["messages"] == [] and body["cursor"]
    finally:
        front.stop()


def test_with_no_node_up_nginx_and_haproxy_both_answer_503_no_node_available(
        fresh_cluster, certificate):
    """A request no node received: nginx (which calls a refused connection 502)
    and HAProxy give the same answer, so a client may resend it without a key."""
    c = fresh_cluster(2)
    cert, _ = certificate
    front, port = nginx_in_front(c.bases, certificate)
    try:
        for i in range(2):
            c.kill(i)
        haproxy_port = int(c.front_url.rsplit(":", 1)[1])
        for method, path, payload in (("POST", "/publish", {"channels": ["x"], "data": 1}),
                                      ("GET", "/subscribe?channels=x&timeout=5", None)):
            answers = []
            # twice: first every node refuses, then nginx has marked them all down
            for _ in range(2):
                status, headers, body = https(port, cert, method, path, payload)
                answers.append((status, body["error"]["code"], headers.get("retry-after"),
                                headers["content-type"]))
            status, headers, body = plain(haproxy_port, method, path, payload)
            answers.append((status, body["error"]["code"], headers.get("retry-after"),
                            headers["content-type"]))
            assert answers == [(503, "no_node_available", "1",
                                "application/json; charset=utf-8")] * 3, (method, answers)
    finally:
        front.stop()


def test_a_request_a_node_received_and_died_on_stays_502_bad_gateway(fresh_cluster,
                                                                     certificate):
    """The 503 is only for what no node received: a poll held by the one node,
    which is then killed, is nginx's 502 bad_gateway, without Retry-After."""
    c = fresh_cluster(1, haproxy=False)
    cert, _ = certificate
    front, port = nginx_in_front(c.bases[:1], certificate)
    try:
        answer: list[tuple[int, dict[str, str], dict]] = []
        poll = threading.Thread(target=lambda: answer.append(https(
            port, cert, "GET", f"/subscribe?channels={uniq('held')}&timeout=60")))
        poll.start()
        wait_waiting(c.bases, 1, 15)  # the node holds it
        c.kill(0)
        poll.join(30)
        assert answer, "no answer"
        status, headers, body = answer[0]
        assert (status, body["error"]["code"], headers.get("retry-after")) == (
            502, "bad_gateway", None)
    finally:
        front.stop()


def plain(port: int, method: str, path: str, payload: object = None) -> tuple[
        int, dict[str, str], dict]:
    return exchange(http.client.HTTPConnection("127.0.0.1", port, timeout=15), method, path,
                    payload)
