"""pushup.client.retry: the delays and decisions, as values (no network, no sleep)."""
from __future__ import annotations

import random

import pytest

from pushup.client import APIError, Backoff, Unavailable
from pushup.client.retry import Attempts, retry_after_seconds


def test_a_delay_is_jittered_within_its_doubling_step_and_capped() -> None:
    backoff = Backoff(base=0.1, cap=1.0, rng=random.Random(7))
    for attempt, top in [(0, 0.1), (1, 0.2), (3, 0.8), (9, 1.0)]:
        delays = {backoff.delay(attempt) for _ in range(50)}
        assert all(top / 2 <= d <= top for d in delays) and len(delays) > 1


def test_a_delay_is_never_shorter_than_retry_after() -> None:
    assert Backoff(base=0.1, cap=1.0).delay(0, retry_after=3.0) == 3.0
    assert retry_after_seconds("1") == 1.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") is None


def test_a_4xx_raises_at_once_with_status_and_code() -> None:
    attempts = Attempts("publish", 5, Backoff())
    with pytest.raises(APIError) as refused:
        attempts.answered(422, "idempotency_key_reused", "another body", None)
    assert (refused.value.status, refused.value.code) == (422, "idempotency_key_reused")


def test_only_503s_and_refused_connections_say_nothing_was_stored() -> None:
    sure = Attempts("publish", 3, Backoff(base=0.0), "k")
    sure.answered(503, "engine_unavailable", "", "1")
    sure.failed(ConnectionRefusedError(), sent=False)
    with pytest.raises(Unavailable) as down:
        sure.answered(503, "overloaded", "", None)
    assert (down.value.attempts, down.value.outcome_unknown) == (3, False)
    assert (down.value.status, down.value.code, down.value.idempotency_key) == (
        503, "overloaded", "k")

    unsure = Attempts("publish", 2, Backoff(base=0.0))
    unsure.answered(504, "outcome_unknown", "", None)
    with pytest.raises(Unavailable) as maybe:
        unsure.answered(503, "engine_unavailable", "", None)
    assert maybe.value.outcome_unknown


def test_a_proxys_503_without_pushups_body_may_hide_a_store() -> None:
    attempts = Attempts("publish", 1, Backoff())
    with pytest.raises(Unavailable) as down:
        attempts.answered(503, "", "<html>No server is available</html>", None)
    assert down.value.outcome_unknown
