"""Durable Streams subscriptions (protocol §6-7) on Redis: the node that
holds their lease in Redis (the home) serves them, the others hand their
requests on and tell it their streams' news; the home SIGKILLed, another
node takes the lease, reads the subscriptions back from Redis with every
stream's tail, and wakes for what was appended meanwhile. Real ``pushup
serve`` processes on a real redis-server and a real webhook receiver of the
test's own (docs/api.md, "Stream subscriptions"; the protocol's suite on 3
nodes on Redis and on a Redis Cluster: tests/conformance/test_durable_streams.py).
"""
from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import pytest

from deploy.launch import LocalCluster
from tests.cluster.clients import request, uniq
from tests.cluster.test_stream_subscriptions_mesh import append, make_stream, pending_in, subscribe
from tests.e2e.test_stream_subscriptions import SUB, Receiver
from tests.toolkit import wait_until


def told_none(base: str) -> bool:
    """Whether the node at ``base`` stopped telling (the home held none)."""
    _, _, body = request("GET", f"{base}/stats")
    figures = json.loads(body)["stream_subscriptions"]
    return figures["news_sent"] > 0 and figures["telling"] == 0


@pytest.fixture
def on_redis(fresh_cluster, redis_server) -> Iterator[tuple[LocalCluster, str, str, Receiver]]:
    """3 nodes on one redis-server, a stream made through node 1 in a fresh
    folder, and a receiver answering each wake done: (cluster, folder, the
    stream's path, receiver)."""
    c = fresh_cluster(3, haproxy=False, engine=redis_server.url)
    folder = uniq("g")
    make_stream(c.bases[1], f"{folder}/a")
    receiver = Receiver(answer={"done": True})
    try:
        yield c, folder, f"{folder}/a", receiver
    finally:
        receiver.close()


def test_the_home_killed_another_node_takes_the_subscriptions_and_wakes_for_the_news(on_redis):
    c, folder, path, receiver = on_redis
    sub_id = uniq("sub")
    assert subscribe(c.bases[0], sub_id, f"{folder}/*", receiver.url)[0] == 201  # node 0: home
    append(c.bases[2], path, b"told by another node")
    [(first, _)] = receiver.wait(1)
    assert pending_in(first) == {path}
    c.kill(0, signal.SIGKILL)
    append(c.bases[1], path, b"while no node holds them")
    # within the lease's life and a check, node 1 or 2 takes them over: the
    # subscription, its ack, and the stream's tail past it
    woken = receiver.wait(2, guard=30)[1][0]
    assert pending_in(woken) == {path}
    assert json.loads(woken)["generation"] == json.loads(first)["generation"] + 1
    status, _, seen = request("GET", f"{c.bases[2]}{SUB}{sub_id}")
    assert status == 200 and [link["path"] for link in json.loads(seen)["streams"]] == [path]


def test_a_subscription_made_after_the_home_held_none_is_told_every_nodes_news(on_redis):
    c, folder, path, receiver = on_redis
    first = uniq("sub")
    assert subscribe(c.bases[0], first, f"{folder}/*", receiver.url)[0] == 201  # node 0: home
    assert request("DELETE", f"{c.bases[0]}{SUB}{first}")[0] == 204
    # node 2's news answered "none held": it stops telling
    append(c.bases[2], path, b"nobody subscribed")
    wait_until(lambda: told_none(c.bases[2]), 10, 0.05, "node 2 told the home, which held none")
    assert subscribe(c.bases[0], uniq("sub"), f"{folder}/*", receiver.url)[0] == 201
    append(c.bases[2], path, b"subscribed again")  # told: the new subscription was said
    [(woken, _)] = receiver.wait(1)
    assert pending_in(woken) == {path}
