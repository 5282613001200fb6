"""pushup/http/flow.py: read-ahead, output the client takes, one timer, as values on task.Clock."""

from __future__ import annotations

from twisted.internet.task import Clock

from pushup.http.flow import PIPELINE_BYTES, Flow


class Transport:
    """Records the producer calls a Flow makes on its connection."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:  # Twisted's names
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")


def make() -> tuple[Clock, Flow, list[float]]:
    clock = Clock()
    fired: list[float] = []
    return clock, Flow(clock, lambda: fired.append(clock.seconds())), fired


def test_reading_pauses_once_past_the_read_ahead_and_resumes_once_answered() -> None:
    _, flow, _ = make()
    conn = Transport()
    flow.read_ahead(PIPELINE_BYTES, conn)  # type: ignore[arg-type]
    assert conn.calls == []
    flow.read_ahead(PIPELINE_BYTES + 1, conn)  # type: ignore[arg-type]
    flow.read_ahead(PIPELINE_BYTES + 2, conn)  # type: ignore[arg-type]
    assert conn.calls == ["pause"]
    flow.read_on(conn)  # type: ignore[arg-type]
    flow.read_on(conn)  # type: ignore[arg-type]
    assert conn.calls == ["pause", "resume"]


def test_the_timer_fires_once_at_the_earliest_deadline_asked() -> None:
    clock, flow, fired = make()
    flow.arm(10)
    flow.arm(4)
    flow.arm(7)  # later than the one armed: no change
    flow.arm_unless_armed(1)  # armed already: no change
    clock.pump([1] * 10)
    assert fired == [4]


def test_output_not_taken_arms_the_send_timeout_from_when_it_stopped() -> None:
    clock, flow, fired = make()
    clock.advance(1)
    flow.output_blocked(send_timeout=5)
    clock.advance(2)
    flow.output_blocked(send_timeout=5)  # still since 1
    assert flow.blocked_since == 1
    clock.pump([1] * 10)
    assert fired == [6]


def test_a_stream_waiting_to_write_writes_on_a_later_turn_once_output_is_taken() -> None:
    clock, flow, _ = make()
    written: list[str] = []
    flow.output_blocked(send_timeout=5)
    flow.when_writable(lambda: written.append("page"), lambda f: f())
    clock.advance(0)
    assert written == []
    flow.output_taken(False, lambda f: f())
    assert written == [] and flow.blocked_since is None
    clock.advance(0)
    assert written == ["page"]


def test_a_lost_flow_calls_nothing_and_holds_no_callback() -> None:
    clock, flow, fired = make()
    flow.arm(1)
    flow.output_blocked(send_timeout=5)
    flow.when_writable(lambda: None, lambda f: f())
    flow.lost()
    clock.advance(10)
    assert fired == []
    assert flow._on_timer.__name__ == "_nothing" and flow._on_writable is None
