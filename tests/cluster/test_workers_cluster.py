"""Nodes of ``--workers 2`` in a cluster: on the mesh (each worker a member,
siblings over Unix sockets) and on Redis, clients hopping between the nodes
through HAProxy; and what a 201 promises when the worker that gave it dies."""
from __future__ import annotations

import json
import os
import random
import signal

import pytest

from deploy.launch import LocalCluster
from pushup.ops.workers import UnixHTTPConnection
from tests.cluster.clients import (
    Poller,
    Publisher,
    check_exactly_once,
    jrequest,
    polling,
    published_by,
    retained,
    stats,
    uniq,
    wait_clients_have,
    wait_until,
)


def _all_linked(base: str, nodes: int) -> bool:
    """Every worker of the node behind ``base`` has its sibling and every
    other node up (any worker lists them all)."""
    workers = [w for w in stats(base)["workers"] if w["up"]]
    return len(workers) == 2 and all(
        len(w["peers"]) == nodes and all(p["state"] == "up" for p in w["peers"])
        for w in workers)


def _exactly_once_through_the_front(c: LocalCluster, seed: int) -> None:
    urls = [c.front_url, *c.bases]
    rng = random.Random(seed)
    channels = [uniq(f"wc{k}") for k in range(4)]
    clients = [Poller(f"client{k}", urls, rng.sample(channels, 2), timeout=2, limit=5)
               for k in range(6)]
    pubs = [Publisher(f"pub{k}", urls, channels, 60, seed=seed + k) for k in range(3)]
    with polling(clients, drain_rounds=3):  # a late duplicate, on any node, would show
        published = published_by(pubs)
        assert len(published) == 180
        wait_clients_have(clients, published, 30)
    for client in clients:
        assert not client.violations, (client.name, client.violations[:5])
    check_exactly_once(clients, published)
    # Publishes reached all four workers (two per node): each took some.
    for base in c.bases:
        taken = {w["worker"]: w["published"] for w in stats(base)["workers"]}
        assert len(taken) == 2 and all(n > 0 for n in taken.values()), taken


def _dead(pid: int) -> bool:
    """Gone, or a zombie its supervisor has not reaped yet (its sockets are closed)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return True


@pytest.fixture
def worker_nodes():
    with LocalCluster(nodes=2, node_args=["--workers", "2"]) as c:
        c.bases = [c.node_url(i) for i in range(2)]
        yield c


def test_two_nodes_of_two_workers_peered_deliver_exactly_once_through_haproxy(worker_nodes):
    c = worker_nodes
    for base in c.bases:
        wait_until(lambda base=base: _all_linked(base, 2), 30, 0.1,
                   "each worker linked to its sibling and to the other node")
        for w in stats(base)["workers"]:
            siblings = [p for p in w["peers"] if p["sibling"]]
            assert len(siblings) == 1 and siblings[0]["url"].startswith("http+unix://"), w
        node_peers = stats(base)["peers"]  # the node's peers: the other node only
        assert [p["url"] for p in node_peers] == [b for b in c.bases if b != base]
    _exactly_once_through_the_front(c, seed=70)


def test_a_201_from_a_worker_killed_right_after_it_is_still_served():
    """README ("What a 201 means", --workers): a 201 says a sibling worker
    holds the message, so SIGKILL of the worker that answered loses none."""
    with LocalCluster(nodes=1, haproxy=False, node_args=["--workers", "2"]) as c:
        base = c.node_url(0)
        wait_until(lambda: _all_linked(base, 1), 30, 0.1, "both workers linked")
        channel = uniq("kill")
        by_origin: dict[str, list[str]] = {}
        for n in range(40):
            status, body = jrequest("POST", base + "/publish",
                                    {"channels": [channel], "data": n})
            assert status == 201, body
            by_origin.setdefault(body["id"].rsplit("-", 1)[0], []).append(body["id"])
        workers = stats(base)["workers"]
        victim = next(w for w in workers if w["origin"] in by_origin)
        os.kill(victim["pid"], signal.SIGKILL)
        wait_until(lambda: _dead(victim["pid"]), 10, 0.01, "the worker gone")
        acknowledged = {mid for ids in by_origin.values() for mid in ids}
        # Whichever worker answers (the survivor, or the victim restarted and
        # caught up from it) holds every acknowledged message.
        for _ in range(10):
            assert set(retained(base, [channel])) == acknowledged


def test_a_201_counts_the_siblings_socket_and_survives_the_worker_that_gave_it():
    """README ("What a 201 means", --workers): the frame wholly in a sibling's
    Unix socket counts. The sibling is stopped (SIGSTOP: it reads nothing),
    the other worker answers 201 all the same and is SIGKILLed; the sibling,
    let go on, reads what its socket held and serves every message."""
    with LocalCluster(nodes=1, haproxy=False, node_args=["--workers", "2"]) as c:
        base = c.node_url(0)
        wait_until(lambda: _all_linked(base, 1), 30, 0.1, "both workers linked")
        victim, sibling = stats(base)["workers"]
        victim_url = next(p["url"] for p in sibling["peers"] if p["sibling"])
        channel = uniq("socket")
        acknowledged = set()
        os.kill(sibling["pid"], signal.SIGSTOP)
        try:
            for n in range(5):  # fewer than a link's window of unanswered batches
                status, body = _publish_to(victim_url, {"channels": [channel], "data": n})
                assert status == 201, body
                acknowledged.add(body["id"])
            os.kill(victim["pid"], signal.SIGKILL)
            wait_until(lambda: _dead(victim["pid"]), 10, 0.01, "the worker gone")
        finally:
            os.kill(sibling["pid"], signal.SIGCONT)
        for _ in range(10):  # the sibling, or the victim restarted and caught up from it
            assert set(retained(base, [channel])) == acknowledged


def _publish_to(url: str, message: dict) -> tuple[int, dict]:
    """POST /publish to one worker, on its private socket."""
    conn = UnixHTTPConnection(url, timeout=10)
    try:
        conn.request("POST", "/publish", json.dumps(message).encode(),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_two_nodes_of_two_workers_on_redis_deliver_exactly_once_through_haproxy():
    with LocalCluster(nodes=2, engine="redis", node_args=["--workers", "2"]) as c:
        c.bases = [c.node_url(i) for i in range(2)]
        for base in c.bases:
            assert stats(base)["engine"] == "redis"
        _exactly_once_through_the_front(c, seed=80)
