"""A client that goes away through HAProxy is forgotten by the node at once."""
from __future__ import annotations

from tests.cluster.clients import open_held_poll, uniq, wait_waiting

POLL_TIMEOUT = 60  # the held polls' own timeout
GUARD = 20  # well below it: only a node that noticed the disconnect frees them in time


def test_client_disconnect_through_haproxy_frees_the_node_subscription(cluster):
    bases = cluster.bases
    wait_waiting(bases, 0, 10)  # nothing left over from other tests
    socks = [open_held_poll(cluster.front_url, [uniq("dc")], timeout=POLL_TIMEOUT)
             for _ in range(3)]
    try:
        # HAProxy round-robin spreads them over the nodes.
        wait_waiting(bases, 3, 10)
    finally:
        for s in socks:
            s.close()
    # The event: every node's `waiting` back to 0. Without disconnect detection that
    # would happen only at the polls' 60 s timeout; the guard turns that into a failure.
    try:
        wait_waiting(bases, 0, GUARD)
    except AssertionError as e:
        raise AssertionError(f"hang guard: the nodes still held the closed clients' polls "
                             f"{GUARD} s after the close (their timeout is {POLL_TIMEOUT} s): "
                             f"the disconnect did not reach them; {e}") from None
