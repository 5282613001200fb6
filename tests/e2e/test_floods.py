"""Slowloris and connection floods against a real node: bounded in count and time.

The node must close heads that trickle in, answer every connection past
``--max-connections`` with the promised 503 (not just the first few), and keep
serving everyone else throughout.
"""

from __future__ import annotations

import socket

from tests.e2e.support import parse_raw_response, read_many, wait_until

TRICKLERS = 300
FLOOD = 600


def _read_all(socks: list[socket.socket], deadline_s: float) -> dict[socket.socket, bytes]:
    """Everything each socket gets until the server closes it."""
    return dict(zip(socks, read_many(socks, deadline_s), strict=True))


def test_trickling_heads_are_closed_and_others_served(start_node):
    node = start_node("--header-timeout", "1", "--max-connections", "400")
    socks = []
    try:
        for _ in range(TRICKLERS):
            s = node.raw_socket()
            s.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")  # and never more
            socks.append(s)
        node.alive_check()  # served while they hang
        for s in socks:  # one more byte each: trickling does not reset the clock
            s.sendall(b"a")
        answers = _read_all(socks, deadline_s=30)
        for buf in answers.values():
            response = parse_raw_response(buf)
            assert response is not None and response.status == 408, buf[:200]
            assert response.json["error"]["code"] == "request_timeout"
        wait_until(lambda: node.stats()["connections"] <= 1, msg="tricklers gone")
        node.alive_check()
    finally:
        for s in socks:
            s.close()


def test_every_connection_past_the_limit_is_answered_503(start_node):
    node = start_node("--max-connections", "50")
    held = []
    flood = []
    try:
        for _ in range(50):
            s = node.raw_socket()
            s.sendall(b"GET /subscribe?channels=flood-held&timeout=60 HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(s)
        # Accept is first come, first served: once a probe is refused, all 50 are in
        # (no /stats here: its connection would take, then free, a slot).
        probe = _read_all([node.raw_socket()], deadline_s=10)
        assert b" 503 " in next(iter(probe.values()))[:20]
        for _ in range(FLOOD):
            s = socket.create_connection((node.host, node.port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            flood.append(s)
        answers = _read_all(flood, deadline_s=60)
        statuses = [getattr(parse_raw_response(b), "status", None) for b in answers.values()]
        assert statuses.count(503) == FLOOD, {s: statuses.count(s) for s in set(statuses)}
        body = parse_raw_response(next(iter(answers.values()))).json
        assert body["error"]["code"] == "overloaded"
    finally:
        for s in held + flood:
            s.close()
    wait_until(lambda: node.stats()["connections"] <= 1, msg="held polls gone")
    node.alive_check()
    assert node.stats()["refused"] >= FLOOD
