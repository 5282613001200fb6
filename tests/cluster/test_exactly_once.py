"""No loss, no duplicates: polls spread over every node, publishes on every node."""
from __future__ import annotations

import random

from tests.cluster.clients import (
    Poller,
    Publisher,
    check_exactly_once,
    peers_idle,
    polling,
    published_by,
    uniq,
    wait_clients_have,
    wait_until,
)


def test_round_robin_clients_get_every_message_of_their_channels_exactly_once(cluster):
    rng = random.Random(20261122)
    channels = [uniq(f"eo{k}") for k in range(6)]
    direct = cluster.bases
    front = [cluster.front_url]
    clients = []
    for k in range(12):
        mine = rng.sample(channels, rng.randint(2, 3))
        # Half the clients go round-robin over the nodes, a third through
        # HAProxy only, the rest alternate between HAProxy and the nodes.
        urls = direct if k % 2 == 0 else front if k % 3 == 1 else [*front, *direct]
        clients.append(Poller(f"client{k}", urls, mine, timeout=2, limit=5))
    publishers = [Publisher(f"pub{k}", [*direct, *front], channels, 150, seed=k)
                  for k in range(3)]
    with polling(clients):
        published = published_by(publishers)
        assert len(published) == 450
        assert {m.split(".")[0] for m in published} == {"node1", "node2", "node3"}
        wait_clients_have(clients, published, 30)
        wait_until(lambda: peers_idle(cluster.bases), 20, 0.1, "peer queues empty")
    check_exactly_once(clients, published)
    # The clients really were spread: each made many polls.
    assert all(c.polls >= 10 for c in clients), [(c.name, c.polls) for c in clients]
