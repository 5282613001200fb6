"""pushup/ops/fleet.py: the workers' board, in memory (a real memfd, no processes)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from pushup.ops.fleet import STALE, Board, Fleet, create_board


class Worker:
    """A worker's own figures, as ``Node.worker_stats`` gives them."""

    def __init__(self, index: int) -> None:
        self.figures: dict[str, Any] = {
            "node_id": f"w1-{index}", "origin": f"w1-{index}.x", "uptime_s": 1.0,
            "published": 0, "delivered": 0, "bytes_in": 0, "bytes_out": 0, "refused": 0,
            "peer_refused": 0, "connections": 1, "waiting": 0, "rss_bytes": 100,
            "channels": 5, "messages": 7, "cached_bytes": 70, "peers": []}

    def __call__(self) -> dict[str, Any]:
        return dict(self.figures)


class Wall:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def board():
    fd = create_board(2)
    yield lambda: Board(fd, 2)
    os.close(fd)


def test_counters_are_summed_and_replicas_not(board):
    wall = Wall()
    a, b = Worker(0), Worker(1)
    fa, fb = Fleet(board(), 0, a, wall), Fleet(board(), 1, b, wall)
    a.figures["published"], b.figures["published"] = 3, 4
    fb.publish()
    s = fa.stats()
    assert s["node_id"] == "w1"
    assert (s["published"], s["connections"], s["rss_bytes"]) == (7, 2, 200)
    assert (s["channels"], s["messages"]) == (5, 7)  # each worker holds the whole cache
    assert [(w["worker"], w["published"]) for w in s["workers"]] == [(0, 3), (1, 4)]
    text = fa.metrics_text().decode()
    assert "pushup_published_total 7.0" in text
    assert 'pushup_worker_published_total{worker="1"} 4.0' in text


def test_a_restarted_worker_continues_its_slot_counts(board):
    wall = Wall()
    a, b = Worker(0), Worker(1)
    fa = Fleet(board(), 0, a, wall)
    a.figures["published"] = 5
    fa.publish()
    # worker 0 dies; a new process takes its slot with fresh counters
    again = Fleet(board(), 0, Worker(0), wall)
    fb = Fleet(board(), 1, b, wall)
    assert fb.stats()["published"] == 5
    again.publish()
    s = fb.stats()
    assert s["published"] == 5 and s["workers"][0]["restarts"] == 1


def test_a_silent_worker_keeps_its_counts_but_not_its_gauges(board):
    wall = Wall()
    a, b = Worker(0), Worker(1)
    fa, fb = Fleet(board(), 0, a, wall), Fleet(board(), 1, b, wall)
    b.figures["published"] = 2
    fb.publish()
    wall.now += STALE + 1
    s = fa.stats()
    assert s["published"] == 2 and s["connections"] == 1
    assert [w["up"] for w in s["workers"]] == [True, False]


def test_a_reader_sees_the_last_complete_write(board):
    writer, reader = board(), board()
    assert reader.read(1) is None
    for n in range(5):
        writer.write(1, {"n": n})
        assert reader.read(1) == {"n": n}
