"""Durable Streams on nodes sharing one Redis (``--engine redis``): a stream
written through one node is read, followed and resumed through any other,
with the same offsets, and an append a node acknowledged outlives that node.

Real ``pushup serve`` processes on a ``redis-server`` of the test's own
(docs/api.md, "Durable Streams", "In a cluster").
"""
from __future__ import annotations

import json
import signal
import threading

from tests.cluster.clients import request, uniq
from tests.cluster.stream_checks import (
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
