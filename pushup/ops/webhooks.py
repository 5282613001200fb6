"""Webhooks: the cluster's presence events POSTed to ``--webhook-url``, batched and signed.

Events are gathered for at most ``BATCH_S`` (or ``BATCH_MAX`` events, which
sends at once) into one batch; each batch gets its body once (``time_ms``,
the events with their ids) and is sent to every URL, one request at a time
per URL, in order, retried with backoff until the receiver answers 2xx. A
URL holds at most ``queue`` events: past it its oldest batch is dropped
(counted), as is a batch retried for longer than ``GIVE_UP_S``. So a slow or
dead receiver costs bounded memory, and nothing here ever waits on the
delivery of messages. Each request is signed: ``X-PushUp-Webhook-Timestamp``
(Unix seconds, per attempt) and ``X-PushUp-Webhook-Signature: sha256=<hex
HMAC-SHA256(secret, timestamp + "." + body)>``. Which node sends is asked of
``sends`` per batch (the cluster's one sender: :mod:`pushup.http.presence`'s
roster knows the live nodes).
"""

from __future__ import annotations

import hashlib
import hmac
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from pushup.core.model import dumps
from pushup.core.roster import Event

log = Logger()
BATCH_S = 0.25  # the longest an event waits for others to share its request
BATCH_MAX = 50  # events in one request at most
TIMEOUT_S = 5.0  # a receiver's answer to one request
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)  # between attempts, then the last again
GIVE_UP_S = 600.0  # a batch not accepted for this long is dropped


@dataclass(slots=True)
class _Batch:
    body: bytes
    events: int
    first_try: float = 0.0
    attempts: int = 0


@dataclass(slots=True)
class _Target:
    url: str
    queue: deque[_Batch] = field(default_factory=deque)
    queued: int = 0  # events in ``queue``
    busy: bool = False  # a request or a backoff is under way
    failing: bool = False  # said once in the log per outage


@dataclass(slots=True)
class Figures:
    sent: int = 0  # events accepted by a receiver (per URL)
    dropped: int = 0  # events given up on (per URL)
    failures: int = 0  # attempts not answered 2xx
    requests: int = 0  # attempts made


@defer.inlineCallbacks
def post(http: Any, clock: Any, url: str, body: bytes, headers: dict[str, list[str]],
         timeout: float, most: int = 0) -> Any:
    """POST ``body`` to ``url`` (treq's ``http``): a Deferred of the answer's
    status and at most ``most`` bytes of its body (it is read through, so
    the connection is kept); failing for a receiver down, slow or unreachable.
    Every webhook of a node is sent by this function (presence events here,
    Durable Streams wakes by :mod:`pushup.ops.stream_webhooks`)."""
    response = yield http.request("POST", url, data=body, headers=headers, timeout=timeout,
                                  reactor=clock)
    if most <= 0:
        yield response.content()  # read through, so the connection is kept
        return response.code, b""
    kept: list[bytes] = []
    room = [most]

    def collect(chunk: bytes) -> None:
        if room[0] > 0:
            kept.append(chunk[:room[0]])
            room[0] -= len(kept[-1])

    from treq import collect as read_through

    yield read_through(response, collect)
    return response.code, b"".join(kept)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


class Webhooks:
    """The sender. ``events`` is a listener of the presence desk; ``ids`` is
    this node's origin (node id and boot), so an id is unique in the cluster
    and the same on every retry."""

    def __init__(self, urls: tuple[str, ...], secret: str, clock: Any, http: Any, ids: str,
                 queue: int = 10_000, sends: Callable[[], bool] = lambda: True) -> None:
        self.secret = secret
        self.clock = clock
        self.http = http
        self.ids = ids
        self.limit = queue
        self.sends = sends
        self.figures = Figures()
        self._targets = [_Target(url) for url in urls]
        self._pending: list[dict[str, str]] = []
        self._timer: Any = None
        self._count = 0

    def events(self, events: list[Event]) -> None:
        """The cluster's presence changed (every node sees it; one sends)."""
        if not self.sends():
            return
        for event in events:
            self._count += 1
            item = {"id": f"{self.ids}-{self._count}", "name": event.name,
                    "channel": event.channel}
            if event.user is not None:
                item["user"] = event.user
            self._pending.append(item)
            if len(self._pending) >= BATCH_MAX:
                self._flush()
        if self._pending and self._timer is None:
            self._timer = self.clock.callLater(BATCH_S, self._flush)

    def _flush(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        events, self._pending = self._pending[:BATCH_MAX], self._pending[BATCH_MAX:]
        if self._pending:
            self._timer = self.clock.callLater(0, self._flush)
        if not events:
            return
        body = dumps({"time_ms": int(self.clock.seconds() * 1000), "events": events})
        for target in self._targets:
            target.queue.append(_Batch(body, len(events)))
            target.queued += len(events)
            first = 1 if target.busy else 0  # the batch in flight stays
            while target.queued > self.limit and len(target.queue) > first:
                dropped = target.queue[first]
                del target.queue[first]
                self._drop(target, dropped, "its queue is full")
            self._next(target)

    def _drop(self, target: _Target, batch: _Batch, why: str) -> None:
        target.queued -= batch.events
        self.figures.dropped += batch.events
        log.warn("webhook {url}: {n} events dropped ({why})", url=target.url, n=batch.events,
                 why=why)

    def _next(self, target: _Target) -> None:
        if target.busy or not target.queue:
            return
        target.busy = True
        self._attempt(target, target.queue[0])

    @defer.inlineCallbacks
    def _attempt(self, target: _Target, batch: _Batch) -> Any:
        now = self.clock.seconds()
        if not batch.attempts:
            batch.first_try = now
        batch.attempts += 1
        self.figures.requests += 1
        stamp = int(now)
        headers = {"Content-Type": ["application/json"],
                   "X-PushUp-Webhook-Timestamp": [str(stamp)],
                   "X-PushUp-Webhook-Signature": [signature(self.secret, stamp, batch.body)]}
        why = ""
        try:
            code, _ = yield post(self.http, self.clock, target.url, batch.body, headers,
                                 TIMEOUT_S)
            ok = 200 <= code < 300
            why = f"answered {code}"
        except Exception as e:  # the receiver is down, slow or unreachable: retried
            ok = False
            why = type(e).__name__
        self._done(target, batch, ok, why)

    def _done(self, target: _Target, batch: _Batch, ok: bool, why: str) -> None:
        if not target.queue or target.queue[0] is not batch:  # dropped meanwhile
            target.busy = False
            self._next(target)
            return
        if ok:
            target.queue.popleft()
            target.queued -= batch.events
            self.figures.sent += batch.events
            if target.failing:
                target.failing = False
                log.info("webhook {url}: delivering again", url=target.url)
            target.busy = False
            self._next(target)
            return
        self.figures.failures += 1
        if not target.failing:
            target.failing = True
            log.warn("webhook {url}: {why}; retrying with backoff", url=target.url, why=why)
        if self.clock.seconds() - batch.first_try > GIVE_UP_S:
            target.queue.popleft()
            self._drop(target, batch, f"not accepted for {GIVE_UP_S:g} s")
            target.busy = False
            self._next(target)
            return
        delay = BACKOFF_S[min(batch.attempts, len(BACKOFF_S)) - 1]
        self.clock.callLater(delay, self._retry, target)

    def _retry(self, target: _Target) -> None:
        if target.queue:
            self._attempt(target, target.queue[0])
        else:
            target.busy = False

    def stats(self) -> dict[str, int]:
        f = self.figures
        return {"sent": f.sent, "dropped": f.dropped, "failures": f.failures,
                "requests": f.requests, "queued": sum(t.queued for t in self._targets)}
