"""Many held polls, disconnects, the connection cap, reactors."""
from __future__ import annotations

import json
import socket
import struct
import time

import pytest

from tests.e2e.support import (
    assert_error,
    assert_json_ok,
    parse_raw_response,
    read_many,
    response_complete,
    uniq,
    wait_until,
)


def dechunk(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return out


def decode_raw(buf: bytes):
    r = parse_raw_response(buf)
    assert r is not None, buf[:200]
    if (r.header("Transfer-Encoding") or "").lower() == "chunked":
        r.body = dechunk(buf.partition(b"\r\n\r\n")[2])
    return r


def open_polls(node, n: int, path: str) -> list[socket.socket]:
    socks = []
    req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", node.port), timeout=10)
        s.sendall(req)
        socks.append(s)
    return socks


def collect(socks: list[socket.socket], timeout: float = 60.0) -> list[bytes]:
    return read_many(socks, timeout, done=response_complete)


def test_thousand_concurrent_long_polls_answered_by_one_publish(start_node):
    n = start_node()
    ch = uniq("thousand")
    cur = n.subscribe([ch])["cursor"]
    before = n.stats()
    socks = open_polls(n, 1000, n.sub_path([ch], since=cur, timeout=90))
    try:
        n.wait_subscribers(ch, 1000, timeout=60)
        assert n.stats()["waiting"] == 1000
        pub = n.publish([ch], {"hello": "all"})
        bufs = collect(socks, 60)
    finally:
        for s in socks:
            s.close()
    for buf in bufs:
        r = decode_raw(buf)
        assert r.status == 200, buf[:300]
        body = json.loads(r.body)
        assert [m["id"] for m in body["messages"]] == [pub["id"]]
        assert body["messages"][0]["data"] == {"hello": "all"}
    after = n.wait_stat("waiting", lambda w: w == 0)
    assert after["delivered"] - before["delivered"] == 1000
    assert after["published"] - before["published"] == 1


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
def test_disconnect_while_waiting_is_forgotten(start_node, rst):
    n = start_node()
    ch = uniq("disc")
    cur = n.subscribe([ch])["cursor"]
    socks = open_polls(n, 5, n.sub_path([ch], since=cur, timeout=100))
    n.wait_stat("waiting", lambda w: w == 5)
    n.wait_subscribers(ch, 5)
    for s in socks:
        if rst:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    n.wait_stat("waiting", lambda w: w == 0)
    n.wait_subscribers(ch, 0)
    delivered = n.stats()["delivered"]
    n.publish([ch], "nobody listens")
    assert n.stats()["delivered"] == delivered
    n.alive_check()


def test_half_closed_client_is_forgotten(start_node):
    """A client that shuts down its sending side (FIN) while waiting has gone."""
    n = start_node()
    ch = uniq("half")
    cur = n.subscribe([ch])["cursor"]
    socks = open_polls(n, 3, n.sub_path([ch], since=cur, timeout=100))
    n.wait_subscribers(ch, 3)
    for s in socks:
        s.shutdown(socket.SHUT_WR)
    try:
        n.wait_subscribers(ch, 0)
    finally:
        for s in socks:
            s.close()


def test_max_connections(start_node):
    n = start_node("--max-connections", "5")
    n.wait_stat("connections", lambda c: c == 1)  # start-up probes have gone
    conns = [n.conn() for _ in range(5)]
    try:
        for c in conns:
            assert_json_ok(n.request("GET", "/health", conn=c))
        st = n.request("GET", "/stats", conn=conns[0]).json
        assert st["connections"] == 5
        # the 6th concurrent connection is refused with 503 overloaded JSON
        buf = n.raw_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
        r = parse_raw_response(buf)
        assert r is not None, buf[:200]
        assert_error(r, 503, "overloaded")
        # the first five keep working, on their keep-alive connections
        ch = uniq("mc")
        pub = assert_json_ok(n.request("POST", "/publish", body={"channels": [ch], "data": 1},
                                       conn=conns[1]), 201)
        got = assert_json_ok(n.request("GET", n.sub_path([ch], since="0", timeout=0),
                                       conn=conns[2]))
        assert [m["id"] for m in got["messages"]] == [pub["id"]]
        for c in conns:
            assert_json_ok(n.request("GET", "/health", conn=c))
        # a held poll counts too, and is answered
        cur = got["cursor"]
        conns[3].request("GET", n.sub_path([ch], since=cur, timeout=30))
        pub2 = assert_json_ok(n.request("POST", "/publish", body={"channels": [ch], "data": 2},
                                        conn=conns[4]), 201)
        r3 = conns[3].getresponse()
        assert [m["id"] for m in json.loads(r3.read())["messages"]] == [pub2["id"]]
    finally:
        conns[4].close()
    try:
        # once one closes, a new connection is served again
        def new_conn_ok():
            buf = n.raw_exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
            r = parse_raw_response(buf)
            return r is not None and r.status == 200
        wait_until(new_conn_ok, 10, interval=0.05, msg="a freed connection slot")
    finally:
        for c in conns:
            c.close()


@pytest.mark.parametrize("reactor", ["select", "poll", "epoll"])
def test_reactors_start_and_serve(start_node, reactor):
    n = start_node("--reactor", reactor)
    n.alive_check()
    ch = uniq(reactor)
    cur = n.subscribe([ch])["cursor"]
    polls = [n.subscribe_async([ch], since=cur, timeout=30) for _ in range(20)]
    n.wait_subscribers(ch, 20)
    pub = n.publish([ch], reactor)
    for p in polls:
        assert [m["id"] for m in assert_json_ok(p.result(10))["messages"]] == [pub["id"]]
    st = n.stats()
    assert st["waiting"] == 0


def test_select_reactor_caps_connections_below_1000(start_node):
    n = start_node("--reactor", "select")
    socks = []
    refused = None
    try:
        for i in range(1100):
            s = socket.create_connection(("127.0.0.1", n.port), timeout=10)
            socks.append(s)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            buf = b""
            while not response_complete(buf):
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                buf += chunk
            r = parse_raw_response(buf)
            assert r is not None, f"connection {i}: no HTTP response ({buf[:200]!r})"
            if r.status != 200:
                assert_error(r, 503, "overloaded")
                refused = i
                break
        assert refused is not None, "1100 connections accepted by the select reactor"
        assert 10 <= refused < 1000
        # the accepted ones still work
        for s in (socks[0], socks[refused - 1]):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            buf = b""
            while not response_complete(buf):
                chunk = s.recv(65536)
                assert chunk
                buf += chunk
            assert parse_raw_response(buf).status == 200
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: n.get("/health").status == 200, 15, interval=0.1, msg="node recovers")
    n.alive_check()


def test_many_clients_exactly_once_under_concurrent_publish(start_node):
    """Ten cursor-following clients each receive all 200 messages published concurrently."""
    import threading
    n = start_node()
    ch = uniq("eo")
    results = {}

    def client(k):
        cur, seen = n.subscribe([ch])["cursor"], []
        deadline = time.monotonic() + 60
        while len(seen) < 200 and time.monotonic() < deadline:
            body = n.subscribe([ch], since=cur, timeout=5, limit=7)
            seen += [m["data"] for m in body["messages"]]
            cur = body["cursor"]
        results[k] = seen

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(10)]
    for t in threads:
        t.start()
    n.wait_subscribers(ch, 10, timeout=30)

    def publisher(base):
        for i in range(50):
            n.publish([ch], base + i)

    pubs = [threading.Thread(target=publisher, args=(b * 1000,), daemon=True) for b in range(4)]
    for t in pubs:
        t.start()
    for t in pubs + threads:
        t.join(90)
    expected = sorted(b * 1000 + i for b in range(4) for i in range(50))
    for k in range(10):
        assert sorted(results[k]) == expected, k
        assert len(results[k]) == 200
        # per publisher, order preserved
        for b in range(4):
            mine = [x for x in results[k] if b * 1000 <= x < b * 1000 + 1000]
            assert mine == sorted(mine)
