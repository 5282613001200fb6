"""Drive the real (global) reactor from a plain pytest test, bounded in time.

The reactor is never ``run()`` (it cannot be restarted): ``wait_for`` turns it
with ``reactor.iterate`` until a Deferred has fired, or fails the test after
``timeout`` seconds. Each turn blocks in epoll until there is I/O or a timer is
due, so waiting costs no CPU and needs no sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

reactor: Any = _reactor
TURN = 0.05  # seconds one iteration may block at most, so the deadline is honoured


def wait_for(deferred: Deferred[Any], timeout: float = 5.0) -> Any:
    """The Deferred's result; its failure is raised. Consumes the result."""
    outcome: list[Any] = []
    deferred.addBoth(outcome.append)
    run_until(lambda: bool(outcome), timeout, f"{deferred!r} to fire")
    if isinstance(outcome[0], Failure):
        outcome[0].raiseException()
    return outcome[0]


def run_until(condition: Callable[[], bool], timeout: float = 5.0,
              what: str = "the condition") -> None:
    """Turn the reactor until ``condition()`` holds; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"waited {timeout} s for {what}")
        reactor.iterate(min(TURN, left))


def failure_of(deferred: Deferred[Any], timeout: float = 5.0) -> BaseException:
    """The exception the Deferred fails with (AssertionError if it succeeds)."""
    try:
        result = wait_for(deferred, timeout)
    except AssertionError:
        raise
    except BaseException as error:
        return error
    raise AssertionError(f"expected a failure, got {result!r}")
