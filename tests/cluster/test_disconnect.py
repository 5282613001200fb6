"""A client that goes away through HAProxy is forgotten by the node at once."""
from __future__ import annotations

import time

from pushup_cluster import open_held_poll, uniq, wait_waiting


def test_client_disconnect_through_haproxy_frees_the_node_subscription_within_2s(cluster):
    bases = cluster.bases
    wait_waiting(bases, 0, 10)  # nothing left over from other tests
    socks = [open_held_poll(cluster.front_url, [uniq("dc")], timeout=60) for _ in range(3)]
    try:
        # HAProxy round-robin spreads them over the nodes.
        wait_waiting(bases, 3, 10)
    finally:
        closed_at = time.monotonic()
        for s in socks:
            s.close()
    wait_waiting(bases, 0, 5)
    took = time.monotonic() - closed_at
    assert took < 2.0, f"nodes still held the subscriptions {took:.2f}s after the close"
