"""The webhook sender (pushup.ops.webhooks) on task.Clock with an HTTP client
double that answers when the test says: batching, backoff with the same
body, the bounded queue, giving up, and the one-sender rule. (A real node
and a real receiver: tests/e2e/test_webhooks.py.)"""
from __future__ import annotations

import json

from twisted.internet import defer, task

from pushup.core.roster import ADDED, OCCUPIED, Event
from pushup.ops.webhooks import BATCH_S, GIVE_UP_S, Webhooks, signature


class Answer:
    def __init__(self, code: int) -> None:
        self.code = code

    def content(self) -> defer.Deferred[bytes]:
        return defer.succeed(b"")


class Http:
    """Records each request; each is answered by ``answer(code)`` (or fails)."""

    def __init__(self) -> None:
        self.requests: list[tuple[bytes, dict, defer.Deferred]] = []

    def request(self, method, url, data, headers, timeout, reactor):
        d: defer.Deferred = defer.Deferred()
        self.requests.append((data, headers, d))
        return d

    def answer(self, code: int, i: int = -1) -> None:
        self.requests[i][2].callback(Answer(code))


def joins(n: int, channel: str = "a") -> list[Event]:
    return [Event(ADDED, channel, f"u{i}") for i in range(n)]


def sender(queue: int = 10_000, sends=lambda: True):
    clock, http = task.Clock(), Http()
    return clock, http, Webhooks(("http://r/hook",), "s", clock, http, "n1.x", queue=queue,
                                 sends=sends)


def events_of(body: bytes) -> list[dict]:
    return json.loads(body)["events"]


def test_events_within_the_batch_time_go_in_one_signed_request():
    clock, http, hooks = sender()
    hooks.events([Event(OCCUPIED, "a")])
    clock.advance(BATCH_S / 2)
    hooks.events(joins(2))
    assert http.requests == []
    clock.advance(BATCH_S / 2)
    [(body, headers, _)] = http.requests
    assert [e["id"] for e in events_of(body)] == ["n1.x-1", "n1.x-2", "n1.x-3"]
    assert events_of(body)[0] == {"id": "n1.x-1", "name": "channel_occupied", "channel": "a"}
    stamp = int(headers["X-PushUp-Webhook-Timestamp"][0])
    assert headers["X-PushUp-Webhook-Signature"] == [signature("s", stamp, body)]


def test_fifty_events_go_at_once_and_the_rest_follow_in_order():
    clock, http, hooks = sender()
    hooks.events(joins(120))
    assert [len(events_of(b)) for b, _, _ in http.requests] == [50]  # one in flight per URL
    http.answer(200)
    http.answer(200)  # the next fifty went as soon as the first were taken
    assert [len(events_of(b)) for b, _, _ in http.requests] == [50, 50]
    clock.advance(BATCH_S)  # the last twenty waited for others, the batch time
    assert [len(events_of(b)) for b, _, _ in http.requests] == [50, 50, 20]
    assert hooks.stats()["queued"] == 20


def test_a_failure_is_retried_with_the_same_body_after_backoff():
    clock, http, hooks = sender()
    hooks.events(joins(1))
    clock.advance(BATCH_S)
    http.answer(500)
    clock.advance(0.49)
    assert len(http.requests) == 1
    clock.advance(0.01)
    http.requests[-1][2].errback(ConnectionError("refused"))
    clock.advance(1.0)
    assert len(http.requests) == 3
    http.answer(204)
    assert len({body for body, _, _ in http.requests}) == 1
    assert hooks.stats() == {"sent": 1, "dropped": 0, "failures": 2, "requests": 3, "queued": 0}


def test_a_full_queue_drops_the_oldest_waiting_batch_not_the_one_in_flight():
    clock, http, hooks = sender(queue=60)
    hooks.events(joins(50, "first"))  # in flight, never answered
    hooks.events(joins(50, "second"))
    hooks.events(joins(10, "third"))
    clock.advance(BATCH_S)
    assert hooks.stats()["dropped"] == 50 and hooks.stats()["queued"] == 60
    http.answer(200)
    assert [e["channel"] for e in events_of(http.requests[-1][0])] == ["third"] * 10


def test_a_batch_not_accepted_for_ten_minutes_is_dropped():
    clock, http, hooks = sender()
    hooks.events(joins(3))
    clock.advance(BATCH_S)
    while clock.seconds() <= GIVE_UP_S + 60:
        if not http.requests[-1][2].called:
            http.answer(503)
        clock.advance(1)
    assert hooks.stats()["dropped"] == 3 and hooks.stats()["queued"] == 0


def test_a_node_that_is_not_the_sender_sends_nothing():
    clock, http, hooks = sender(sends=lambda: False)
    hooks.events(joins(3))
    clock.advance(BATCH_S)
    assert http.requests == [] and hooks.stats()["queued"] == 0
