"""What every engine's link to the outside does the same way: how long to wait
before trying again, saying a change of state once, which error a request
that got no answer is, and the Deferred plumbing around several calls.

The rule: the mesh's peer links and the Redis connections (and what runs over
them) take these from here instead of writing them again, so a node backs off,
logs and answers 503 or 504 the same way whichever engine runs. Pure values
and small helpers over Deferreds: this module opens no connection, reads no
clock and logs nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from pushup.core import errors

T = TypeVar("T")

BACKOFF_BASE = 0.1  # seconds before the attempt after the first failure; doubles per failure
BACKOFF_DOUBLINGS = 16  # 0.1 * 2 ** 16 = 6,553 s: past any cap


# --- backoff -------------------------------------------------------------------------

def backoff(failures: int, *, cap: float, base: float = BACKOFF_BASE, jitter: float = 0.0,
            draw: float = 0.0) -> float:
    """Seconds to wait before the next attempt after ``failures`` failures in a
    row (0: ``base``): ``base``, doubled per failure up to ``cap``, and ``cap``
    from then on for as long as it fails, each shortened by ``jitter * draw``
    of itself (``draw`` in [0, 1), a fresh random number per attempt) so the
    nodes that lost the same peer do not retry in step. Defined for any count:
    the doubling stops at the cap (``0.1 * 2 ** 1024`` overflows a float)."""
    doubled = base * 2.0 ** min(max(failures, 0), BACKOFF_DOUBLINGS)
    return min(cap, doubled) * (1.0 - jitter * draw)


# --- saying a change once -------------------------------------------------------------

class SaidOnce:
    """What a link last said of its trouble, so that each change is logged once
    and never once per retry: ``new(why)`` is True (and remembers ``why``) only
    when ``why`` differs from what was said last; ``clear()`` once the trouble
    is over, so that the same trouble coming back is said again."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = ""

    def new(self, why: str) -> bool:
        if why == self.last:
            return False
        self.last = why
        return True

    def clear(self) -> None:
        self.last = ""


# --- the 503/504 rule -----------------------------------------------------------------

def unanswered(*, sent: bool, never_sent: str, no_answer: str) -> errors.PushUpError:
    """What a client is told when the engine did not answer its request: a
    request that never left this node (so nothing can have been done: retry
    anywhere) is 503 ``EngineUnavailable(never_sent)``; one that was sent and
    got no answer (it may have been done, or be done yet: retry it with the
    same Idempotency-Key or producer headers) is 504
    ``OutcomeUnknown(no_answer)``."""
    if sent:
        return errors.OutcomeUnknown(no_answer)
    return errors.EngineUnavailable(never_sent)


# --- Deferreds ------------------------------------------------------------------------

def first_failure(failure: Failure) -> Failure:
    """A call over several Deferreds (``gatherResults``) failed: the first one's
    failure, as if that call had been made alone."""
    if isinstance(failure.value, defer.FirstError):
        first: Failure = failure.value.subFailure
        return first
    return failure


def gather(calls: Sequence[Deferred[T]]) -> Deferred[list[T]]:
    """Every call's result, in order, once all have fired; else the first
    failure (``first_failure``), the others' consumed."""
    gathered: Deferred[list[T]] = defer.gatherResults(list(calls), consumeErrors=True)
    gathered.addErrback(first_failure)
    return gathered


class SingleFlight:
    """One run at a time, and once more after it when asked during it.

    ``ask(run)`` starts ``run()`` when no run is under way and returns its
    Deferred, whose first callback marks the run ended (so ``running`` is
    False in every callback the caller adds); during a run it returns None and
    one more run is owed, however many times it was asked. The owner decides
    when the owed run starts: ``take_owed()`` is True once per run owed (a
    run asked for after the one under way began may have missed what prompted
    the ask). What a run does and what its end means is the owner's."""

    __slots__ = ("running", "_owed")

    def __init__(self) -> None:
        self.running = False
        self._owed = False

    @property
    def owed(self) -> bool:
        """A run was asked for during the one under way (or the last one)."""
        return self._owed

    def ask(self, run: Callable[[], Deferred[Any]]) -> Deferred[Any] | None:
        if self.running:
            self._owed = True
            return None
        self.running = True
        started: Deferred[Any] = defer.maybeDeferred(run)
        started.addBoth(self._ended)
        return started

    def take_owed(self) -> bool:
        """Whether a run is owed; from now on it is not."""
        owed, self._owed = self._owed, False
        return owed

    def _ended(self, result: Any) -> Any:
        self.running = False
        return result
