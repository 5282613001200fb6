"""--engine redis: real nodes on a real Redis, one plain redis-server and a real
Redis Cluster; the engine's contract holds on both.

Nodes share nothing but Redis's logs: no node talks to another. Each test of
the contract runs twice (``redis`` fixture, tests/cluster/redis_backends.py):
on a ``redis-server`` of its own (a free loopback port, no persistence), and on
a Redis Cluster of 3 primaries this module starts once and empties before each
test (``FLUSHALL``; nodes, paused or killed, restarted first). Everything is
stopped by PID. A test that can apply to one server only says why.
"""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from deploy.redis_cluster import RedisCluster
from deploy.redis_server import RedisServer
from pushup.backplane.redis.partitions import keys_of
from tests.cluster.clients import (
    Poller,
    Publisher,
    check_exactly_once,
    jrequest,
    polling,
    publish,
    publish_batch,
    published_by,
    request,
    retained,
    stats,
    subscribe,
    uniq,
    wait_clients_have,
    wait_until,
)
from tests.cluster.redis_backends import Cluster, OneServer, running_cluster


@pytest.fixture(scope="module")
def shared_redis_cluster() -> Iterator[RedisCluster]:
    """3 primaries, no replica (no test here fails one over), for the whole module."""
    yield from running_cluster(replicas=0)


@pytest.fixture(params=["server", "cluster"])
def redis(request: pytest.FixtureRequest) -> Iterator[OneServer | Cluster]:
    """The Redis of this test: a fresh redis-server, or the module's cluster emptied."""
    if request.param == "cluster":
        cluster = Cluster(request.getfixturevalue("shared_redis_cluster"))
        cluster.clean()
        try:
            yield cluster
        finally:
            cluster.clean()  # resumed and running again, whatever the test did to it
        return
    server = RedisServer()
    server.start()
    try:
        yield OneServer(server)
    finally:
        server.stop()


def publish_once_redis_answers(base: str, channel: str, data: object = 9) -> dict:
    """Publish, retrying while the node answers 503 (Redis back, connections not
    yet) or 504 (sent, no answer): with one Idempotency-Key, so it is stored once."""
    done: list[dict] = []
    key = uniq("once")

    def published() -> bool:
        status, body = jrequest("POST", base + "/publish", {"channels": [channel], "data": data},
                                headers={"Idempotency-Key": key})
        if status == 201:
            done.append(body)
        else:
            assert (status, body["error"]["code"]) in ((503, "engine_unavailable"),
                                                       (504, "outcome_unknown")), body
        return status == 201

    wait_until(published, 20, 0.1, "publishing works again")
    return done[0]


def test_three_nodes_on_one_redis_deliver_exactly_once_in_order_to_hopping_clients(
        fresh_cluster, redis):
    c = fresh_cluster(3, haproxy=True, engine=redis.url)
    assert {stats(b)["engine"] for b in c.bases} == {"redis"}
    rng = random.Random(20261123)
    channels = [uniq(f"re{k}") for k in range(5)]
    clients = []
    for k in range(9):
        urls = c.bases if k % 3 else [c.front_url, *c.bases]
        clients.append(Poller(f"client{k}", urls, rng.sample(channels, 2), timeout=2, limit=5))
    publishers = [Publisher(f"pub{k}", [*c.bases, c.front_url], channels, 120, seed=k)
                  for k in range(3)]
    with polling(clients):
        published = published_by(publishers)
        assert len(published) == 360
        # One log per partition: every id is of its first channel's partition's
        # origin, numbered by that log once (its other entries are notes of
        # where a channel has messages: a message's numbers are distinct, not
        # necessarily consecutive).
        by_origin: dict[str, list[int]] = {}
        for m in published:
            origin, seq = m.rsplit("-", 1)
            by_origin.setdefault(origin, []).append(int(seq))
        tags = {keys_of(ch).tag for ch in channels}
        assert {origin.split(".")[0] for origin in by_origin} <= tags
        for seqs in by_origin.values():
            assert len(set(seqs)) == len(seqs) and min(seqs) >= 1
        wait_clients_have(clients, published, 30)
    check_exactly_once(clients, published)
    # Each node read every message from the log, whichever node accepted it.
    for base in c.bases:
        assert len(retained(base, channels)) == 360


def test_a_publish_is_held_on_every_node_and_a_held_poll_elsewhere_is_answered(
        fresh_cluster, redis):
    c = fresh_cluster(2, haproxy=False, engine=redis.url)
    ch = uniq("wake")
    _, body = subscribe(c.bases[1], [ch], since="now", timeout=0)
    got: list[dict] = []
    poll = threading.Thread(target=lambda: got.append(
        subscribe(c.bases[1], [ch], since=body["cursor"], timeout=20)[1]))
    poll.start()
    wait_until(lambda: stats(c.bases[1])["waiting"] == 1, 10, 0.02, "the poll is held")
    receipt = publish(c.bases[0], [ch], {"n": 1})
    poll.join(20)
    assert [m["id"] for m in got[0]["messages"]] == [receipt["id"]]
    assert got[0]["messages"][0]["data"] == {"n": 1}
    # The log in Redis holds it under the id the publisher got.
    seq = receipt["id"].rsplit("-", 1)[1]
    entry = redis.cli("XRANGE", keys_of(ch).log, f"{seq}-0", f"{seq}-0")
    assert entry and entry[0][0] == f"{seq}-0".encode()


def test_explicit_channels_are_the_clusters(fresh_cluster, redis):
    c = fresh_cluster(2, haproxy=False, engine=redis.url)
    status, made = jrequest("POST", c.bases[0] + "/channels", {"name": "room", "ttl": 600})
    assert status == 201 and made["channel"] == "room"
    status, again = jrequest("POST", c.bases[1] + "/channels", {"name": "room"})
    assert status == 409 and again["error"]["code"] == "channel_exists"
    wait_until(lambda: jrequest("GET", c.bases[1] + "/channels/room")[0] == 200, 10, 0.02,
               "node 2 knows the channel")
    status, info = jrequest("GET", c.bases[1] + "/channels/room")
    assert info["expires_at"] == made["expires_at"]
    status, _, _ = request("DELETE", c.bases[1] + "/channels/room")
    assert status == 204
    wait_until(lambda: jrequest("GET", c.bases[0] + "/channels/room")[0] == 404, 10, 0.02,
               "node 1 saw the delete")


def test_a_restarted_node_loads_the_log_before_it_is_healthy(fresh_cluster, redis):
    c = fresh_cluster(2, haproxy=False, engine=redis.url)
    ch = uniq("boot")
    receipts = publish_batch(c.bases[0], [([ch], i) for i in range(50)])
    # Node 2 reads the log a moment after node 1's 201, as a mesh peer would.
    wait_until(lambda: receipts[-1]["id"] in retained(c.bases[1], [ch]), 10, 0.02, "read")
    _, first = subscribe(c.bases[1], [ch], since="0", timeout=0, limit=20)
    assert [m["id"] for m in first["messages"]] == [r["id"] for r in receipts[:20]]
    c.kill(1)  # SIGKILL
    c.start_node(1)  # returns once /health is 200
    # The first request after /health turned 200 finds the whole log loaded;
    # the cursor from before the crash goes on exactly where it was.
    _, rest = subscribe(c.bases[1], [ch], since=first["cursor"], timeout=0, limit=100)
    assert [m["id"] for m in rest["messages"]] == [r["id"] for r in receipts[20:]]
    assert "gap" not in rest


def test_while_redis_is_paused_publishes_get_504_polls_are_answered_and_all_resumes(
        fresh_cluster, redis):
    c = fresh_cluster(2, haproxy=False, engine=redis.url)
    ch = uniq("pause")
    before = publish(c.bases[0], [ch], "before")
    for base in c.bases:  # a reader on each node: both follow the channel
        wait_until(lambda b=base: before["id"] in retained(b, [ch]), 10, 0.05, "read")
    redis.pause()  # SIGSTOP
    try:
        status, headers, raw = request("POST", c.bases[0] + "/publish",
                                       json.dumps({"channels": [ch], "data": "during"}).encode(),
                                       timeout=20)
        body = json.loads(raw)
        # Sent, and no answer: it may run when Redis resumes, so not "nothing stored".
        assert status == 504 and body["error"]["code"] == "outcome_unknown"
        # Polls are answered from memory on both nodes.
        for base in c.bases:
            status, got = subscribe(base, [ch], since="0", timeout=0)
            assert status == 200 and [m["id"] for m in got["messages"]] == [before["id"]]
        # A channel no reader asked for before cannot be read now: 503, not silence.
        status, got = subscribe(c.bases[1], [uniq("cold")], since="0", timeout=0)
        assert status == 503 and got["error"]["code"] == "engine_unavailable", got
    finally:
        redis.resume()  # SIGCONT
    # Publishing works again once Redis answers (the first tries may still get
    # 503 while the dropped connection comes back).
    after = publish_once_redis_answers(c.bases[0], ch, "after")
    wait_until(lambda: after["id"] in retained(c.bases[1], [ch]), 10, 0.05,
               "node 2 got the publish after the pause")


def test_redis_restarted_empty_is_one_gap_and_no_duplicate(fresh_cluster, redis):
    c = fresh_cluster(2, haproxy=False, engine=redis.url)
    ch = uniq("empty")
    old = [publish(c.bases[0], [ch], i)["id"] for i in range(3)]
    wait_until(lambda: old[-1] in retained(c.bases[1], [ch]), 10, 0.02, "node 2 read them")
    _, seen = subscribe(c.bases[1], [ch], since="0", timeout=0)
    assert [m["id"] for m in seen["messages"]] == old
    redis.restart_empty()  # same port(s), nothing kept
    new = [publish_once_redis_answers(c.bases[0], ch)["id"]]
    assert new[0].rsplit("-", 1)[0] != old[0].rsplit("-", 1)[0]  # a new epoch
    for base in c.bases:
        wait_until(lambda b=base: new[0] in retained(b, [ch]), 10, 0.05, "the new log is read")
        status, body = subscribe(base, [ch], since=seen["cursor"], timeout=0)
        # The client is told once that the log it read is gone, and gets what
        # came after; the old messages are not served again.
        assert body["gap"] is True and [m["id"] for m in body["messages"]] == new
        status, again = subscribe(base, [ch], since=body["cursor"], timeout=0)
        assert "gap" not in again and again["messages"] == []


def test_a_node_away_while_redis_trimmed_past_it_reports_the_gap(fresh_cluster, redis):
    # Small stream nodes, so MAXLEN ~ trims close to the asked length.
    assert redis.each("CONFIG", "SET", "stream-node-max-entries", "10") == [b"OK"] * len(
        redis.each("PING"))
    try:
        c = fresh_cluster(2, haproxy=False, engine=redis.url,
                          node_args=["--redis-maxlen", "20"])
        ch = uniq("trim")
        first = publish(c.bases[0], [ch], "first")
        wait_until(lambda: first["id"] in retained(c.bases[1], [ch]), 10, 0.02, "read")
        _, seen = subscribe(c.bases[1], [ch], since="0", timeout=0)
        assert [m["id"] for m in seen["messages"]] == [first["id"]]
        c.nodes[1].send_signal(signal.SIGSTOP)  # node 2 reads nothing meanwhile ...
        # ... and is away from Redis: its subscription is cut (node 1's too, which
        # comes back at once), so no notification waits in its socket for it
        assert sum(redis.each("CLIENT", "KILL", "TYPE", "pubsub")) >= 1  # node 2 follows ch
        try:
            receipts = publish_batch(c.bases[0], [([ch], i) for i in range(200)])
            head = int(redis.cli("XRANGE", keys_of(ch).log, "-", "+", "COUNT", 1)[0][0]
                       .split(b"-")[0])
            assert head > 2  # the log no longer holds what node 2 lacks
        finally:
            c.nodes[1].send_signal(signal.SIGCONT)
        last = receipts[-1]["id"]
        wait_until(lambda: last in retained(c.bases[1], [ch]), 20, 0.05, "node 2 caught up")
        status, body = subscribe(c.bases[1], [ch], since=seen["cursor"], timeout=0,
                                 limit=1000)
        assert status == 200 and body["gap"] is True
        ids = [m["id"] for m in body["messages"]]
        assert ids == [r["id"] for r in receipts][-len(ids):] and last == ids[-1]
    finally:
        redis.each("CONFIG", "SET", "stream-node-max-entries", "100")  # Redis's default


@pytest.mark.parametrize(("flags", "said"), [
    (["--engine", "redis://127.0.0.1:1/x"], b"--engine: bad Redis URL"),
    (["--engine", "redis://127.0.0.1:6379", "--peer", "http://127.0.0.1:1"],
     b"peer (--peer, PUSHUP_PEER or peer in the config file) is for the mesh"),
])
def test_a_bad_engine_setting_is_refused_at_start(flags, said):
    done = subprocess.run([sys.executable, "-m", "pushup", "serve", "--port", "0",
                           "--cluster-secret", "s", *flags], capture_output=True, timeout=30)
    assert done.returncode == 2 and said in done.stderr, done.stderr


# One server only: SAVE and a restart that loads the dump are one server's. On a
# cluster, Redis coming back with less than it acknowledged is a failover to a
# replica that lagged: tests/cluster/test_redis_cluster.py does that one.
def test_redis_back_with_less_than_it_acknowledged_starts_a_new_epoch(fresh_cluster,
                                                                      redis_server):
    # As after a failover to a replica that lagged, or a restart with
    # appendfsync everysec: Redis comes back holding an older state of the log.
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    ch = uniq("older")
    kept = [publish(c.bases[0], [ch], i)["id"] for i in range(3)]
    assert redis_server.cli("SAVE") == b"OK"  # the state Redis will come back with
    lost = [publish(c.bases[0], [ch], i)["id"] for i in range(3, 5)]
    for base in c.bases:
        wait_until(lambda b=base: lost[-1] in retained(b, [ch]), 10, 0.05, "both nodes read")
    _, behind = subscribe(c.bases[1], [ch], since="0", timeout=0, limit=3)
    assert [m["id"] for m in behind["messages"]] == kept
    redis_server.kill()
    redis_server.restart()  # loads the saved dump: the log ends at message 3
    assert int(redis_server.cli("HGET", keys_of(ch).meta, "s")) == 3
    new = [publish_once_redis_answers(c.bases[0], ch)["id"]]
    # Sequence numbers 4 and 5 are never reused for another message: a new epoch.
    assert new[0].rsplit("-", 1)[0] != kept[0].rsplit("-", 1)[0]
    for base in c.bases:
        wait_until(lambda b=base: new[0] in retained(b, [ch]), 10, 0.05, "the new log is read")
        _, body = subscribe(base, [ch], since=behind["cursor"], timeout=0)
        # The messages both nodes hold are still served, once, then a gap for
        # the log that is gone, and what came after.
        assert [m["id"] for m in body["messages"]] == [*lost, *new]
        assert body["gap"] is True
        _, again = subscribe(base, [ch], since=body["cursor"], timeout=0)
        assert "gap" not in again and again["messages"] == []


def test_workers_share_the_redis_log_instead_of_peering(redis, serve):
    base = serve("--workers", "2", "--engine", redis.url).url
    ch = uniq("workers")
    ids = [publish(base, [ch], i)["id"] for i in range(6)]  # spread over both workers
    assert {i.rsplit("-", 1)[0] for i in ids} == {ids[0].rsplit("-", 1)[0]}
    whole = stats(base)
    assert whole["engine"] == "redis"
    assert all(w["peers"] == [] for w in whole["workers"])
    for _ in range(4):  # whichever worker answers holds the whole log
        wait_until(lambda: set(ids) <= set(retained(base, [ch])), 10, 0.05, "both read")


def test_a_log_lost_before_anything_was_read_from_it_is_no_gap(fresh_cluster, redis):
    c = fresh_cluster(1, haproxy=False, engine=redis.url)
    ch = uniq("quiet")
    _, start = subscribe(c.bases[0], [ch], since="now", timeout=0)
    redis.restart_empty()  # a new epoch; the old log held nothing
    new = publish_once_redis_answers(c.bases[0], ch)
    wait_until(lambda: new["id"] in retained(c.bases[0], [ch]), 10, 0.05, "read")
    _, body = subscribe(c.bases[0], [ch], since=start["cursor"], timeout=0)
    assert [m["id"] for m in body["messages"]] == [new["id"]] and "gap" not in body


def test_metrics_show_the_redis_connection_and_how_far_the_log_is_read(fresh_cluster,
                                                                       redis):
    c = fresh_cluster(1, haproxy=False, engine=redis.url)
    channels = [uniq("m") for _ in range(3)]
    publish_batch(c.bases[0], [([ch], i) for i, ch in enumerate(channels)])
    status, _, text = request("GET", c.bases[0] + "/metrics")
    assert "pushup_redis_partitions_followed 0.0" in text.decode().splitlines()  # no reader
    assert len(retained(c.bases[0], channels)) == 3  # a reader: the node follows them
    status, _, text = request("GET", c.bases[0] + "/metrics")
    assert status == 200
    lines = set(text.decode().splitlines())
    followed = len({keys_of(ch).tag for ch in channels})
    assert {"pushup_redis_up 1.0", "pushup_redis_horizon 3.0",
            f"pushup_redis_partitions_followed {followed}.0",
            "pushup_redis_channels_followed 3.0",  # per channel (issue 37)
            "pushup_redis_notifications_missed_total 0.0",
            "pushup_redis_lost_epochs_total 0.0"} <= lines


def test_cold_reads_on_a_node_that_never_followed_the_channel(fresh_cluster, redis):
    """A poll, a since= read, an event stream and a channel's info on a node
    none of whose clients read the channel before: each waits for one read
    from Redis, then finds the whole history."""
    from tests.sse_client import SSE, data_of

    c = fresh_cluster(2, haproxy=False, engine=redis.url)
    polled, read, streamed, info = (uniq(f"cold{k}") for k in range(4))
    sent = {ch: [publish(c.bases[0], [ch], i)["id"] for i in range(3)]
            for ch in (polled, read, streamed, info)}
    assert stats(c.bases[1])["redis"]["followed"] == 0  # node 2: no reader yet
    _, body = subscribe(c.bases[1], [read], since="0", timeout=0)
    assert [m["id"] for m in body["messages"]] == sent[read]
    # a held poll from the end (since=now, resolved once the partition is read)
    _, now = subscribe(c.bases[1], [polled], since="now", timeout=0)
    assert now["messages"] == []
    later = publish(c.bases[0], [polled], "later")
    _, body = subscribe(c.bases[1], [polled], since=now["cursor"], timeout=10)
    assert [m["id"] for m in body["messages"]] == [later["id"]]
    stream = SSE("127.0.0.1", c.node_ports[1], [streamed], since="0")
    try:
        assert data_of(stream.events(3)) == [0, 1, 2]
    finally:
        stream.close()
    status, described = jrequest("GET", c.bases[1] + f"/channels/{info}")
    assert status == 200 and described["messages"] == 3


def subscribe_once_redis_answers(base: str, channels: list[str], since: str) -> dict:
    """A ``timeout=0`` read, retried while the node answers 503 (a cold read
    while its connections to a restarted Redis come back)."""
    done: list[dict] = []

    def answered() -> bool:
        status, body = subscribe(base, channels, since=since, timeout=0)
        if status == 200:
            done.append(body)
        else:
            assert (status, body["error"]["code"]) == (503, "engine_unavailable"), body
        return status == 200

    wait_until(answered, 20, 0.1, f"{base} reads the channel from Redis")
    return done[0]


def test_redis_restarted_empty_is_a_gap_on_nodes_that_never_followed_the_channel(
        fresh_cluster, redis):
    # Node 1 publishes and never reads, node 2 follows the channel, node 3
    # never heard of it: after Redis lost the log, a cursor into it is a gap
    # on each of them (issue 35, item 1).
    c = fresh_cluster(3, haproxy=False, engine=redis.url)
    ch = uniq("coldgone")
    first = [publish(c.bases[0], [ch], i)["id"] for i in range(3)]
    _, seen = subscribe(c.bases[1], [ch], since="0", timeout=0)
    assert [m["id"] for m in seen["messages"]] == first
    later = [publish(c.bases[0], [ch], i)["id"] for i in range(3, 5)]
    wait_until(lambda: later[-1] in retained(c.bases[1], [ch]), 10, 0.02, "node 2 read them")
    assert stats(c.bases[0])["redis"]["followed"] == 0
    assert stats(c.bases[2])["redis"]["followed"] == 0
    redis.restart_empty()
    for base in (c.bases[2], c.bases[0]):  # never read it: a cold read now
        body = subscribe_once_redis_answers(base, [ch], seen["cursor"])
        assert body["messages"] == [] and body.get("gap") is True, (base, body)
        again = subscribe_once_redis_answers(base, [ch], body["cursor"])
        assert again["messages"] == [] and "gap" not in again, (base, again)
    # the node that followed says the same, with what it held past the cursor
    wait_until(lambda: subscribe_once_redis_answers(c.bases[1], [ch], seen["cursor"])
               .get("gap") is True, 20, 0.1, "node 2 found the log gone")
    body = subscribe_once_redis_answers(c.bases[1], [ch], seen["cursor"])
    assert [m["id"] for m in body["messages"]] == later
