"""Durable Streams subscriptions (protocol §6-7) on the mesh: one node, the
home (the owner of ``/v1/stream/__ds/``), holds them; every request under
``__ds/`` through any node reaches it, and the other nodes tell it what
their streams do. Real ``pushup serve`` processes peered with each other and
a real webhook receiver of the test's own (docs/api.md, "Stream
subscriptions"; the protocol's own suite on 3 mesh nodes:
tests/conformance/test_durable_streams.py).
"""
from __future__ import annotations

import json
import signal

from deploy.launch import LocalCluster
from pushup.backplane.mesh.owners import member, owner_of
from tests.cluster.clients import request, uniq
from tests.e2e.test_stream_subscriptions import SUB, Receiver

HOME = "/v1/stream/__ds/"


def index_of_home(c: LocalCluster) -> int:
    members = [member(c.node_url(j)) for j in range(len(c.node_ports))]
    return members.index(owner_of(HOME, members))


def path_owned_by(c: LocalCluster, i: int, folder: str) -> str:
    """A fresh stream path in ``folder`` whose owner is node ``i``."""
    members = [member(c.node_url(j)) for j in range(len(c.node_ports))]
    while True:
        path = f"{folder}/{uniq('s')}"
        if owner_of(f"/v1/stream/{path}", members) == members[i]:
            return path


def make_stream(base: str, path: str, data: bytes = b"x") -> None:
    status, _, _ = request("PUT", f"{base}/v1/stream/{path}", data,
                           {"Content-Type": "text/plain"})
    assert status == 201


def append(base: str, path: str, data: bytes) -> None:
    status, _, _ = request("POST", f"{base}/v1/stream/{path}", data,
                           {"Content-Type": "text/plain"})
    assert status == 204


def subscribe(base: str, sub_id: str, pattern: str, url: str) -> tuple[int, dict]:
    body = json.dumps({"type": "webhook", "pattern": pattern, "webhook": {"url": url},
                       "lease_ttl_ms": 5000}).encode()
    status, _, answer = request("PUT", f"{base}{SUB}{sub_id}", body,
                                {"Content-Type": "application/json"})
    return status, json.loads(answer)


def pending_in(post: bytes) -> set[str]:
    return {link["path"] for link in json.loads(post)["streams"] if link["has_pending"]}


def test_a_subscription_through_any_node_links_and_wakes_the_streams_of_every_node(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=False)
    home = index_of_home(c)
    others = [i for i in range(3) if i != home]
    folder = uniq("g")
    held = {i: path_owned_by(c, i, folder) for i in range(3)}
    for i, path in held.items():  # each made through another node than its own
        make_stream(c.bases[(i + 1) % 3], path)
    receiver = Receiver(answer={"done": True})  # each wake acked by its answer
    try:
        sub_id = uniq("sub")
        status, made = subscribe(c.bases[others[0]], sub_id, f"{folder}/*", receiver.url)
        assert status == 201
        # the backfill asked every node: each stream linked at its tail, none pending
        status, _, seen = request("GET", f"{c.bases[others[1]]}{SUB}{sub_id}")
        links = json.loads(seen)["streams"]
        assert status == 200 and sorted(link["path"] for link in links) == sorted(held.values())
        assert receiver.count() == 0
        # an append on a stream another node holds, through the third: the home wakes
        append(c.bases[home], held[others[1]], b"y")
        [(first, _)] = receiver.wait(1)
        assert pending_in(first) == {held[others[1]]}
        # a stream made after the subscription, on a node that is not the home
        later = path_owned_by(c, others[0], folder)
        make_stream(c.bases[others[1]], later)
        second = receiver.wait(2)[1][0]
        assert pending_in(second) == {later}
        status, _, seen = request("GET", f"{c.bases[home]}{SUB}{sub_id}")
        assert later in {link["path"] for link in json.loads(seen)["streams"]}
        # /metrics says which node holds them, and that the others tell it
        for i in range(3):
            text = request("GET", f"{c.bases[i]}/metrics")[2].decode()
            assert f"pushup_stream_subscriptions_home {1.0 if i == home else 0.0}" in text
            assert f"pushup_stream_subscriptions_telling {0.0 if i == home else 1.0}" in text
    finally:
        receiver.close()


def test_news_told_while_the_home_is_down_wakes_once_it_is_back(fresh_cluster):
    c = fresh_cluster(3, haproxy=False, data_dirs=True)
    home = index_of_home(c)
    other = next(i for i in range(3) if i != home)
    folder = uniq("g")
    path = path_owned_by(c, other, folder)
    make_stream(c.bases[other], path)
    receiver = Receiver(answer={"done": True})
    try:
        assert subscribe(c.bases[other], uniq("sub"), f"{folder}/*", receiver.url)[0] == 201
        c.kill(home, signal.SIGKILL)
        append(c.bases[other], path, b"while the home is down")  # its news waits
        assert receiver.count() == 0
        c.start_node(home)  # the subscription kept by --data-dir; the news sent again
        [(woken, _)] = receiver.wait(1, guard=30)
        assert pending_in(woken) == {path}
    finally:
        receiver.close()
