"""The core's clock: ``Alarm`` keeps one timer for any number of deadlines and
fires no later than the earliest; ``micros`` turns the clock's seconds into
the core's microseconds. Driven on Twisted's ``task.Clock``, which is the
``Clock`` a test injects."""

from __future__ import annotations

from twisted.internet.task import Clock as TaskClock

from pushup.core.clock import Alarm, micros


def test_micros_rounds_the_clocks_seconds_to_whole_microseconds() -> None:
    assert micros(0.0) == 0
    assert micros(1.5) == 1_500_000
    assert micros(1_700_000_000.123456) == 1_700_000_000_123_456
    assert micros(0.0000004) == 0
    assert micros(0.0000006) == 1


def test_an_alarm_holds_one_timer_for_many_deadlines_and_fires_at_the_earliest() -> None:
    clock = TaskClock()
    fired: list[int] = []
    alarm = Alarm(clock, fired.append)
    for deadline in (5_000_000, 3_000_000, 4_000_000, 6_000_000):
        alarm.set(deadline, micros(clock.seconds()))
    assert [call.getTime() for call in clock.getDelayedCalls() if call.active()] == [3.0]
    clock.advance(2.999999)
    assert fired == []
    clock.advance(0.000001)
    assert fired == [3_000_000]
    assert not [call for call in clock.getDelayedCalls() if call.active()]


def test_an_earlier_deadline_moves_the_timer_and_none_disarms_it() -> None:
    clock = TaskClock()
    fired: list[int] = []
    alarm = Alarm(clock, fired.append)
    alarm.set(10_000_000, 0)
    alarm.set(1_000_000, 0)
    assert [call.getTime() for call in clock.getDelayedCalls() if call.active()] == [1.0]
    alarm.set(None, 0)
    assert not [call for call in clock.getDelayedCalls() if call.active()]
    clock.advance(20)
    assert fired == []


def test_a_deadline_already_past_fires_on_the_next_turn() -> None:
    clock = TaskClock()
    clock.advance(7)
    fired: list[int] = []
    Alarm(clock, fired.append).set(6_000_000, micros(clock.seconds()))
    clock.advance(0)
    assert fired == [6_000_000]
