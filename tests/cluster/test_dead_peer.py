"""A dead peer under load, on real processes (issue 35, item 11): three `pushup
serve` mesh nodes, one SIGKILLed, a burst of publishes to another. The third
node, which receives the burst's batches, dials the dead peer only as its
backoff allows (``dials`` in /stats), logs no traceback and one line per change
of the link's state, and the link is up again once the peer restarts.

Before the fix every batch received kicked the link to the dead peer (a dial
per batch), and past 1,024 failures its backoff overflowed a float: a
traceback per attempt.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pushup.backplane.mesh.peers import BACKOFF_MAX, JITTER
from tests.toolkit import ServedNode, free_port, wait_until

SECRET = "dead-peer-test-cluster-secret"
DEADLINE = 30.0
BURST = 3_000  # publishes, at most...
BURST_S = 20.0  # ...and for this long at most
PUBLISHERS = 4  # keep-alive connections publishing at once...
PACE = 0.01  # ...each pausing this long between publishes: ~400 a second in all


class Node(ServedNode):
    """`pushup serve` on ``port``, named after it, peered with ``peers``."""

    def __init__(self, port: int, peers: list[int]) -> None:
        flags = [f for p in peers for f in ("--peer", f"http://127.0.0.1:{p}")]
        super().__init__("--node-id", f"n{port}", *flags, port=port,
                         env={"PUSHUP_CLUSTER_SECRET": SECRET})

    def link(self, url: str) -> dict[str, Any]:
        """This node's /stats entry for its link to ``url``."""
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as answer:
            peers = json.loads(answer.read())["peers"]
        return next(p for p in peers if p["url"] == url)


def burst(node: Node, count: int, seconds: float) -> int:
    """Publish up to ``count`` messages to ``node`` within ``seconds``, over
    ``PUBLISHERS`` keep-alive connections at ``PACE``; the number it accepted
    (201/202)."""
    deadline = time.monotonic() + seconds
    accepted = [0] * PUBLISHERS
    problems: list[str] = []

    def publish(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
        try:
            for n in range(count // PUBLISHERS):
                if time.monotonic() > deadline:
                    break
                body = json.dumps({"channels": ["burst"], "data": [k, n]})
                conn.request("POST", "/publish", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                if response.status in (201, 202):
                    accepted[k] += 1
                else:
                    problems.append(f"{response.status}")
                time.sleep(PACE)
        except OSError as e:
            problems.append(repr(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=publish, args=(k,), daemon=True)
               for k in range(PUBLISHERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
        assert not t.is_alive(), "a publisher did not finish"
    assert not problems, problems[:5]
    return sum(accepted)


@pytest.fixture
def nodes() -> Iterator[Callable[[int, list[int]], Node]]:
    started: list[Node] = []

    def start(port: int, peers: list[int]) -> Node:
        started.append(Node(port, peers))
        return started[-1]

    yield start
    for node in started:
        node.kill()
        node.log.unlink(missing_ok=True)


def test_a_dead_peer_under_load_is_dialled_on_its_backoff_and_logged_once(nodes):
    ports = [free_port() for _ in range(3)]
    a, b, c = (nodes(p, [q for q in ports if q != p]) for p in ports)
    everyone = [a, b, c]
    wait_until(lambda: all(n.link(m.url)["state"] == "up"
                           for n in everyone for m in everyone if m is not n),
               DEADLINE, 0.1, "every link up")
    at_kill = len(b.lines())

    c.kill()  # SIGKILL
    wait_until(lambda: b.link(c.url)["state"] == "down", DEADLINE, 0.1, "b's link to c down")
    # The log says "down" once the peer has been unreachable for DOWN_LOG_AFTER:
    # counted here so that the burst's window sees only retries.
    wait_until(lambda: any(f"peer {c.url} is down" in line for line in b.lines()),
               DEADLINE, 0.1, "b logs c down")
    dials, started = b.link(c.url)["dials"], time.monotonic()
    sent = burst(a, BURST, BURST_S)  # a sends them on to b, batch after batch
    wait_until(lambda: a.link(b.url)["queued"] == 0, DEADLINE, 0.1, "b holds the burst")
    elapsed = time.monotonic() - started
    dialled = b.link(c.url)["dials"] - dials
    # One attempt per backoff at the cap, at most (its jitter shortens each by
    # up to JITTER), and one under way at each end of the window.
    allowed = int(elapsed / ((1 - JITTER) * BACKOFF_MAX)) + 2
    print(f"\n{sent} publishes in {elapsed:.1f} s; b dialled the dead c {dialled} times "
          f"(the backoff allows {allowed})")
    assert sent >= BURST // 10, sent  # a burst, not a trickle
    assert dialled <= allowed, (dialled, allowed)

    c2 = nodes(c.port, [a.port, b.port])  # back, on the same port
    wait_until(lambda: b.link(c2.url)["state"] == "up" and a.link(c2.url)["state"] == "up",
               DEADLINE, 0.1, "the links to c up again")
    outage = b.lines()[at_kill:]
    print(f"b's log since the kill: {len(outage)} lines\n" + "\n".join(outage))
    text = "\n".join(outage)
    for chatter in ("Traceback", "critical", "Unhandled", "OverflowError"):
        assert chatter not in text, text
    about_c = [line for line in outage if f"peer {c.url} " in line]
    assert len(about_c) == 3, about_c  # lost, down, up again: once each
    assert about_c[0].endswith("; reconnecting") and f"peer {c.url} is down" in about_c[1]
    assert f"peer {c.url} is up again" in about_c[2], about_c

    # /metrics counts the same dials as /stats.
    with urllib.request.urlopen(b.url + "/metrics", timeout=5) as answer:
        metrics = answer.read().decode()
    [counted] = [line.rsplit(" ", 1)[1] for line in metrics.splitlines()
                 if line.startswith(f'pushup_peer_dials_total{{peer="{c.url}"}}')]
    assert float(counted) == b.link(c.url)["dials"], counted
