"""A member restarted empty gets its peer's history again, so what its peer
acknowledged survives the peer.

Node b is killed and restarted while node a is frozen (SIGSTOP): b gets no
snapshot and starts with an empty cache (after the catch-up wait, as the
README says). When a resumes, its link to b reconnects to a new process that
holds none of a's messages: it must send them again, not go on from where
the old process had acknowledged. Otherwise the 40 messages answered 201
live on a alone, and a's death loses them with no gap reported anywhere.
"""
from __future__ import annotations

import os
import signal

from tests.cluster.clients import publish, retained, uniq, wait_until


def test_a_peer_restarted_empty_gets_the_history_back_and_it_survives_the_origin(
        fresh_cluster):
    c = fresh_cluster(2, haproxy=False)
    a, b = c.bases
    channel = uniq("restart")
    ids = {publish(a, [channel], {"n": i})["id"] for i in range(40)}  # each a 201
    frozen = c.nodes[0]
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        c.kill(1)
        c.start_node(1, timeout=60)  # no snapshot from a frozen peer: starts empty
        assert retained(b, [channel]) == {}
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    wait_until(lambda: set(retained(b, [channel])) == ids, 20, 0.2,
               "b holding all 40 of a's messages again")
    c.kill(0)
    assert set(retained(b, [channel])) == ids
