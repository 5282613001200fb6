"""A peer that stops answering slows nothing on the healthy nodes, then catches up."""
from __future__ import annotations

import os
import signal
import time

from tests.cluster.clients import publish, stats, subscribe, uniq, wait_until

# A hang guard, not a benchmark: a link waits up to 10 s for a peer's answer, so a
# publish or delivery that waited for the frozen peer would take at least that long.
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
    link0 = next(p for p in stats(a)["peers"] if p["url"] == frozen)
    assert link0["queued"] == 0, link0  # fresh_cluster waited for every link to be idle
    os.kill(pid, signal.SIGSTOP)
    try:
        sent = []
        for i in range(30):
            t0 = time.monotonic()
            sent.append(publish(a, [ch], i)["id"])
            took = time.monotonic() - t0
            assert took < PROMPT, (f"hang guard: publish {i} took {took:.1f} s; it waited for "
                                   f"the frozen peer (its link times out after 10 s)")
            wait_until(lambda i=i: sent[i] in ids_on(b, ch), PROMPT, 0.02,
                       f"message {i} on the healthy peer")
        # the frozen peer confirmed none of them: a still owes it exactly these 30
        link = next(p for p in stats(a)["peers"] if p["url"] == frozen)
        assert (link["queued"], link["sent"]) == (30, link0["sent"]), (link0, link)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: ids_on(frozen, ch) == sent, 30, 0.1, "the thawed peer caught up")
    wait_until(lambda: next(p for p in stats(a)["peers"] if p["url"] == frozen)["queued"] == 0,
               30, 0.1, "the link to the thawed peer drained")
