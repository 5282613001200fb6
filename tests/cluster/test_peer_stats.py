"""/stats `peers`: every node lists the others, their state, queue and deliveries."""
from __future__ import annotations

import signal

from tests.cluster.clients import publish, stats, subscribe, uniq, wait_until


def links(base: str) -> dict[str, dict]:
    return {p["url"]: p for p in stats(base)["peers"]}


def test_peers_listed_up_then_down_while_killed_then_up_after_restart(fresh_cluster):
    c = fresh_cluster(3, haproxy=False)
    bases = c.bases
    # Each node lists exactly the others.
    for b in bases:
        assert set(links(b)) == set(bases) - {b}, (b, links(b))
    wait_until(lambda: all(p["state"] == "up" for b in bases for p in links(b).values()),
               20, 0.1, "every link up")

    # `sent` counts messages delivered to each peer.
    before = {b: links(b) for b in bases}
    ch = uniq("ps")
    for k, b in enumerate(bases):
        for n in range(k + 2):  # 2, 3, 4 messages from node1, node2, node3
            publish(b, [ch], n)

    def delivered():
        for k, b in enumerate(bases):
            now = links(b)
            for url, p in now.items():
                if p["sent"] - before[b][url]["sent"] != k + 2 or p["queued"] != 0:
                    return False
        return True
    wait_until(delivered, 15, 0.05, "sent grows by the messages published on each node")

    # Kill node3: the others show it connecting or down, and queue for it.
    victim = bases[2]
    c.kill(2, signal.SIGKILL)
    alive = bases[:2]
    wait_until(lambda: all(links(b)[victim]["state"] in ("connecting", "down")
                           for b in alive), 15, 0.05, "the dead peer no longer up")
    sent_at_kill = {b: links(b)[victim]["sent"] for b in alive}
    queued_before = {b: links(b)[victim]["queued"] for b in alive}
    for b in alive:
        for n in range(5):
            publish(b, [ch], {"while_down": n})
    for b in alive:
        link = links(b)[victim]
        assert link["state"] in ("connecting", "down"), link
        assert link["queued"] >= queued_before[b] + 5, (b, link, queued_before[b])
        assert link["sent"] == sent_at_kill[b], link
        # The live link between the survivors is unaffected.
        other = next(x for x in alive if x != b)
        wait_until(lambda b=b, other=other: links(b)[other]["queued"] == 0
                   and links(b)[other]["state"] == "up", 10, 0.05, "survivor link idle")
    # After a few failed attempts the peer is shown as down.
    wait_until(lambda: all(links(b)[victim]["state"] == "down" for b in alive), 20, 0.1,
               "the dead peer shown as down")

    # Restart it: back up, nothing queued, on both sides.
    c.start_node(2)
    wait_until(lambda: all(links(b)[victim]["state"] == "up" and links(b)[victim]["queued"] == 0
                           for b in alive), 20, 0.1, "the restarted peer up with queue 0")
    wait_until(lambda: all(p["state"] == "up" and p["queued"] == 0
                           for p in links(victim).values()), 20, 0.1,
               "the restarted node's own links up")
    assert set(links(victim)) == set(alive)
    # What was queued for it (5 from each survivor) now counts as delivered,
    # and the restarted node serves every retained message of the channel.
    for b in alive:
        assert links(b)[victim]["sent"] >= sent_at_kill[b] + 5, (links(b)[victim], sent_at_kill)
    status, body = subscribe(victim, [ch], timeout=0)
    assert status == 200, body
    assert len(body["messages"]) == 2 + 3 + 4 + 10, body
