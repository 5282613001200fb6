"""When to try again, and where: jittered exponential backoff over the
client's nodes, honouring ``Retry-After``.

Pure: the caller sleeps and sends; this module only computes the delays and
the next node. The random source is a parameter so tests can pin it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from pushup.client.values import APIError, Unavailable

RETRYABLE_STATUSES = frozenset({500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays of "full jitter" exponential backoff: attempt ``n`` (0-based)
    waits a uniform time in [base·2ⁿ/2, base·2ⁿ], capped at ``cap``, and never
    less than the server's ``Retry-After``."""

    base: float = 0.1
    cap: float = 5.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        top = min(self.cap, self.base * (2 ** attempt))
        wait = self.rng.uniform(top / 2, top)
        if retry_after is not None:
            wait = max(wait, min(retry_after, 60.0))
        return wait


def retry_after_seconds(header: str | None) -> float | None:
    """The delay a ``Retry-After: <seconds>`` header asks for (None if absent
    or an HTTP date, which PushUp never sends)."""
    if header is None:
        return None
    try:
        seconds = float(header.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class Rotation:
    """The client's nodes, starting at a random one; ``advance`` moves to the
    next after a failure so a retry goes elsewhere."""

    def __init__(self, urls: Sequence[str], rng: random.Random) -> None:
        if not urls:
            raise ValueError("give at least one base URL")
        self.urls = [u.rstrip("/") for u in urls]
        self._index = rng.randrange(len(self.urls))

    @property
    def current(self) -> str:
        return self.urls[self._index]

    def advance(self) -> None:
        self._index = (self._index + 1) % len(self.urls)


class Attempts:
    """The decisions of one logical request over its attempts: each outcome
    gives the delay before the next attempt, or raises. A 4xx raises
    ``APIError`` at once; a retryable outcome past the last try raises
    ``Unavailable``, saying whether anything may have been stored."""

    def __init__(self, what: str, tries: int, backoff: Backoff,
                 idempotency_key: str | None = None) -> None:
        self.what = what
        self.tries = tries
        self.backoff = backoff
        self.idempotency_key = idempotency_key
        self.made = 0
        self.outcome_unknown = False

    def answered(self, status: int, code: str, message: str, retry_after: str | None) -> float:
        """An error answer (status >= 400)."""
        if status not in RETRYABLE_STATUSES:
            raise APIError(status, code, message)
        # PushUp's own 503 says nothing was stored; a 504 or a proxy's 5xx may hide a store
        self.outcome_unknown |= not (status == 503 and code)
        return self._next(status, code, None, retry_after_seconds(retry_after))

    def failed(self, error: Exception, sent: bool) -> float:
        """No answer: ``sent`` is False when no connection was made."""
        self.outcome_unknown |= sent
        return self._next(None, None, error, None)

    def _next(self, status: int | None, code: str | None, error: Exception | None,
              retry_after: float | None) -> float:
        self.made += 1
        if self.made >= self.tries:
            raise Unavailable(self.what, self.made, status, code, self.outcome_unknown,
                              self.idempotency_key) from error
        return self.backoff.delay(self.made - 1, retry_after)
