"""pushup/core/subscriptions.py as values: globs, the definition's hash, links
and their acks, the wake's moves (a move the table does not list is FENCED),
the retry schedule, leases, and which webhook URLs are refused."""
from __future__ import annotations

import pytest

from pushup.core import subscriptions
from pushup.core.errors import (
    AlreadyClaimed,
    BadRequest,
    Fenced,
    StreamsFull,
    SubscriptionConflict,
)
from pushup.core.stream_values import START, Position
from pushup.core.subscriptions import (
    MOVES,
    PULL_WAKE,
    WEBHOOK,
    Event,
    Phase,
    Registry,
    definition,
    glob_pattern,
    webhook_url_problem,
)

S = 1_000_000  # µs
HOOK = {"type": "webhook", "webhook": {"url": "https://hooks.example/x"}, "lease_ttl_ms": 1000}
PULL = {"type": "pull-wake", "wake_stream": "wake/pool", "lease_ttl_ms": 1000}


def at(n: int) -> Position:
    return Position(n, n * 10)


@pytest.mark.parametrize(("pattern", "path", "matches"), [
    ("events/*", "events/a", True),
    ("events/*", "events/a/b", False),
    ("events/*", "events", False),
    ("events/**", "events/a/b", True),
    ("a/**/z", "a/z", True),
    ("a/**/z", "a/b/c/z", True),
    ("a/**/z", "a/b/c", False),
    ("user-*/log", "user-7/log", True),
    ("a.b/*", "axb/c", False),  # no character is a regex's
])
def test_a_star_is_one_segment_and_two_are_any_number(pattern: str, path: str,
                                                      matches: bool) -> None:
    assert (glob_pattern(pattern).fullmatch(path) is not None) is matches


def test_the_same_definition_is_the_same_hash_and_another_is_a_conflict() -> None:
    one = definition({**HOOK, "pattern": "a/*", "streams": ["x", "b", "x"]})
    assert one.streams == ("b", "x")
    assert definition({**HOOK, "streams": ["b", "x"], "pattern": "a/*"}).digest == one.digest
    registry = Registry()
    registry.put("s", one, {}, 0)
    assert registry.put("s", one, {}, 1)[1] is False  # re-confirmed
    with pytest.raises(SubscriptionConflict):
        registry.put("s", definition({**HOOK, "pattern": "a/*", "description": "x"}), {}, 2)


@pytest.mark.parametrize("body", [
    {**HOOK}, {**HOOK, "pattern": "a/*", "lease_ttl_ms": 600_001},
    {**HOOK, "pattern": "a/*", "wake_stream": "w"}, {**PULL, "pattern": "a/*", "webhook": {}},
    {**HOOK, "pattern": "__ds/*x", "streams": ["__ds/x"]}, {**HOOK, "pattern": "a/**b"},
    {**HOOK, "pattern": "a/*", "extra": 1}, [], {**PULL, "pattern": "a/*", "wake_stream": ""},
])
def test_a_wrong_definition_is_refused(body: object) -> None:
    with pytest.raises(BadRequest):
        definition(body)


def test_existing_streams_link_at_their_tails_and_a_new_one_from_its_start() -> None:
    registry = Registry()
    sub, _ = registry.put("s", definition({**HOOK, "pattern": "a/*"}),
                          {"a/old": at(3), "b/other": at(1)}, 0)
    assert list(sub.links) == ["a/old"] and not sub.pending  # no history replayed
    assert registry.heard("a/new", at(1), created=True) == [sub]  # its first data wakes
    assert sub.links["a/new"].acked == START
    assert registry.heard("b/other", at(2), created=False) == []
    assert registry.heard("a/fork", at(4), created=True, start=at(4)) == []  # what it inherited
    assert sub.links["a/fork"].acked == at(4)


def test_an_explicit_link_outlives_its_removal_while_the_glob_matches() -> None:
    sub, _ = Registry().put("s", definition({**HOOK, "pattern": "a/*", "streams": ["m/x"]}),
                            {"a/y": at(2)}, 0)
    sub.add_explicit(("a/y",), {})
    assert sub.links["a/y"].link_type == "explicit"
    sub.remove_explicit("a/y")
    assert sub.links["a/y"].link_type == "glob"
    sub.remove_explicit("m/x")
    assert "m/x" not in sub.links


def webhook_with_work() -> tuple[Registry, object]:
    registry = Registry()
    sub, _ = registry.put("s", definition({**HOOK, "pattern": "a/*"}), {}, 0)
    registry.heard("a/1", at(2), created=True)
    return registry, sub


def test_done_acks_the_snapshot_and_what_came_after_wakes_again() -> None:
    _, sub = webhook_with_work()
    wake = sub.begin_wake("w1", 0)
    assert (sub.phase, wake.generation, wake.snapshot) == (Phase.DELIVERING, 1, {"a/1": at(2)})
    sub.heard("a/1", at(5), created=False)  # after the snapshot
    sub.answered("w1", True, 1)
    assert sub.phase is Phase.IDLE and sub.links["a/1"].acked == at(2) and sub.pending
    assert sub.begin_wake("w2", 2).generation == 2


def test_a_callback_of_another_wake_or_generation_is_fenced() -> None:
    _, sub = webhook_with_work()
    wake = sub.begin_wake("w1", 0)
    sub.answered("w1", False, 0)
    with pytest.raises(Fenced):
        sub.fenced("w0", wake.generation, wake.generation)
    with pytest.raises(Fenced):
        sub.fenced("w1", wake.generation + 1, wake.generation)
    with pytest.raises(Fenced):
        sub.fenced("w1", wake.generation, wake.generation - 1)  # the token's generation
    sub.fenced("w1", wake.generation, wake.generation)
    assert sub.finish([{"stream": "a/1", "offset": at(2).offset}], True, 1) is False
    with pytest.raises(Fenced):  # done: no wake is current
        sub.fenced("w1", wake.generation, wake.generation)


def test_an_ack_past_the_tail_is_refused_and_applies_nothing() -> None:
    _, sub = webhook_with_work()
    sub.begin_wake("w1", 0)
    with pytest.raises(BadRequest):
        sub.acked([{"stream": "a/1", "offset": at(9).offset}])
    assert sub.links["a/1"].acked == START


def test_a_failed_post_backs_off_from_one_second_to_sixty_within_a_fifth() -> None:
    _, sub = webhook_with_work()
    wake = sub.begin_wake("w1", 0)
    delays = []
    now = 0
    for jitter in (0.0, 0.0, 0.0, 1.0, -1.0, 0.0, 0.0, 0.0, 1.0):
        wake.attempts += 1
        retry_at = sub.failed("w1", jitter, now)
        assert retry_at is not None and sub.status == "failed"
        delays.append((retry_at - now) / S)
        now = retry_at
        sub.retry(now)
    assert delays == [1.0, 2.0, 4.0, 9.6, 12.8, 32.0, 60.0, 60.0, 72.0]
    assert (sub.wake.wake_id, sub.wake.generation) == ("w1", 1)  # the same wake, retried


def test_a_pull_wake_is_claimed_once_and_its_lease_ends_it() -> None:
    registry = Registry()
    sub, _ = registry.put("p", definition({**PULL, "pattern": "a/*"}), {}, 0)
    assert registry.heard("wake/pool", at(1), created=True) == []  # its own wakes: never
    registry.heard("a/1", at(1), created=True)
    sub.begin_wake("w1", 0)
    assert sub.claim("worker-1", 0).holder == "worker-1"
    with pytest.raises(AlreadyClaimed) as refused:
        sub.claim("worker-2", 1)
    assert refused.value.fields == {"current_holder": "worker-1", "generation": 1}
    assert sub.finish([], False, 500_000) is True  # a heartbeat: the lease goes on
    assert not sub.expire(1_000_000)
    assert sub.expire(1_500_000) and sub.phase is Phase.IDLE and sub.wake is None


def test_each_kind_moves_only_among_its_own_phases() -> None:
    own = {WEBHOOK: {Phase.IDLE, Phase.DELIVERING, Phase.RETRYING, Phase.AWAITING},
           PULL_WAKE: {Phase.IDLE, Phase.WAKE_WRITTEN, Phase.CLAIMED}}
    for (kind, before, event), after in MOVES.items():
        assert isinstance(event, Event)
        assert {before, after} <= own[kind], (kind, before, event, after)


@pytest.mark.parametrize(("url", "refused"), [
    ("https://hooks.example.com/x", False),
    ("http://localhost:9000/x", False),
    ("http://127.0.0.7/x", False),
    ("https://127.0.0.1/x", False),
    ("http://hooks.example.com/x", True),  # production is https
    ("http://10.0.0.1/hook", True),
    ("https://10.0.0.1/hook", True),
    ("https://192.168.1.1/", True),
    ("https://169.254.169.254/latest", True),  # the cloud metadata endpoint
    ("https://[::1]/", True),
    ("https://[fe80::1]/", True),
    ("https://127.0.1.1/", True),  # loopback outside the exception
    ("https://user:pw@hooks.example.com/", True),
    ("ftp://hooks.example.com/", True),
    ("https://printer.local/", True),
    ("https://hooks.example.com:99999/", True),
])
def test_a_webhook_url_is_public_https_or_local_development(url: str, refused: bool) -> None:
    assert (webhook_url_problem(url) is not None) is refused


def test_a_node_holds_at_most_its_number_of_subscriptions(monkeypatch) -> None:
    monkeypatch.setattr(subscriptions, "MAX_SUBSCRIPTIONS", 2)
    registry = Registry()
    spec = definition({**HOOK, "pattern": "a/*"})
    registry.put("one", spec, {}, 0)
    registry.put("two", spec, {}, 0)
    assert registry.put("two", spec, {}, 1)[1] is False  # re-confirming is no new one
    with pytest.raises(StreamsFull):
        registry.put("three", spec, {}, 2)
