"""A peer that stops answering slows nothing on the healthy nodes, then catches up."""
from __future__ import annotations

import os
import signal
import time

from pushup_cluster import publish, stats, subscribe, uniq, wait_until

# A link waits up to 10 s for a peer's answer; a publish or delivery that waited
# for the frozen peer would take at least that long.
PROMPT = 5.0


def ids_on(base: str, channel: str) -> list[str]:
    status, body = subscribe(base, [channel], timeout=0)
    assert status == 200, body
    return [m["id"] for m in body["messages"]]


def test_a_frozen_peer_slows_no_publish_and_no_delivery_then_catches_up(fresh_cluster):
    c = fresh_cluster(3, haproxy=False)
    a, b, frozen = c.bases
    pid = c.nodes[2].pid
    ch = uniq()
    os.kill(pid, signal.SIGSTOP)
    try:
        sent = []
        for i in range(30):
            t0 = time.monotonic()
            sent.append(publish(a, [ch], i)["id"])
            assert time.monotonic() - t0 < PROMPT, f"publish {i} waited for the frozen peer"
            t0 = time.monotonic()
            wait_until(lambda i=i: sent[i] in ids_on(b, ch), PROMPT, 0.02,
                       f"message {i} on the healthy peer")
        link = next(p for p in stats(a)["peers"] if p["url"] == frozen)
        assert link["state"] != "up" or link["queued"] >= 1
        assert link["queued"] >= 1
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: ids_on(frozen, ch) == sent, 30, 0.1, "the thawed peer caught up")
    wait_until(lambda: next(p for p in stats(a)["peers"] if p["url"] == frozen)["queued"] == 0,
               30, 0.1, "the link to the thawed peer drained")
