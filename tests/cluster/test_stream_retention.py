"""Durable Stream retention on real processes (issue 39, part 2): on nodes
sharing one redis-server, what one node's retention let go of is gone through
every node (410 ``offset_gone`` naming the same earliest offset), and a node
started afresh reads the same from Redis; with ``--data-dir``, a SIGKILLed
node keeps it. Offsets are never issued twice."""
from __future__ import annotations

import signal
import subprocess

from tests.cluster.clients import request, uniq
from tests.cluster.stream_checks import stream_url

TEXT = {"Content-Type": "text/plain"}


def put_kept(base: str, path: str, size: int) -> None:
    status, _, _ = request("PUT", stream_url(base, path), b"",
                           {**TEXT, "Stream-Retention-Bytes": str(size)})
    assert status == 201


def post(base: str, path: str, body: bytes) -> str:
    status, headers, _ = request("POST", stream_url(base, path), body, TEXT)
    assert status == 204, status
    return headers["stream-next-offset"]


def earliest_and_gone(base: str, path: str, offset: str) -> tuple[str, int, str]:
    _, head, _ = request("HEAD", stream_url(base, path))
    status, headers, _ = request("GET", stream_url(base, path) + f"?offset={offset}")
    return head["stream-earliest-offset"], status, headers.get("stream-earliest-offset", "")


def held_bytes(port: int) -> int:
    """The bytes of every stream's appends list in the redis-server on ``port``."""
    def cli(*args: str) -> list[str]:
        return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                              text=True, check=True, timeout=10).stdout.split("\n")
    lists = [key for key in cli("--scan", "--pattern", "*:l") if key]
    return sum(len(item) for key in lists for item in cli("LRANGE", key, "0", "-1"))


def test_what_retention_let_go_is_gone_through_every_node_on_redis(
        fresh_cluster, redis_server):
    c = fresh_cluster(2, haproxy=False, engine=redis_server.url)
    path = uniq("r")
    put_kept(c.bases[0], path, 250)
    offsets = [post(c.bases[i % 2], path, b"%03d" % i + b"." * 97) for i in range(10)]
    for base in c.bases:
        assert earliest_and_gone(base, path, offsets[2]) == (offsets[7], 410, offsets[7])
        status, _, body = request("GET", stream_url(base, path) + "?offset=-1")
        assert (status, body[:3], len(body)) == (200, b"008", 200)
    # Redis holds the bytes kept, and of each append let go of only its head
    assert held_bytes(redis_server.port) < 200 + 10 * 80, held_bytes(redis_server.port)
    c.kill(1, signal.SIGKILL)
    c.start_node(1)  # a cache afresh: what Redis holds says the same
    assert earliest_and_gone(c.node_url(1), path, offsets[0]) == (offsets[7], 410, offsets[7])
    assert post(c.node_url(1), path, b"x") == "0000000000000011_0000000000001001"


def test_a_data_dir_node_killed_keeps_what_retention_kept_and_let_go(fresh_cluster):
    c = fresh_cluster(1, haproxy=False, data_dirs=True)
    path = uniq("r")
    put_kept(c.bases[0], path, 250)
    offsets = [post(c.bases[0], path, b"%03d" % i + b"." * 97) for i in range(10)]
    c.kill(0, signal.SIGKILL)
    c.start_node(0)
    assert earliest_and_gone(c.node_url(0), path, offsets[2]) == (offsets[7], 410, offsets[7])
    status, _, body = request("GET", stream_url(c.node_url(0), path) + "?offset=-1")
    assert (status, body[:3], len(body)) == (200, b"008", 200)


def test_on_the_mesh_the_owner_keeps_the_retention_asked_through_another_node(fresh_cluster):
    from tests.cluster.test_streams_mesh import path_owned_by

    c = fresh_cluster(2, haproxy=False)
    path = path_owned_by(c, 0)
    put_kept(c.bases[1], path, 250)  # handed on to its owner, headers and all
    offsets = [post(c.bases[i % 2], path, b"%03d" % i + b"." * 97) for i in range(10)]
    for base in c.bases:
        assert earliest_and_gone(base, path, offsets[2]) == (offsets[7], 410, offsets[7])
