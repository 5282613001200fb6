"""Peers out: one link per peer, ordered, batched, authenticated, retried.

A link sends this node's own messages to one peer, in sequence order, one
batched POST in flight at a time (order and back-pressure in one rule). Its
queue is the store itself: the link only remembers how far the peer has
confirmed (``after``), so a peer that is down costs no memory beyond the
cache, and when it returns it is sent what is still retained. Channel
operations wait in a bounded queue beside it. Failures are link state, shown
in ``/stats``; they never reach a client.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from pushup.backplane import ChannelOp
from pushup.backplane.mesh.wire import backlog, encode_batch, sign
from pushup.core.store import Store

log = Logger()
HEARTBEAT = 2.0  # an idle link checks on its peer this often (seconds)
BACKOFF_MAX = 1.0  # a dead peer costs one connection attempt a second
DOWN_AFTER = 3  # failures in a row before a peer is shown as down
LINGER = 0.003  # an idle link waits this long for more messages before it sends

# connecting: not confirmed yet (starting, or failed fewer than DOWN_AFTER times);
# up: the last exchange succeeded; down: DOWN_AFTER failures in a row;
# refused: the peer answers 4xx (another cluster secret, or not a PushUp node).
LinkState = Literal["connecting", "up", "down", "refused"]


class PeerError(Exception):
    """A peer answered, but not with what the protocol expects."""


class PeerRefused(PeerError):
    """A peer refuses us (4xx): another cluster secret, or not a PushUp peer URL."""


class PeerLink:
    """This node's link to one peer: sends it our own messages and channel
    operations, in order, and learns how far it holds them.

    - Order: one POST in flight at a time, messages in sequence order, each
      operation after the messages that came before it; a 409 (a hole at the
      peer) resends from the sequence it expects.
    - Memory: the queue of messages is the store (what it still holds past
      ``after``); operations wait in a deque of ``max_ops``, the oldest
      dropped (and counted) when it is full.
    - Failure is state, never an exception to the caller: ``state`` moves
      between connecting, up, down (``DOWN_AFTER`` failures in a row) and
      refused (a 4xx: another secret, or not a PushUp node), is shown in
      ``/stats``, and the link retries with backoff until :meth:`stop`.
    - ``on_change`` is told when ``after`` advances or ``state`` changes.
    - Time: every timer and request timeout is on the injected ``clock``.
    """

    def __init__(self, url: str, store: Store, secret: str, http: Any, clock: IReactorTime,
                 max_ops: int = 10_000, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.store = store
        self.secret = secret
        self.http = http
        self.clock = clock
        self.timeout = timeout
        self.state: LinkState = "connecting"
        self.after = 0  # the peer holds our messages up to this sequence number
        self.sent = 0  # our messages the peer accepted
        self.ops: deque[ChannelOp] = deque(maxlen=max_ops)
        self.dropped_ops = 0
        self._busy = False
        self._failures = 0
        self._retry_now = False
        self._timer: IDelayedCall | None = None
        self.stopped = False
        # Told when ``after`` advances or ``state`` changes (the mesh answers
        # publishes waiting for a peer to hold them).
        self.on_change: Callable[[PeerLink], None] | None = None

    # -- what the node calls ----------------------------------------------

    def start(self) -> None:
        self._wake(0)

    def poke(self) -> None:
        """New messages or ops: send them soon, batched with what follows within
        ``LINGER`` (a POST costs far more than a message in it)."""
        if not self._busy and self._failures == 0:
            self._wake(LINGER)

    def add_op(self, op: ChannelOp) -> None:
        if len(self.ops) == self.ops.maxlen:
            self.dropped_ops += 1
            log.warn("peer {url}: channel-op queue full, oldest dropped", url=self.url)
        self.ops.append(op)
        self.poke()

    def stop(self) -> None:
        self.stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()

    @property
    def queued(self) -> int:
        return max(0, self.store.own_seq - self.after) + len(self.ops)

    def stats(self) -> dict[str, Any]:
        return {"url": self.url, "state": self.state, "queued": self.queued, "sent": self.sent}

    # -- the loop ----------------------------------------------------------

    def _wake(self, delay: float) -> None:
        """Run the loop no later than ``delay`` seconds from now."""
        if self.stopped:
            return
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= self.clock.seconds() + delay:
                return  # already due no later than asked
            self._timer.cancel()  # e.g. an idle link's heartbeat, seconds away
        self._timer = self.clock.callLater(delay, self._run)

    @property
    def settled(self) -> bool:
        """The peer has confirmed everything we have for it."""
        return self.queued == 0 and not self._busy

    @property
    def failing(self) -> bool:
        return self._failures > 0

    def kick(self) -> None:
        """Try now, whatever the backoff says (draining, or a peer spoke up)."""
        self._retry_now = True  # if an attempt is under way and fails, retry at once
        if not self._busy:
            if self._timer is not None and self._timer.active():
                self._timer.cancel()
            self._timer = None
            self._wake(0)

    @defer.inlineCallbacks
    def _run(self) -> Any:
        self._timer = None
        if self._busy or self.stopped:
            return
        self._busy = True
        try:
            while not self.stopped:
                store = self.store
                batch = backlog(store, store.origin_name, self.after,
                                (store.own_seq, store.last_ts))
                messages = batch.messages
                # An op is stamped with our seq when it happened: it travels
                # with (or after) the messages before it.
                upto = messages[-1].seq if messages else self.after
                ops: list[ChannelOp] = []
                while self.ops and self.ops[0].at_seq <= upto and len(ops) < 100:
                    ops.append(self.ops.popleft())
                body = encode_batch(replace(batch, ops=tuple(ops)))
                try:
                    status, raw = yield self.request("POST", "/peer/messages", body)
                    reply = json.loads(raw) if status in (200, 409) else raw[:200]
                except Exception:
                    self.ops.extendleft(reversed(ops))
                    raise
                if status == 409:
                    self.ops.extendleft(reversed(ops))
                    expected = int(reply["expected"]) - 1
                    if expected == self.after:  # what we just sent: no progress
                        raise PeerError(f"asks again for {expected + 1}")
                    self._confirmed(expected)
                    continue
                if status != 200:
                    self.ops.extendleft(reversed(ops))
                    kind = PeerRefused if 400 <= status < 500 else PeerError
                    raise kind(f"answered {status}: {reply!r}")
                horizon = int(reply["horizon"])
                self.sent += sum(1 for m in messages if self.after < m.seq <= horizon)
                self._up()
                self._confirmed(horizon)
                if not self.ops and self.after >= self.store.own_seq:
                    break  # the peer has everything: no empty POST to say so
        except Exception as e:
            self._failed(e)
        else:
            self._wake(HEARTBEAT)
        finally:
            self._busy = False

    def _confirmed(self, after: int) -> None:
        """The peer holds our messages up to ``after``."""
        moved = after > self.after
        self.after = after
        if moved and self.on_change is not None:
            self.on_change(self)

    def set_state(self, state: LinkState, why: object = None) -> None:
        """Show the peer as ``state``; the log says so only when it changes."""
        if state == self.state:
            return
        self.state = state
        if self.on_change is not None:
            self.on_change(self)
        if state == "up":
            log.info("peer {url} is up", url=self.url)
        elif state == "refused":
            log.warn("peer {url} refused: {why} (another cluster secret, or not a PushUp "
                     "node?); not waiting for it, retrying quietly", url=self.url, why=why)
        else:
            log.warn("peer {url} is {state}: {why}", url=self.url, state=state, why=why)

    def _up(self) -> None:
        self.set_state("up")
        self._failures = 0

    def _failed(self, e: Exception) -> None:
        self._failures += 1
        if isinstance(e, PeerRefused):
            self.set_state("refused", e)
        else:
            self.set_state("down" if self._failures >= DOWN_AFTER else "connecting", e)
        # The first failure after success is often a stale pooled connection:
        # retry at once; then back off (unless kicked meanwhile).
        quick = self._failures == 1 or self._retry_now
        self._retry_now = False
        self._wake(0 if quick else min(BACKOFF_MAX, 0.1 * 2 ** self._failures))

    @defer.inlineCallbacks
    def request(self, method: str, path: str, body: bytes = b"") -> Any:
        """A signed request to the peer; fires with (status, body bytes)."""
        when = int(time.time())
        headers = {"X-PushUp-Time": [str(when)],
                   "X-PushUp-Signature": [sign(self.secret, method, path, when, body)],
                   "Content-Type": ["application/json"]}
        response = yield self.http.request(method, self.url + path, data=body or None,
                                           headers=headers, timeout=self.timeout,
                                           reactor=self.clock)
        raw = yield response.content()
        return response.code, raw


class _Endpoints:
    """Connect to IP literals directly: Agent's default (HostnameEndpoint)
    resolves in a thread and staggers attempts, so even a refused connection
    to 127.0.0.1 takes a few hundred milliseconds to be reported."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor

    def endpointForURI(self, uri: Any) -> Any:  # noqa: N802 (Twisted's interface)
        host = uri.host.decode() if isinstance(uri.host, bytes) else uri.host
        try:
            version = ipaddress.ip_address(host).version
        except ValueError:
            return HostnameEndpoint(self.reactor, host, uri.port, timeout=5)
        kind = TCP4ClientEndpoint if version == 4 else TCP6ClientEndpoint
        return kind(self.reactor, host, uri.port, timeout=5)


def http_client(reactor: Any) -> Any:
    """A treq client with its own pool; idle connections close before the
    peer's 60 s idle timeout would (Twisted issue #7843)."""
    from treq.client import HTTPClient
    from twisted.web.client import Agent

    from pushup._twisted import quiet_pool

    pool = quiet_pool(reactor)
    pool.maxPersistentPerHost = 2
    pool.cachedConnectionTimeout = 30
    agent = Agent.usingEndpointFactory(  # type: ignore[no-untyped-call]
        reactor, _Endpoints(reactor), pool=pool)
    return HTTPClient(agent)

