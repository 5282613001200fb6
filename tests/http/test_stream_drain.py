"""pushup/http/stream_drain.py: a drain's event streams end one per slot of the
window, each served until its time and ended on its position; on task.Clock."""

from __future__ import annotations

from random import Random

from pushup.http.stream_drain import end_delays
from tests.http.test_sse import ended, events, stream


def test_each_delay_falls_in_a_slot_of_its_own_within_the_window():
    delays = end_delays(8, 4.0, Random(7))
    assert sorted(int(d // 0.5) for d in delays) == list(range(8))
    assert all(0 <= d < 4.0 for d in delays)
    assert delays != sorted(delays)  # shuffled over the streams, not in their order
    assert end_delays(0, 4.0, Random(7)) == []


def test_a_drain_with_a_window_ends_one_stream_per_slot_each_on_its_position(node):
    conns = [stream(node, "a") for _ in range(4)]
    node.turn()
    held = node.node.handlers.event_streams
    assert len(held) == 4
    assert held.spread(4.0, Random(3)) == 4
    node.node.service.drain(keep=held.__contains__)
    node.turn()
    assert not any(ended(c) for c in conns)  # none ended at the drain itself
    for slot in range(1, 5):
        node.clock.advance(1.0)
        assert sum(ended(c) for c in conns) == slot
    assert len(held) == 0
    for c in conns:
        got = events(c)
        assert got[-1]["event"] == "cursor" and got[-1]["id"] == got[0]["id"]


def test_a_stream_given_a_time_is_still_answered_by_the_service_meanwhile(node):
    conn = stream(node, "a")
    node.turn()
    held = node.node.handlers.event_streams
    held.spread(200.0, Random(1))  # its time: 26.9 s, after a heartbeat
    node.node.service.drain(keep=held.__contains__)
    node.turn()
    node.clock.advance(15)  # its hold times out as before: a heartbeat, not an end
    assert events(conn)[-1]["event"] == "cursor" and not ended(conn)
    assert conn.transport.value().endswith(b": keep-alive\n\r\n")
    node.clock.advance(185)
    assert ended(conn)
