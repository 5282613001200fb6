"""What a 201 promises in the mesh (issue 9): a node SIGKILLed right after it
acknowledged a batch loses none of it (README, "What a 201 means")."""
from __future__ import annotations

import signal
import threading

import pytest

from tests.cluster.clients import jrequest, retained, stats, subscribe, uniq, wait_until


def read_all(base: str, channel: str, cursor: str) -> list[str]:
    """Every message after ``cursor`` on ``channel``, paged (timeout 0)."""
    ids: list[str] = []
    for _ in range(100):
        status, body = subscribe(base, [channel], since=cursor, timeout=0, limit=5)
        assert status == 200 and not body.get("gap"), (base, status, body)
        if not body["messages"]:
            return ids
        ids += [m["id"] for m in body["messages"]]
        cursor = body["cursor"]
    raise AssertionError("paging never ended")


@pytest.mark.parametrize("ack", ["peer", "all"])
def test_a_batch_acknowledged_then_sigkilled_at_once_is_served_by_the_survivors(
        fresh_cluster, ack):
    c = fresh_cluster(3, haproxy=False, node_args=["--publish-ack", ack])
    a, b, c_ = c.bases
    ch = uniq("ack")
    # A reader holds a poll on A (7 at most per answer): it reads part of the
    # batch from A before A dies, then hops with its cursor.
    first: dict = {}
    reader = threading.Thread(target=lambda: first.update(
        subscribe(a, [ch], timeout=20, limit=7)[1]), daemon=True)
    reader.start()
    wait_until(lambda: stats(a)["waiting"] == 1, 10, 0.01, "the reader's poll held on A")

    payload = {"messages": [{"channels": [ch], "data": i} for i in range(20)]}
    status, body = jrequest("POST", a + "/publish", payload)
    c.kill(0, signal.SIGKILL)  # at once: no drain, no flush to the peers
    assert status == 201, body  # acknowledged: a peer held all 20 before this answer
    ids = [m["id"] for m in body["messages"]]

    holders = [base for base in (b, c_) if set(retained(base, [ch])) == set(ids)]
    if ack == "all":
        assert holders == [b, c_]  # every live peer held them
    else:
        assert holders, "no survivor holds the acknowledged batch"
        # The other survivor gets them from the one that confirmed (repair):
        # A, their origin, is dead and will never send them.
        wait_until(lambda: all(set(retained(x, [ch])) == set(ids) for x in (b, c_)), 15,
                   0.05, "both survivors hold the batch")
    reader.join(15)
    assert [m["id"] for m in first["messages"]] == ids[:7]
    # The reader hops to either survivor with its cursor: the other 13, once, in order.
    for survivor in (b, c_):
        assert read_all(survivor, ch, first["cursor"]) == ids[7:]


def test_with_publish_ack_local_the_201_comes_at_once_and_the_peers_still_get_it(
        fresh_cluster):
    c = fresh_cluster(2, haproxy=False, node_args=["--publish-ack", "local"])
    a, b = c.bases
    ch = uniq("local")
    assert stats(a)["publish_ack"] == "local"
    status, body = jrequest("POST", a + "/publish", {"channels": [ch], "data": 1})
    assert status == 201, body
    wait_until(lambda: list(retained(b, [ch])) == [body["id"]], 10, 0.02, "the peer has it")


def test_a_survivor_that_missed_a_dead_nodes_batch_gets_it_from_the_other(fresh_cluster):
    c = fresh_cluster(3, haproxy=False, node_args=["--publish-ack", "peer"])
    a, b, c_ = c.bases
    ch = uniq("repair")
    c.nodes[2].send_signal(signal.SIGSTOP)  # C answers nothing meanwhile
    try:
        # A's link to C sends this one (with B's, after the same 3 ms) and
        # waits for C's answer: one POST in flight per link, so the batch
        # after it cannot go to C...
        status, one = jrequest("POST", a + "/publish", {"channels": [ch], "data": "one"})
        assert status == 201, one  # B confirmed it
        payload = {"messages": [{"channels": [ch], "data": i} for i in range(20)]}
        status, body = jrequest("POST", a + "/publish", payload)
        assert status == 201, body  # B confirmed it
        c.kill(0, signal.SIGKILL)  # ...and A dies before it could
    finally:
        c.nodes[2].send_signal(signal.SIGCONT)
    ids = [one["id"]] + [m["id"] for m in body["messages"]]
    assert read_all(b, ch, "0") == ids
    # A will never send the batch to C: C gets it from B, its live peer.
    wait_until(lambda: set(retained(c_, [ch])) == set(ids), 15, 0.05, "C repaired from B")
    assert read_all(c_, ch, "0") == ids


def test_a_whole_cluster_restarted_tells_a_client_behind_of_the_gap_once(fresh_cluster):
    c = fresh_cluster(2, haproxy=False)
    a, b = c.bases
    ch = uniq("restart")
    for base in (a, b):
        jrequest("POST", base + "/publish", {"channels": [ch], "data": "read"})
    wait_until(lambda: len(retained(a, [ch])) == 2, 10, 0.02, "both messages on A")
    _, read = subscribe(a, [ch], since="0", timeout=0)
    for base in (a, b):  # published after the client read: lost with the restart
        jrequest("POST", base + "/publish", {"channels": [ch], "data": "unread"})
    c.kill(0, signal.SIGKILL)
    c.kill(1, signal.SIGKILL)
    c.start_node(0)
    c.start_node(1)
    # Each node knows the other's new epoch once its link said hello (both up).
    wait_until(lambda: all(p["state"] == "up" for x in (a, b) for p in stats(x)["peers"]),
               10, 0.02, "both links up")
    cursors = {}
    for base in (a, b):
        _, body = subscribe(base, [ch], since=read["cursor"], timeout=0)
        assert body["gap"] is True and body["messages"] == [], (base, body)
        cursors[base] = body["cursor"]
    # Then both restarted nodes publish, each becoming known to the other at
    # its new epoch: the client gets the news, and is not told twice.
    new = [jrequest("POST", base + "/publish", {"channels": [ch], "data": "new"})[1]["id"]
           for base in (a, b)]
    for base in (a, b):
        wait_until(lambda b_=base: set(new) <= set(retained(b_, [ch])), 10, 0.02, "both")
        _, body = subscribe(base, [ch], since=cursors[base], timeout=0)
        assert "gap" not in body and [m["id"] for m in body["messages"]] == new, (base, body)
