"""Two peered nodes, a peer with the wrong secret, --workers."""
from __future__ import annotations

import pytest

from tests.e2e.support import assert_error, assert_json_ok, free_port, spawn, stop, uniq, wait_until


class Cluster:
    def __init__(self, secrets=("s3cret", "s3cret")):
        pa, pb = free_port(), free_port()
        self.a = spawn("--node-id", "node-a", "--peer", f"http://127.0.0.1:{pb}",
                       "--cluster-secret", secrets[0], port=str(pa))
        try:
            self.b = spawn("--node-id", "node-b", "--peer", f"http://127.0.0.1:{pa}",
                           "--cluster-secret", secrets[1], port=str(pb))
        except BaseException:
            stop(self.a)
            raise

    def close(self):
        rcs = [stop(self.a), stop(self.b)]
        assert rcs == [0, 0], rcs


def wait_peers_up(n):
    def up():
        peers = n.stats()["peers"]
        return len(peers) == 1 and peers[0]["state"] == "up"
    wait_until(up, 20, interval=0.1, msg="peer up")


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        wait_peers_up(c.a)
        wait_peers_up(c.b)
    except BaseException:
        c.close()
        raise
    yield c
    c.close()


def test_peers_listed_in_stats(cluster):
    for n, other in ((cluster.a, cluster.b), (cluster.b, cluster.a)):
        wait_peers_up(n)
        peers = n.stats()["peers"]
        assert len(peers) == 1
        p = peers[0]
        assert set(p) >= {"url", "state", "queued", "sent"}
        assert p["url"].rstrip("/") == f"http://127.0.0.1:{other.port}"
        assert isinstance(p["queued"], int) and isinstance(p["sent"], int)


def test_publish_on_one_node_wakes_subscriber_on_other(cluster):
    a, b = cluster.a, cluster.b
    ch = uniq("x")
    cur = b.subscribe([ch])["cursor"]
    p = b.subscribe_async([ch], since=cur, timeout=60)
    b.wait_subscribers(ch, 1)
    sent0 = a.stats()["peers"][0]["sent"]
    pub_b0 = b.stats()["published"]
    pub = a.publish([ch], {"from": "a"})
    body = assert_json_ok(p.result(10))
    assert [m["id"] for m in body["messages"]] == [pub["id"]]
    assert body["messages"][0]["timestamp"] == pub["timestamp"]
    assert body["messages"][0]["data"] == {"from": "a"}
    wait_until(lambda: a.stats()["peers"][0]["sent"] > sent0, 10, msg="peer sent counter")
    # published counts only publishes accepted on this node; messages counts every origin
    assert b.stats()["published"] == pub_b0
    assert assert_json_ok(b.channel_info(ch))["messages"] == 1


def test_exactly_once_across_nodes(cluster):
    a, b = cluster.a, cluster.b
    ch = uniq("eo")
    pubs = [(a if i % 2 else b).publish([ch], i) for i in range(30)]
    for n in (a, b):
        wait_until(lambda n=n: n.channel_info(ch).json.get("messages") == 30, 15,
                   msg="replication")
    ids_all = [p["id"] for p in pubs]
    assert len(set(ids_all)) == 30  # unique across the cluster
    seen, cursor, k = [], "0", 0
    while True:
        node = (a, b)[k % 2]
        k += 1
        body = node.subscribe([ch], since=cursor, limit=4)
        if not body["messages"]:
            break
        seen += [m["id"] for m in body["messages"]]
        cursor = body["cursor"]
        assert k < 50
    assert sorted(seen) == sorted(ids_all) and len(seen) == 30
    # per node of origin, in publish order
    for parity in (0, 1):
        mine = [p["id"] for i, p in enumerate(pubs) if i % 2 == parity]
        assert [i for i in seen if i in mine] == mine


def test_cursor_from_one_node_works_on_the_other_while_held(cluster):
    a, b = cluster.a, cluster.b
    ch = uniq("mix")
    first = b.publish([ch], 1)
    body = a.subscribe([ch], since="0", timeout=10)
    assert [m["id"] for m in body["messages"]] == [first["id"]]
    p = b.subscribe_async([ch], since=body["cursor"], timeout=60)
    b.wait_subscribers(ch, 1)
    second = a.publish([ch], 2)
    got = assert_json_ok(p.result(10))
    assert [m["id"] for m in got["messages"]] == [second["id"]]


def test_peer_with_wrong_secret_is_refused():
    c = Cluster(secrets=("right", "wrong"))
    try:
        ch = uniq("sec")
        # its only peer refuses us: stored and served here, answered 202
        assert_json_ok(c.a.publish_raw([ch], "secret stuff"), 202)
        # a's link keeps offering b everything it holds; wait until b has refused two
        # more of its requests: the second was built after the first was refused,
        # so after the publish, and carried the message.
        refused = c.b.stats()["peer_refused"]
        wait_until(lambda: c.b.stats()["peer_refused"] >= refused + 2, 20, interval=0.05,
                   msg="b refusing two more of a's peer requests")
        assert_error(c.b.channel_info(ch), 404, "no_such_channel")  # b never heard of it
        assert c.b.stats()["messages"] == 0
        assert c.b.subscribe([ch], since="0", timeout=0)["messages"] == []
        # neither side ever sees the other as up
        assert c.a.stats()["peers"][0]["state"] != "up"
        assert c.b.stats()["peers"][0]["state"] != "up"
    finally:
        c.close()


def test_peer_down_does_not_block_publish(start_node):
    dead = free_port()
    n = start_node("--peer", f"http://127.0.0.1:{dead}", "--cluster-secret", "s")
    ch = uniq("down")
    # its only peer is down: stored and served here, answered 202 (not held elsewhere)
    pub = assert_json_ok(n.publish_raw([ch], 1), 202)
    assert [m["id"] for m in n.subscribe([ch], since="0")["messages"]] == [pub["id"]]
    peers = n.stats()["peers"]
    assert len(peers) == 1 and peers[0]["state"] in ("connecting", "down")


def test_workers_share_one_port():
    n = spawn("--workers", "2")
    try:
        # every worker ready: /health 200 on 12 fresh connections in a row
        streak = [0]

        def healthy():
            streak[0] = streak[0] + 1 if n.get("/health").status == 200 else 0
            return streak[0] >= 12
        wait_until(healthy, 20, interval=0.01, msg="all workers healthy")
        ch = uniq("w")
        pubs = [n.publish([ch], i) for i in range(20)]  # one connection each: both workers

        def all_visible():
            return all(len(n.subscribe([ch], since="0")["messages"]) == 20 for _ in range(6))
        wait_until(all_visible, 15, interval=0.05, msg="every worker sees every message")
        seen, cursor = [], "0"
        for _ in range(30):
            body = n.subscribe([ch], since=cursor, limit=3)
            if not body["messages"]:
                break
            seen += [m["id"] for m in body["messages"]]
            cursor = body["cursor"]
        assert sorted(seen) == sorted(p["id"] for p in pubs) and len(seen) == 20
        # held polls on any worker are answered by a publish on any worker
        cur = n.subscribe([ch])["cursor"]
        polls = [n.subscribe_async([ch], since=cur, timeout=60) for _ in range(6)]
        pub = n.publish([ch], "all")
        for p in polls:
            assert [m["id"] for m in assert_json_ok(p.result(15))["messages"]] == [pub["id"]]
    finally:
        assert stop(n) == 0


def test_no_loss_no_duplicates_while_publishing_on_both_nodes(cluster):
    """Cursor-following clients that alternate nodes receive every message exactly once."""
    import threading
    import time
    a, b = cluster.a, cluster.b
    ch = uniq("live")
    total = 2 * 60
    results, errors = {}, []

    def client(k):
        try:
            cur = (a, b)[k % 2].subscribe([ch], timeout=0)["cursor"]
            seen, i = [], k
            deadline = time.monotonic() + 60
            while len(seen) < total and time.monotonic() < deadline:
                body = (a, b)[i % 2].subscribe([ch], since=cur, timeout=5, limit=9)
                i += 1
                seen += [m["data"] for m in body["messages"]]
                cur = body["cursor"]
            results[k] = seen
        except BaseException as e:
            errors.append(e)

    clients = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    for t in clients:
        t.start()
    wait_until(lambda: sum(n.stats()["waiting"] for n in (a, b)) >= 4, 20, msg="clients held")

    def publisher(node, base):
        for i in range(60):
            node.publish([ch], base + i)

    pubs = [threading.Thread(target=publisher, args=(a, 0), daemon=True),
            threading.Thread(target=publisher, args=(b, 1000), daemon=True)]
    for t in pubs:
        t.start()
    for t in pubs + clients:
        t.join(90)
    assert not errors, errors
    expected = sorted(list(range(60)) + list(range(1000, 1060)))
    for k in range(4):
        got = results[k]
        assert len(got) == total and sorted(got) == expected, (k, len(got))
        for lo in (0, 1000):
            mine = [x for x in got if lo <= x < lo + 1000]
            assert mine == sorted(mine), (k, lo)  # per origin, in publish order


def test_a_since_now_cursor_works_on_the_other_node(cluster):
    a, b = cluster.a, cluster.b
    ch = uniq("now")
    a.publish([ch], "old")
    wait_until(lambda: b.subscribe([ch], since="0", timeout=0)["messages"], 20,
               msg="the old message reached b")
    start = a.subscribe([ch], since="now", timeout=0)
    assert start["messages"] == []
    p = b.subscribe_async([ch], since=start["cursor"], timeout=60)
    b.wait_subscribers(ch, 1)
    new = a.publish([ch], "new")
    got = assert_json_ok(p.result(10))
    assert [m["id"] for m in got["messages"]] == [new["id"]]


def test_an_event_stream_resumes_on_the_other_node_exactly_once(cluster):
    from tests.sse_client import SSE, data_of

    a, b = cluster.a, cluster.b
    ch = uniq("sse")
    first = SSE(a.host, a.port, [ch])
    try:
        a.publish([ch], 1)
        a.publish([ch], 2)
        got = first.events(2)
        assert b"text/event-stream" in first.head
        assert data_of(got) == [1, 2]
    finally:
        first.close()
    wait_until(lambda: len(b.subscribe([ch], since="0", timeout=0)["messages"]) == 2, 20,
               msg="a's messages reached b")
    b.publish([ch], 3)
    second = SSE(b.host, b.port, [ch], last_event_id=got[0]["id"], since="0")
    try:
        assert data_of(second.events(2)) == [2, 3]  # from event 1 on: 2 once, then 3
    finally:
        second.close()
