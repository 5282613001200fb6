"""Durable Streams on nodes sharing one Redis (``--engine redis``): a stream
written through one node is read, followed and resumed through any other,
with the same offsets, and an append a node acknowledged outlives that node.

Real ``pushup serve`` processes on a ``redis-server`` of the test's own, and
(forks, whose family shares one slot) on a real 3-primary Redis Cluster
(docs/api.md, "Durable Streams", "In a cluster on Redis").
"""
from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator

import pytest

from deploy.redis_cluster import RedisCluster
from deploy.redis_server import RedisServer
from pushup.core.streams import MAX_FORK_DEPTH
from tests.cluster.clients import request, uniq
from tests.cluster.redis_backends import Cluster, running_cluster
from tests.cluster.stream_checks import (
    append,
    appends_until_killed,
    check_every_acknowledged_append_kept,
    check_long_poll_is_answered_by_an_append_through_another_node,
    check_reads_alike_through_every_node,
    create,
    stream_url,
)
from tests.toolkit import wait_until


def test_a_stream_written_through_each_node_reads_alike_through_every_node(
        fresh_cluster, redis_server):
    c = fresh_cluster(3, haproxy=False, engine=redis_server.url)
    check_reads_alike_through_every_node(c.bases, uniq("s"))


def test_a_long_poll_on_one_node_is_answered_by_an_append_through_another(
        fresh_cluster, redis_server):
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    check_long_poll_is_answered_by_an_append_through_another_node(
        c.bases[1], c.bases[0], uniq("s"))


def test_a_node_killed_mid_append_loses_no_append_it_acknowledged(
        fresh_cluster, redis_server):
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    path = uniq("s")
    create(c.bases[0], path)
    acked, sent = appends_until_killed(c.bases[0], path, lambda: c.kill(0, signal.SIGKILL))
    check_every_acknowledged_append_kept(c.bases[1], path, acked, sent)


def test_while_redis_is_paused_stream_requests_are_503_and_work_after(
        fresh_cluster, redis_server):
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    path = uniq("s")
    request("PUT", stream_url(c.bases[0], path), b"", {"Content-Type": "text/plain"})
    redis_server.pause()  # SIGSTOP
    try:
        status, _, raw = request("POST", stream_url(c.bases[0], path), b"x",
                                 {"Content-Type": "text/plain"}, timeout=20)
        # the stream could not be read first: nothing was written
        assert (status, json.loads(raw)["error"]["code"]) == (503, "engine_unavailable")
        status, _, raw = request("GET", stream_url(c.bases[1], path) + "?offset=-1",
                                 timeout=20)
        assert (status, json.loads(raw)["error"]["code"]) == (503, "engine_unavailable")
    finally:
        redis_server.resume()  # SIGCONT
    # the first tries may still get 503 while the dropped connection comes back
    wait_until(lambda: request("POST", stream_url(c.bases[0], path), b"y",
                               {"Content-Type": "text/plain"})[0] == 204,
               20, 0.2, "an append once Redis answers")
    read: list[tuple[int, bytes]] = []
    wait_until(lambda: read.append(request("GET", stream_url(c.bases[1], path)
                                           + "?offset=-1")[::2]) or read[-1][0] != 503,
               20, 0.2, "node 1 reads once Redis answers")
    assert read[-1] == (200, b"y")


def test_writers_racing_through_two_nodes_each_get_the_offset_their_append_is_at(
        fresh_cluster, redis_server):
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    path = uniq("s")
    request("PUT", stream_url(c.bases[0], path), b"", {"Content-Type": "text/plain"})
    acked: dict[bytes, str] = {}
    refused: list[int] = []

    def write(node: int) -> None:
        for i in range(150):
            body = b"n%d-%03d;" % (node, i)  # 7 bytes each
            status, headers, _ = request("POST", stream_url(c.bases[node], path), body,
                                         {"Content-Type": "text/plain"})
            if status != 204:
                refused.append(status)
                return
            acked[body] = headers["stream-next-offset"]

    writers = [threading.Thread(target=write, args=(n,)) for n in (0, 1)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    assert refused == []
    status, _, body = request("GET", stream_url(c.bases[1], path) + "?offset=-1")
    assert status == 200
    parts = [body[i:i + 7] for i in range(0, len(body), 7)]
    # each acknowledged append once, ending exactly where its offset says
    assert sorted(parts) == sorted(acked)
    assert {part: f"{i + 1:016d}_{7 * (i + 1):016d}" for i, part in enumerate(parts)} == acked


# -- forks, on one redis-server and on a real Redis Cluster (a family in one slot) --


@pytest.fixture(scope="module")
def shared_redis_cluster() -> Iterator[RedisCluster]:
    """3 primaries, no replica, for the whole module (emptied between tests)."""
    yield from running_cluster(replicas=0)


@pytest.fixture(params=["server", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The ``--engine`` value of a fresh redis-server, or of the module's Redis
    Cluster emptied: forks behave alike on both."""
    if request.param == "cluster":
        cluster = Cluster(request.getfixturevalue("shared_redis_cluster"))
        cluster.clean()
        yield cluster.url
        return
    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def put(base: str, path: str, body: bytes = b"", **headers: str) -> int:
    """PUT a text stream (a fork with Stream-Forked-From); its status."""
    status, _, _ = request("PUT", stream_url(base, path), body,
                           {"Content-Type": "text/plain", **headers})
    return status


def read_all(base: str, path: str) -> tuple[int, bytes]:
    status, _, body = request("GET", stream_url(base, path) + "?offset=-1")
    return status, body


def test_a_fork_created_through_one_node_is_appended_and_read_through_others(
        fresh_cluster, redis_url):
    c = fresh_cluster(3, haproxy=False, engine=redis_url)
    source, fork, grandchild = uniq("src"), uniq("fork"), uniq("fork2")
    assert put(c.bases[0], source, b"one;") == 201
    append(c.bases[1], source, b"two;")
    assert put(c.bases[1], fork, **{"Stream-Forked-From": f"/v1/stream/{source}"}) == 201
    append(c.bases[2], fork, b"mine;")
    append(c.bases[0], source, b"three;")  # after the fork: not in it
    assert put(c.bases[2], grandchild, **{"Stream-Forked-From": f"/v1/stream/{fork}"}) == 201
    append(c.bases[0], grandchild, b"deeper;")
    for base in c.bases:
        assert read_all(base, fork) == (200, b"one;two;mine;")
        assert read_all(base, grandchild) == (200, b"one;two;mine;deeper;")
        assert read_all(base, source) == (200, b"one;two;three;")


def test_a_fork_deleted_through_another_node_takes_its_soft_deleted_source_along(
        fresh_cluster, redis_url):
    c = fresh_cluster(3, haproxy=False, engine=redis_url)
    source, fork = uniq("src"), uniq("fork")
    assert put(c.bases[0], source, b"kept;") == 201
    assert put(c.bases[1], fork, **{"Stream-Forked-From": f"/v1/stream/{source}"}) == 201
    assert request("DELETE", stream_url(c.bases[2], source))[0] == 204
    assert read_all(c.bases[0], source)[0] == 410  # the fork still reads it
    assert read_all(c.bases[1], fork) == (200, b"kept;")
    assert request("DELETE", stream_url(c.bases[0], fork))[0] == 204
    for base in c.bases:  # its last fork gone, the source goes too
        assert read_all(base, fork)[0] == 404
        assert read_all(base, source)[0] == 404
    assert put(c.bases[2], source, b"anew;") == 201
    assert read_all(c.bases[1], source) == (200, b"anew;")


def test_a_deleted_forks_path_serves_a_fork_of_another_family_then_a_plain_stream(
        fresh_cluster, redis_url):
    c = fresh_cluster(3, haproxy=False, engine=redis_url)
    first, second, path = uniq("src"), uniq("src"), uniq("fork")
    assert put(c.bases[0], first, b"first;") == 201
    assert put(c.bases[0], second, b"second;") == 201
    assert put(c.bases[1], path, **{"Stream-Forked-From": f"/v1/stream/{first}"}) == 201
    assert read_all(c.bases[2], path) == (200, b"first;")
    assert request("DELETE", stream_url(c.bases[2], path))[0] == 204
    assert put(c.bases[0], path, **{"Stream-Forked-From": f"/v1/stream/{second}"}) == 201
    append(c.bases[1], path, b"more;")
    for base in c.bases:
        assert read_all(base, path) == (200, b"second;more;")
    assert request("DELETE", stream_url(c.bases[1], path))[0] == 204
    assert put(c.bases[2], path, b"plain;") == 201
    for base in c.bases:
        assert read_all(base, path) == (200, b"plain;")
    # the sources count no fork: deleted, they go at once
    for source in (first, second):
        assert request("DELETE", stream_url(c.bases[0], source))[0] == 204
        assert read_all(c.bases[1], source)[0] == 404


def fork_into(statuses: list[int], node: int, base: str, path: str, source: str) -> None:
    """Fork ``source`` at ``path`` through ``base``: its status at ``statuses[node]``."""
    statuses[node] = put(base, path, **{"Stream-Forked-From": f"/v1/stream/{source}"})


def test_one_fork_path_raced_from_two_families_goes_to_one_and_the_other_counts_no_fork(
        fresh_cluster, redis_url):
    c = fresh_cluster(2, haproxy=False, engine=redis_url)
    for _race in range(20):
        sources, path = (uniq("src"), uniq("src")), uniq("fork")
        for source in sources:
            assert put(c.bases[0], source, source.encode()) == 201
        statuses: list[int] = [0, 0]
        racers = [threading.Thread(target=fork_into, args=(
            statuses, node, c.bases[node], path, sources[node])) for node in (0, 1)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(30)
        assert sorted(statuses) == [201, 409]
        winner = statuses.index(201)
        assert read_all(c.bases[1 - winner], path) == (200, sources[winner].encode())
        # the loser's source has no fork: deleted, it is gone at once (not 410)
        loser = sources[1 - winner]
        assert request("DELETE", stream_url(c.bases[winner], loser))[0] == 204
        assert read_all(c.bases[1 - winner], loser)[0] == 404


# -- what Redis lost, and deep fork chains, through real nodes -------------------


def served(base: str, path: str, offset: str = "-1") -> tuple[int, str, bytes]:
    """(status, Stream-Next-Offset, body) of a read through ``base``, once
    the node reads Redis again (a 503 while it reconnects)."""
    got: list[tuple[int, dict[str, str], bytes]] = []
    wait_until(lambda: got.append(request("GET", stream_url(base, path)
                                          + f"?offset={offset}")) or got[-1][0] != 503,
               20, 0.2, "a read once Redis answers")
    status, headers, body = got[-1]
    return status, headers.get("stream-next-offset", ""), body


def test_after_redis_restarts_from_an_older_snapshot_both_nodes_serve_the_same_bytes(
        fresh_cluster, redis_server):
    """Node 0 appended three times after Redis's snapshot; Redis restarts from
    it; node 1 appends twice (other sizes). Both nodes then serve Redis's bytes
    at the same offsets, and the offset node 0 issued for its lost last append
    names the next append's bytes only, through either node."""
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    path = uniq("s")
    create(c.bases[0], path)
    for i in range(5):
        append(c.bases[0], path, b"e%d|" % i)
    redis_server.cli("SAVE")
    lost = [append(c.bases[0], path, b"e%d|" % i) for i in range(5, 8)]
    assert served(c.bases[0], path)[2] == b"e0|e1|e2|e3|e4|e5|e6|e7|"  # node 0's cache
    redis_server.kill()
    redis_server.restart()
    assert served(c.bases[1], path)[2] == b"e0|e1|e2|e3|e4|"
    for name in (b"XX0|", b"XX1|"):
        append(c.bases[1], path, name)
    held = b"e0|e1|e2|e3|e4|XX0|XX1|"
    assert served(c.bases[0], path)[::2] == served(c.bases[1], path)[::2] == (200, held)
    tail = append(c.bases[0], path, b"Y0|")
    for base in c.bases:
        assert served(base, path) == (200, tail, held + b"Y0|")
        assert served(base, path, lost[-1]) == (200, tail, b"Y0|")


def test_a_fork_chain_as_deep_as_allowed_is_created_appended_and_read_through_two_nodes(
        fresh_cluster, redis_server):
    """Each fork of the one before, created through either node in turn, as
    deep as ``MAX_FORK_DEPTH`` allows: every PUT answered 201, one more 400
    ``fork_too_deep`` on either node, an append to the deepest 204, and it
    reads whole on both (the engine reads a family in a loop)."""
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    chain = [uniq("c") for _ in range(MAX_FORK_DEPTH + 1)]
    assert put(c.bases[0], chain[0], b"root;") == 201
    for level in range(1, len(chain)):
        assert put(c.bases[level % 2], chain[level],
                   **{"Stream-Forked-From": f"/v1/stream/{chain[level - 1]}"}) == 201, level
    for base in c.bases:
        assert put(base, uniq("c"), **{"Stream-Forked-From": f"/v1/stream/{chain[-1]}"}) == 400
    append(c.bases[1], chain[-1], b"leaf;")
    append(c.bases[0], chain[30], b"middle;")
    for base in c.bases:
        assert read_all(base, chain[-1]) == (200, b"root;leaf;")
        assert read_all(base, chain[30]) == (200, b"root;middle;")
