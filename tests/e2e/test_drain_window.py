"""SIGTERM with ``--drain-window``: held long polls are answered at once, event
streams end one by one over the window (not all at once: their reconnects would
storm the neighbours), each served until its end and ending on a position a
reconnect elsewhere resumes from exactly; the node exits 0.

Two real nodes, on the mesh and on a real redis-server: the draining node
still follows the cluster during the window, so a message published on the
other node after the SIGTERM reaches the streams still open. The spread is
asserted loosely (a busy 2-core machine): fewer than half the streams end in
the window's first tenth (all of them did before, within milliseconds), and
all by the window's end plus a grace.
"""

from __future__ import annotations

import http.client
import json
import selectors
import signal
import time

import pytest

from deploy.launch import LocalCluster
from tests.e2e.support import Pending, uniq
from tests.sse_client import SSE, dechunk, parse_events

WINDOW = 4.0  # seconds
STREAMS = 24
GRACE = 5.0  # the node's own grace past the window, and a busy machine's slack


def poll(port: int, channel: str) -> object:
    """A long poll held on ``channel`` (answered at the drain)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # hang guard
    try:
        conn.request("GET", f"/subscribe?channels={channel}&timeout=60")
        r = conn.getresponse()
        return r.status, json.loads(r.read()), time.monotonic()
    finally:
        conn.close()


def publish(port: int, channel: str, data: object) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("POST", "/publish", json.dumps({"channels": [channel], "data": data}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def held(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", "/stats")
        return int(json.loads(conn.getresponse().read())["waiting"])
    finally:
        conn.close()


def read_to_the_end(streams: list[SSE], guard: float) -> list[float]:
    """Read every stream until the node closes it; when each ended (monotonic)."""
    ended: dict[int, float] = {}
    with selectors.DefaultSelector() as ready:
        for i, s in enumerate(streams):
            ready.register(s.sock, selectors.EVENT_READ, i)
        deadline = time.monotonic() + guard
        while len(ended) < len(streams):
            assert time.monotonic() < deadline, f"hang guard: {len(ended)} streams ended"
            for key, _ in ready.select(timeout=1.0):
                i = key.data
                chunk = streams[i].sock.recv(65536)
                if chunk:
                    streams[i].buf += chunk
                else:
                    ended[i] = time.monotonic()
                    ready.unregister(key.fileobj)
    return [ended[i] for i in range(len(streams))]


def events_of(stream: SSE) -> list[dict[str, str]]:
    """Every event the stream had (its head was read by ``SSE.events``)."""
    assert stream.head, "the stream's head was read"
    data, end = dechunk(stream.buf)
    assert end is not None, ("the stream was cut, not ended with its last chunk", stream.buf[-300:])
    return parse_events(data)


@pytest.mark.parametrize("engine", ["mesh", "redis"])
def test_sigterm_ends_event_streams_spread_over_the_window_and_answers_polls_at_once(engine):
    cluster = LocalCluster(2, haproxy=False, engine=engine,
                           node_args=["--drain-window", f"{WINDOW:g}"])
    with cluster:
        node, peer = cluster.node_ports
        channel, quiet = uniq("drain"), uniq("poll")
        streams = [SSE("127.0.0.1", node, [channel]) for _ in range(STREAMS)]
        try:
            assert publish(node, channel, "before") in (201, 202)
            for s in streams:  # every stream is open and has the message
                s.events(1)
            waiting = Pending(lambda: poll(node, quiet))
            deadline = time.monotonic() + 15
            while held(node) < STREAMS + 1:  # the streams and the poll are held
                assert time.monotonic() < deadline, "hang guard: not every subscriber is held"
                time.sleep(0.02)

            drained_at = time.monotonic()
            proc = cluster.nodes[0]
            assert proc is not None
            proc.send_signal(signal.SIGTERM)
            status, answer, answered_at = waiting.result(15)  # type: ignore[misc]
            assert status == 200 and answer["messages"] == []
            # published on the peer during the window: the streams still open get it
            assert publish(peer, channel, "during") in (201, 202)
            ends = [t - drained_at for t in read_to_the_end(streams, WINDOW + GRACE + 10)]
            assert proc.wait(15) == 0  # hang guard
            logged = (cluster.workdir / "node1.log").read_text()
        finally:
            for s in streams:
                s.close()

        ends.sort()
        assert sum(t < 0.1 * WINDOW for t in ends) < STREAMS / 2, ends  # spread, not at once
        assert ends[-1] < WINDOW + GRACE, ends
        # the poll was answered at the SIGTERM, before most streams ended
        assert answered_at - drained_at < ends[STREAMS // 2], (answered_at - drained_at, ends)

        live = 0
        for s in streams:
            events = events_of(s)
            last = events[-1]
            assert last.get("event") == "cursor", events  # ended by the drain, on a position
            got = [e["data"] for e in events if e.get("event", "message") == "message"]
            if any('"during"' in d for d in got):
                live += 1
                continue
            # it ended before "during" came: resumed on the peer, it gets exactly that
            again = SSE("127.0.0.1", peer, [channel], last_event_id=last["id"])
            try:
                resumed = again.events(1)
                assert ['"during"' in e["data"] for e in resumed] == [True], resumed
            finally:
                again.close()
        assert live >= 1  # served during the window: the late streams had it as it came
        assert "ending 24 event streams spread over 4 s" in logged, logged[-2000:]
        assert "every event stream has ended" in logged, logged[-2000:]
