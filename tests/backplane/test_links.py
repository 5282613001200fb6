"""The link toolkit every engine shares: backoff, saying a change once, the
503/504 rule, and the Deferred helpers (on plain Deferreds)."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from pushup.backplane.links import (
    SaidOnce,
    SingleFlight,
    backoff,
    first_failure,
    gather,
    unanswered,
)
from pushup.core import errors

# --- backoff -------------------------------------------------------------------------


def test_backoff_doubles_from_its_base_up_to_its_cap() -> None:
    assert [backoff(n, cap=1.0) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_backoff_stays_at_its_cap_for_any_count_of_failures() -> None:
    assert backoff(10_000, cap=5.0) == 5.0  # 0.1 * 2 ** 10_000 would overflow a float


def test_jitter_shortens_a_wait_by_its_share_of_the_draw() -> None:
    assert backoff(20, cap=5.0, jitter=0.2, draw=0.5) == pytest.approx(4.5)
    assert backoff(20, cap=5.0, jitter=0.2, draw=0.0) == 5.0


def test_backoff_from_another_base() -> None:
    assert backoff(2, cap=10.0, base=0.5) == 2.0


# --- saying a change once -------------------------------------------------------------


def test_the_same_trouble_is_said_once_and_again_after_it_cleared() -> None:
    said = SaidOnce()
    assert [said.new(w) for w in ("refused", "refused", "timed out", "refused")] == [
        True, False, True, True]
    assert not said.new("refused")
    said.clear()
    assert said.new("refused")


# --- the 503/504 rule -----------------------------------------------------------------


def test_a_request_never_sent_is_503_and_one_sent_without_answer_504() -> None:
    never = unanswered(sent=False, never_sent="down", no_answer="lost")
    sent = unanswered(sent=True, never_sent="down", no_answer="lost")
    assert isinstance(never, errors.EngineUnavailable) and str(never) == "down"
    assert (never.status, never.code) == (503, "engine_unavailable")
    assert isinstance(sent, errors.OutcomeUnknown) and str(sent) == "lost"
    assert (sent.status, sent.code) == (504, "outcome_unknown")


# --- Deferreds ------------------------------------------------------------------------


def test_gather_fires_with_every_result_in_order() -> None:
    a: Deferred[int] = Deferred()
    b: Deferred[int] = Deferred()
    got: list[Any] = []
    gather([a, b]).addCallback(got.append)
    b.callback(2)
    a.callback(1)
    assert got == [[1, 2]]


def test_gather_fails_with_the_first_failure_itself() -> None:
    a: Deferred[int] = Deferred()
    b: Deferred[int] = Deferred()
    got: list[Failure] = []
    gather([a, b]).addErrback(got.append)
    a.errback(KeyError("first"))
    b.errback(ValueError("second"))  # consumed: no unhandled error
    assert len(got) == 1 and got[0].check(KeyError)


def test_first_failure_leaves_a_lone_failure_alone() -> None:
    lone = Failure(ValueError("alone"))
    assert first_failure(lone) is lone


# --- single flight ----------------------------------------------------------------------


def test_a_single_flight_runs_at_once_when_idle() -> None:
    flight = SingleFlight()
    run: Deferred[str] = Deferred()
    seen: list[bool] = []
    started = flight.ask(lambda: run)
    assert started is not None and flight.running
    started.addCallback(lambda result: seen.append(flight.running) or result)
    run.callback("done")
    assert seen == [False] and not flight.running  # the owner's callbacks see it ended
    assert not flight.take_owed()


def test_asks_during_a_run_owe_one_more_run_however_many() -> None:
    flight = SingleFlight()
    first: Deferred[None] = Deferred()
    calls: list[int] = []

    def run() -> Deferred[None]:
        calls.append(1)
        return first

    assert flight.ask(run) is not None
    assert flight.ask(run) is None and flight.ask(run) is None
    assert calls == [1] and flight.owed  # not run again while the first is under way
    first.callback(None)
    assert flight.take_owed() and not flight.take_owed()  # once


def test_a_failed_run_ends_the_flight_and_keeps_what_is_owed() -> None:
    flight = SingleFlight()
    run: Deferred[None] = Deferred()
    started = flight.ask(lambda: run)
    assert started is not None
    flight.ask(lambda: defer.succeed(None))
    failures: list[Failure] = []
    started.addErrback(failures.append)
    run.errback(RuntimeError("no answer"))
    assert len(failures) == 1 and not flight.running and flight.owed


def test_a_run_that_raises_ends_the_flight() -> None:
    flight = SingleFlight()

    def broken() -> Deferred[None]:
        raise RuntimeError("broken")

    started = flight.ask(broken)
    assert started is not None and not flight.running
    started.addErrback(lambda _: None)


def test_a_run_that_fires_at_once_lets_the_next_ask_start() -> None:
    flight = SingleFlight()
    assert flight.ask(lambda: defer.succeed(1)) is not None
    assert flight.ask(lambda: defer.succeed(2)) is not None
    assert not flight.owed
