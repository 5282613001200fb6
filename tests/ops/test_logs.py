"""What an operator reads: the log of real nodes (subprocesses) as they start,
lose a peer, lose Redis, and stop on Ctrl-C.

Each scenario counts the lines it causes: one start line with the node's
version, id, address, engine, peers (or Redis URL, without its password) and
workers; one line per change of a peer's or Redis's state, never one per
retry; none of Twisted's factory or port chatter; no traceback when a
launcher and a terminal both signal the node (SIGINT, then SIGTERM at once).
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from importlib.metadata import version

import pytest

from deploy.redis_server import RedisServer
from pushup.config import load
from pushup.ops.logs import start_line
from tests.toolkit import ServedNode, free_port, wait_until

SECRET = "logs-test-cluster-secret"
DEADLINE = 20.0


class Node(ServedNode):
    """`pushup serve` on ``port``, named after it, with the cluster secret."""

    def __init__(self, port: int, *flags: str) -> None:
        super().__init__("--node-id", f"n{port}", *flags, port=port,
                         env={"PUSHUP_CLUSTER_SECRET": SECRET})

    def get(self, path: str) -> tuple[int, dict]:
        return get_json(self.url + path)


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def answers(node: Node, status: int) -> bool:
    try:
        return node.get("/health")[0] == status
    except OSError:
        return False


def peer_state(node: Node, url: str) -> str:
    return {p["url"]: p["state"] for p in node.get("/stats")[1]["peers"]}[url]


def new_lines(node: Node, since: int) -> list[str]:
    return node.lines()[since:]


def assert_quiet(lines: list[str]) -> None:
    text = "\n".join(lines)
    for chatter in ("factory", "starting on", "Port", "Traceback", "critical"):
        assert chatter not in text, text


@pytest.fixture
def nodes() -> Iterator[Callable[..., Node]]:
    started: list[Node] = []

    def start(port: int, *flags: str) -> Node:
        started.append(Node(port, *flags))
        return started[-1]

    yield start
    for node in started:
        node.kill()
        node.log.unlink(missing_ok=True)


def test_a_start_a_peer_restart_and_a_double_signal_each_log_a_few_lines(nodes):
    pa, pb = free_port(), free_port()
    a = nodes(pa, "--peer", f"http://127.0.0.1:{pb}")
    b = nodes(pb, "--peer", a.url)
    wait_until(lambda: peer_state(a, b.url) == "up" and peer_state(b, a.url) == "up",
               DEADLINE, msg="both links up")

    # The start: the start line, how the cache was filled, the peer up.
    start = a.lines()
    print(f"\nstart: {len(start)} lines\n" + "\n".join(start))
    assert len(start) == 3, start
    assert_quiet(start)
    first = start[0]
    for part in (f"pushup {version('pushup')}", f"node n{pa}", f"listening on {a.url}",
                 "engine mesh", f"peers {b.url}", "workers 1"):
        assert part in first, first
    assert start[-1].endswith(f"peer {b.url} is up"), start

    # A peer killed and started again: lost, then up (no line per retry).
    b.proc.kill()
    b.proc.wait(10)
    wait_until(lambda: peer_state(a, b.url) == "down", DEADLINE, msg="the link down")
    wait_until(lambda: answers(a, 200), DEADLINE, msg="a still healthy")
    b2 = nodes(pb, "--peer", a.url)
    wait_until(lambda: peer_state(a, b2.url) == "up", DEADLINE, msg="the link up again")
    outage = new_lines(a, len(start))
    print(f"peer outage: {len(outage)} lines\n" + "\n".join(outage))
    assert len(outage) == 2, outage
    # why, in our few words: not Twisted's sentence with its full stop
    assert re.fullmatch(rf".* peer {b.url} lost \([a-z ]+\); reconnecting", outage[0]), outage
    assert outage[1].endswith(f"peer {b.url} is up")
    assert_quiet(outage)

    # Ctrl-C in a terminal, then the launcher's SIGTERM: one drain, no traceback.
    before = len(a.lines())
    a.proc.send_signal(signal.SIGINT)
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(10) == 0
    stop = new_lines(a, before)
    print(f"SIGINT + SIGTERM: {len(stop)} lines\n" + "\n".join(stop))
    assert_quiet(stop)
    assert len(stop) == 3 and "draining, then stopping" in stop[0] and stop[-1].endswith(
        "drained"), stop


def test_redis_unreachable_for_seconds_logs_each_change_once(nodes):
    password = "redis-pass-in-no-log"
    redis = RedisServer("--requirepass", password)
    redis.start()
    try:
        port = free_port()
        url = f"redis://:{password}@127.0.0.1:{redis.port}"
        node = nodes(port, "--engine", url)
        wait_until(lambda: answers(node, 200), DEADLINE, msg="the node on Redis healthy")
        start = node.lines()
        print(f"\nstart on Redis: {len(start)} lines\n" + "\n".join(start))
        # a reader: the node follows the channel's partition, so it finds its log gone
        assert get_json(node.url + "/subscribe?channels=logs&timeout=0")[0] == 200
        shown = f"redis://127.0.0.1:{redis.port}/0"
        assert len(start) == 3 and f"engine redis; redis {shown}" in start[0], start
        assert_quiet(start)

        redis.kill()
        wait_until(lambda: answers(node, 503), DEADLINE, msg="/health 503 without Redis")
        # The outage lasts: the node retries every second meanwhile (the point
        # of the test is that retries log nothing).
        time.sleep(3)
        redis.restart()
        wait_until(lambda: answers(node, 200), DEADLINE, msg="the node healthy again")
        # /health may turn 200 a moment before the engine logs what it found in
        # the restarted Redis, so await that line before counting.
        wait_until(lambda: any("redis: the log " in line
                               for line in new_lines(node, len(start))),
                   DEADLINE, msg="the engine's finding logged")
        outage = new_lines(node, len(start))
        print(f"Redis down 3 s: {len(outage)} lines\n" + "\n".join(outage))
        assert_quiet(outage)
        # lost, unreachable (why); then, in the order the two connections come
        # back, up and the engine's own finding: the restarted Redis is empty,
        # so the log this node read is gone.
        said = [line.split("] ", 1)[1].split(";")[0] for line in outage]
        assert len(said) == 4 and said[:2] == [
            f"redis {shown} lost", f"redis {shown} unreachable (connection refused)"], outage
        gone = [s for s in said[2:] if s.startswith("redis: the log ") and s.endswith(" is gone")]
        assert f"redis {shown} is up" in said[2:] and len(gone) == 1, outage
        assert password not in node.log.read_text()
    finally:
        redis.stop()


def test_a_stopped_redis_is_said_lost_once_and_up_once_it_answers_again(nodes, redis_server):
    node = nodes(free_port(), "--engine", redis_server.url)
    wait_until(lambda: answers(node, 200), DEADLINE, msg="the node on Redis healthy")
    assert get_json(node.url + "/subscribe?channels=logs&timeout=0")[0] == 200
    start = len(node.lines())
    shown = f"redis://127.0.0.1:{redis_server.port}/0"

    redis_server.pause()  # SIGSTOP: the kernel still accepts connections; nothing answers
    try:
        # /health's PING goes unanswered: the connection is dropped for it
        wait_until(lambda: answers(node, 503), DEADLINE, msg="/health 503 on a stopped Redis")
        # The freeze lasts: each reconnect is accepted and its PING unanswered, one
        # every 3 s (1 s backoff, 2 s for the PING); the point is that none is "up".
        time.sleep(8)
        assert answers(node, 503)
        frozen = new_lines(node, start)
    finally:
        redis_server.resume()
    wait_until(lambda: answers(node, 200), DEADLINE, msg="the node healthy again")
    wait_until(lambda: len(new_lines(node, start)) > len(frozen), DEADLINE,
               msg="the return logged")
    outage = new_lines(node, start)
    print(f"Redis stopped 8 s: {len(outage)} lines\n" + "\n".join(outage))
    assert_quiet(outage)
    said = [line.split("] ", 1)[1].split(";")[0] for line in outage]
    assert said == [f"redis {shown} lost",
                    f"redis {shown} unreachable (no reply to PING within 2 s)",
                    f"redis {shown} is up"], outage


def test_json_logs_carry_the_start_lines_fields(nodes):
    node = nodes(free_port(), "--log-format", "json")
    wait_until(lambda: answers(node, 200), DEADLINE, msg="healthy")
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(10) == 0
    records = [json.loads(line) for line in node.lines()]
    assert all({"time", "level", "namespace", "message"} <= set(r) for r in records)
    first = records[0]
    assert {k: first[k] for k in ("version", "node_id", "address", "engine", "peers",
                                  "workers")} == {
        "version": version("pushup"), "node_id": f"n{node.port}", "address": node.url,
        "engine": "mesh", "peers": [], "workers": 1}
    assert first["message"].startswith(f"pushup {version('pushup')} node n{node.port}")


def test_workers_log_a_start_line_each_and_not_their_sibling_links(serve):
    node = serve("--workers", "2", "--node-id", "w")

    def siblings_up() -> bool:
        workers = get_json(f"{node.url}/stats")[1]["workers"]
        return len(workers) == 2 and all(
            [p["state"] for p in w["peers"]] == ["up"] for w in workers)

    wait_until(siblings_up, DEADLINE, msg="each worker's link to its sibling up")
    lines = node.lines()
    print(f"\n--workers 2 start: {len(lines)} lines\n" + "\n".join(lines))
    assert_quiet(lines)
    starts = sorted(line.split("] ", 1)[1].split(" listening")[0] for line in lines
                    if " listening on " in line)
    assert starts == [f"pushup {version('pushup')} node w-0 (worker 0 of 2)",
                      f"pushup {version('pushup')} node w-1 (worker 1 of 2)"], lines
    assert not [line for line in lines if "peer http" in line], lines
    assert len(lines) == 4, lines  # and how each worker filled its cache
    assert node.stop() == 0


def test_a_lone_nodes_start_line_names_its_engine_as_stats_does_and_its_admin_port(serve):
    admin = free_port()
    node = serve("--node-id", "lone", "--admin-port", str(admin))
    admin_url = f"http://127.0.0.1:{admin}"
    status, stats = get_json(admin_url + "/stats")
    assert status == 200 and stats["engine"] == "single"
    first = node.lines()[0]
    assert first.split("] ", 1)[1].startswith(
        f"pushup {version('pushup')} node lone listening on http://127.0.0.1:{node.port}; "
        "engine single; workers 1; core "), first
    assert first.endswith(f"; /metrics and /stats on {admin_url}"), first
    with urllib.request.urlopen(admin_url + "/metrics", timeout=5) as r:
        assert r.status == 200
    assert node.stop() == 0


def test_the_start_line_names_every_redis_seed_without_credentials():
    config = load(["serve", "--engine", "redis://:hidden@10.0.0.1:7000,10.0.0.2:7001"], {})
    fields = start_line(config, "n1", "http://127.0.0.1:8080", engine="redis")
    assert fields["redis"] == "redis://10.0.0.1:7000/0,redis://10.0.0.2:7001/0"
