"""Memory after bursts of large fan-outs: a real node gives it back.

Held polls answered with ~1 MB batches, clients gone without reading, channels
deleted: once the node holds nothing, its RSS must come back near where it
started (before the fix it stayed ~120-180 MB up: answered responses kept in
the writer's cache, then the pages glibc's malloc kept).
"""

from __future__ import annotations

import socket

import pytest

from tests.e2e.support import q, wait_until

DATA = 60_000  # bytes of each message
ROUNDS = 3
MB = 1024 * 1024
SLACK = 40 * MB  # how far above its start RSS may stay (the defect: +120 MB or more)
FLAGS = ("--max-body-bytes", str(4 * MB), "--max-response-bytes", str(4 * MB),
         "--max-message-bytes", str(DATA + 100))


def _burst(node, round_: int, polls: int, batch: int) -> dict:
    """One round: ``polls`` held polls, each on its own channel, answered with
    ``batch`` messages; returns /stats at the peak (every poll answered)."""
    channels = [f"mem{round_}-{i}" for i in range(polls)]
    clients = []
    try:
        for ch in channels:
            s = socket.create_connection((node.host, node.port), timeout=10)
            s.sendall(f"GET /subscribe?channels={ch}&timeout=60 HTTP/1.1\r\nHost: x\r\n\r\n"
                      .encode())
            clients.append(s)
        node.wait_stat("waiting", lambda n: n == polls)
        blob = "x" * DATA
        for ch in channels:
            r = node.publish_batch([{"channels": [ch], "data": blob}] * batch)
            assert r.status == 201, r
        peak = node.wait_stat("waiting", lambda n: n == 0)
    finally:
        for s in clients:  # gone without reading their answers
            s.close()
    for ch in channels:
        assert node.request("DELETE", "/channels/" + q(ch)).status == 204
    wait_until(lambda: (st := node.stats())["messages"] == 0 and st["channels"] == 0
               and st["connections"] <= 1, timeout=20, msg="everything gone")
    return peak


# 63 answers of ~1 MB (the burst: what held it was the writer's cache of
# answered responses, then malloc); 200 of ~240 KB (with that cache released
# at once, malloc alone kept +60 MB)
@pytest.mark.parametrize(("polls", "batch"), [(63, 16), (200, 4)])
def test_rss_returns_near_its_start_after_bursts_of_large_fan_outs(start_node, polls, batch):
    node = start_node("--host", "127.0.0.1", *FLAGS)
    baseline = node.stats()["rss_bytes"]
    peaks = [_burst(node, r, polls, batch) for r in range(ROUNDS)]
    # the bursts were real: every answer carried its whole batch
    assert min(p["cached_bytes"] for p in peaks) >= polls * batch * DATA
    assert all(p["delivered"] >= (i + 1) * polls * batch for i, p in enumerate(peaks))
    # the node checks what malloc keeps once a second: give it a few looks
    last = {"rss": 0}

    def back() -> bool:
        last["rss"] = node.stats()["rss_bytes"]
        return last["rss"] <= baseline + SLACK

    peak = max(p["rss_bytes"] for p in peaks)
    try:
        wait_until(back, timeout=5.0, interval=0.1, msg="RSS back near its start")
    except AssertionError:
        raise AssertionError(
            f"RSS {last['rss'] / MB:.1f} MB with nothing held; started at "
            f"{baseline / MB:.1f} MB, peaked at {peak / MB:.1f} MB") from None
