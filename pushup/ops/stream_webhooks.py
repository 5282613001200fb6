"""Durable Streams webhook deliveries (protocol §7.1), signed and bounded.

Each wake's POST is signed with the node's Ed25519 key
(:mod:`pushup.ops.webhook_key`) and sent by :func:`pushup.ops.webhooks.post`,
the node's one webhook sender, with a ``TIMEOUT_S`` answer and at most
``ANSWER_MOST`` bytes of it read. At most ``CONCURRENCY`` POSTs are under
way at once; the others wait, in order, up to ``queue`` of them; past that
a delivery is refused at once (counted, ``dropped``): the subscription
backs off and tries again (:mod:`pushup.http.stream_subscriptions`), so a
slow or dead receiver costs a bounded queue, never the reactor's time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from twisted.internet import defer

from pushup.ops.webhook_key import NodeKey, WebhookKey
from pushup.ops.webhooks import post

TIMEOUT_S = 10.0
ANSWER_MOST = 64 * 1024
CONCURRENCY = 64


class QueueFull(Exception):
    """The delivery was refused: ``queue`` deliveries wait already."""


@dataclass(slots=True)
class _Waiting:
    url: str
    body: bytes
    done: defer.Deferred[tuple[int, bytes]]


class WakeSender:
    """``send(url, body)``: a Deferred of the receiver's (status, body)."""

    def __init__(self, key: WebhookKey | NodeKey, http: Any, clock: Any, queue: int) -> None:
        self.key = key
        self.http = http
        self.clock = clock
        self.limit = queue
        self._waiting: deque[_Waiting] = deque()
        self.in_flight = 0
        self.sent = 0  # POSTs answered (any status)
        self.failed = 0  # POSTs that got no answer
        self.dropped = 0  # deliveries refused: the queue was full

    def send(self, url: str, body: bytes) -> defer.Deferred[tuple[int, bytes]]:
        done: defer.Deferred[tuple[int, bytes]] = defer.Deferred()
        if self.in_flight < CONCURRENCY:
            self._post(_Waiting(url, body, done))
        elif len(self._waiting) >= self.limit:
            self.dropped += 1
            done.errback(QueueFull(f"{self.limit} deliveries wait already"))
        else:
            self._waiting.append(_Waiting(url, body, done))
        return done

    @defer.inlineCallbacks
    def _post(self, item: _Waiting) -> Any:
        self.in_flight += 1
        stamp = int(self.clock.seconds())
        headers = {"Content-Type": ["application/json"],
                   "Webhook-Signature": [self.key.signature(stamp, item.body)]}
        try:
            answer = yield post(self.http, self.clock, item.url, item.body, headers,
                                TIMEOUT_S, ANSWER_MOST)
        except Exception as e:  # down, slow or unreachable: the caller retries
            self.failed += 1
            self._next()
            item.done.errback(e)
            return
        self.sent += 1
        self._next()
        item.done.callback(answer)

    def _next(self) -> None:
        self.in_flight -= 1
        if self._waiting:
            self._post(self._waiting.popleft())

    def stats(self) -> dict[str, int]:
        return {"in_flight": self.in_flight, "queued": len(self._waiting), "sent": self.sent,
                "failed": self.failed, "dropped": self.dropped}
