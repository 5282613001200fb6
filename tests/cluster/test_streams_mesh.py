"""Durable Streams on the mesh: each stream is held by the node its path picks
(its owner), and every other node hands the stream's requests on to it, so a
stream written through one node is read, followed and resumed through any
other, with the same offsets, and with ``--data-dir`` an append the owner
acknowledged outlives its SIGKILL.

Real ``pushup serve`` processes peered with each other (docs/api.md,
"Durable Streams", "On the mesh").
"""
from __future__ import annotations

import http.client
import json
import signal

from deploy.launch import LocalCluster
from pushup.backplane.mesh.owners import member, owner_of
from tests.cluster.clients import request, uniq
from tests.cluster.stream_checks import (
    append,
    appends_until_killed,
    check_every_acknowledged_append_kept,
    check_long_poll_is_answered_by_an_append_through_another_node,
    check_reads_alike_through_every_node,
    create,
    stream_url,
)


def path_owned_by(c: LocalCluster, i: int) -> str:
    """A fresh stream path whose owner is node ``i``."""
    members = [member(c.node_url(j)) for j in range(len(c.node_ports))]
    while True:
        path = uniq("s")
        if owner_of(f"/v1/stream/{path}", members) == members[i]:
            return path


def test_a_stream_written_through_each_node_reads_alike_through_every_node(fresh_cluster):
    c = fresh_cluster(3, haproxy=False)
    check_reads_alike_through_every_node(c.bases, path_owned_by(c, 1))


def test_a_long_poll_through_one_node_is_answered_by_an_append_through_another(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=False)
    # neither the reader's node nor the writer's holds the stream
    check_long_poll_is_answered_by_an_append_through_another_node(
        c.bases[1], c.bases[2], path_owned_by(c, 0))


def test_an_owner_killed_mid_append_loses_no_append_it_acknowledged(fresh_cluster):
    c = fresh_cluster(3, haproxy=False, data_dirs=True)
    path = path_owned_by(c, 0)
    create(c.bases[1], path)
    acked, sent = appends_until_killed(c.bases[1], path, lambda: c.kill(0, signal.SIGKILL))
    c.start_node(0)
    check_every_acknowledged_append_kept(c.bases[2], path, acked, sent)


def test_while_the_owner_is_down_its_streams_are_503_and_nothing_is_half_done(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=False, data_dirs=True)
    path = path_owned_by(c, 0)
    create(c.bases[1], path)
    before = append(c.bases[1], path, b"kept;")
    c.kill(0, signal.SIGKILL)
    status, headers, raw = request("POST", stream_url(c.bases[1], path), b"lost;",
                                   {"Content-Type": "text/plain"})
    assert (status, json.loads(raw)["error"]["code"]) == (503, "engine_unavailable")
    assert headers["content-type"].startswith("application/json")
    status, _, raw = request("GET", stream_url(c.bases[2], path) + "?offset=-1")
    assert (status, json.loads(raw)["error"]["code"]) == (503, "engine_unavailable")
    c.start_node(0)
    status, headers, body = request("GET", stream_url(c.bases[2], path) + "?offset=-1")
    assert (status, body, headers["stream-next-offset"]) == (200, b"kept;", before)


def test_a_client_cannot_make_a_node_serve_a_stream_it_does_not_own(fresh_cluster):
    c = fresh_cluster(3, haproxy=False)
    path = path_owned_by(c, 0)
    status, _, raw = request("PUT", stream_url(c.bases[1], path), b"",
                             {"Content-Type": "text/plain",
                              "X-PushUp-Stream-Hop": "here 1 forged"})
    assert (status, json.loads(raw)["error"]["code"]) == (401, "unauthorized")


def test_a_fork_placed_on_its_sources_node_is_found_after_its_paths_owner_restarts(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=False, data_dirs=True)
    source, fork = path_owned_by(c, 1), path_owned_by(c, 0)
    create(c.bases[2], source)
    tail = append(c.bases[2], source, b"inherited;")
    status, _, _ = request("PUT", stream_url(c.bases[2], fork), b"",
                           {"Content-Type": "text/plain",
                            "Stream-Forked-From": f"/v1/stream/{source}"})
    assert status == 201
    append(c.bases[2], fork, b"own;")
    c.kill(0, signal.SIGKILL)  # the fork's path's owner, which knows where it lives
    c.start_node(0)
    status, headers, body = request("GET", stream_url(c.bases[2], fork) + "?offset=-1")
    assert (status, body) == (200, b"inherited;own;")
    status, _, _ = request("DELETE", stream_url(c.bases[1], source))
    assert status == 204
    # the source waits for its fork (on one node with it): gone, its path not free
    status, _, _ = request("HEAD", stream_url(c.bases[0], source))
    assert status == 410
    status, _, body = request("GET", stream_url(c.bases[0], fork) + f"?offset={tail}")
    assert (status, body) == (200, b"own;")


def test_a_node_that_stops_ends_the_event_streams_it_relays_cleanly(fresh_cluster):
    c = fresh_cluster(3, haproxy=False)
    path = path_owned_by(c, 0)
    create(c.bases[2], path)
    append(c.bases[2], path, b"hello")
    conn = http.client.HTTPConnection("127.0.0.1", c.node_ports[1], timeout=20)
    try:
        conn.request("GET", f"/v1/stream/{path}?offset=-1&live=sse")
        response = conn.getresponse()
        assert (response.status, response.getheader("content-type")) == (
            200, "text/event-stream")
        seen = b""
        while b"event: control" not in seen:
            seen += response.read1(65536)
        c.kill(1, signal.SIGTERM)  # drains: the relayed stream ends, the client resumes
        seen += response.read()  # to its end: http.client raises on a cut chunked body
    finally:
        conn.close()
    assert seen.startswith(b"event: data\ndata:hello\n\nevent: control\n")


def test_with_a_publish_token_a_stream_is_written_and_read_through_another_node_with_it(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=False, node_env={"PUSHUP_PUBLISH_TOKEN": "t0ken",
                                                  "PUSHUP_SUBSCRIBE_SECRET": "s3cret"})
    path = path_owned_by(c, 0)
    token = {"Authorization": "Bearer t0ken", "Content-Type": "text/plain"}
    status, _, _ = request("PUT", stream_url(c.bases[1], path), b"", token)
    assert status == 201
    status, _, _ = request("POST", stream_url(c.bases[1], path), b"x",
                           {"Content-Type": "text/plain"})
    assert status == 401
    status, _, _ = request("POST", stream_url(c.bases[1], path), b"x", token)
    assert status == 204
    status, _, body = request("GET", stream_url(c.bases[2], path) + "?offset=-1", None, token)
    assert (status, body) == (200, b"x")
