"""Sharded pub/sub: each subscribed channel ``SSUBSCRIBE``d on the primary owning
its slot, whatever happens to the connections and the slot map.

The rule: a channel is subscribed on its owner's subscriber connection, and only
there, from ``subscribe`` until ``unsubscribe``: again after every reconnection,
after every map read that moves its slot, after a ``MOVED`` reply to the
``SSUBSCRIBE``, and after an ``sunsubscribe`` Redis sent unasked (its slot moved).
Each time Redis confirms a subscription the subscriber is told (``on_synced``: what
was published meanwhile was missed), and each time one goes (``on_lost``: a
connection lost, its slot moved); messages reach it in order. A subscriber
connection that stays up but no longer forwards (a half-open TCP connection,
a middlebox that stalled) is found by a PING every ``PROBE_EVERY`` seconds
that must be answered within ``PROBE_TIMEOUT`` (its reply comes in order
behind every message Redis sent before it), else the connection is dropped
and subscribed again, as after any loss. It never routes a
command nor reads the map itself (``slotmap.py`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet import task
from twisted.python.failure import Failure

from pushup.backplane.redis.exceptions import Moved, RedisError, RedisTimeout
from pushup.backplane.redis.pool import Pool, Primary
from pushup.backplane.redis.slotmap import SlotMap


def _nothing() -> None:
    pass


PROBE_EVERY = 5.0  # seconds between two liveness PINGs on a subscriber connection
PROBE_TIMEOUT = 3.0  # seconds (the node's own) a PING has to be answered


@dataclass(frozen=True, slots=True)
class _Subscription:
    on_message: Callable[[bytes], None]
    on_synced: Callable[[], None]
    on_lost: Callable[[], None] = _nothing


class Subscriptions:
    """The channels this node is subscribed to (see the module's rule)."""

    def __init__(self, pool: Pool, slot_map: SlotMap) -> None:
        self._pool = pool
        self._map = slot_map
        self._subscriptions: dict[bytes, _Subscription] = {}
        pool.on_subscriber_up.append(self._subscriber_up)
        pool.on_subscriber_lost.append(self._subscriber_lost)
        pool.on_push.append(self._pushed)
        slot_map.on_applied.append(self._place_all)
        self._prober: Any = None
        self.probes_failed = 0  # subscriber connections dropped for an unanswered PING

    def start_probing(self, clock: Any) -> None:
        """PING every subscriber connection that holds subscriptions, every
        ``PROBE_EVERY`` seconds of ``clock``, until ``stop_probing``."""
        if self._prober is None:
            self._prober = task.LoopingCall(self.probe)
            self._prober.clock = clock
            self._prober.start(PROBE_EVERY, now=False)

    def stop_probing(self) -> None:
        if self._prober is not None and self._prober.running:
            self._prober.stop()
        self._prober = None

    def probe(self) -> None:
        """One round of liveness PINGs: a connection that does not answer in
        ``PROBE_TIMEOUT`` is dropped (``RedisConnection``'s timeout) and its
        channels subscribed again once it is back."""
        for primary in list(self._pool.primaries.values()):
            pubsub = primary.subscriber.pubsub
            if pubsub is not None and primary.subscribed:
                pinged = pubsub.execute("PING", timeout=PROBE_TIMEOUT)
                pinged.addErrback(self._unanswered, primary)

    def _unanswered(self, failure: Failure, primary: Primary) -> None:
        # Counted, not logged: the connection it dropped comes back as any
        # other (a primary stopped or unreachable is said by its command
        # connection, once).
        if isinstance(failure.value, RedisTimeout):
            self.probes_failed += 1

    def subscribe(self, channel: str | bytes, on_message: Callable[[bytes], None],
                  on_synced: Callable[[], None], on_lost: Callable[[], None] = _nothing,
                  ) -> None:
        """SSUBSCRIBE ``channel`` on its owner, again after every reconnection and move,
        until ``unsubscribe``. ``on_synced()`` each time Redis confirms it (what was
        published meanwhile was missed), ``on_lost()`` each time a confirmed
        subscription goes; ``on_message(payload)`` per message, in order."""
        name = channel.encode() if isinstance(channel, str) else channel
        self._subscriptions[name] = _Subscription(on_message, on_synced, on_lost)
        self._place(name)

    def unsubscribe(self, channel: str | bytes) -> None:
        name = channel.encode() if isinstance(channel, str) else channel
        self._subscriptions.pop(name, None)
        for primary in self._pool.primaries.values():
            self._leave(primary, name)

    def _place_all(self) -> None:
        for channel in list(self._subscriptions):
            self._place(channel)

    def _place(self, channel: bytes) -> None:
        """SSUBSCRIBE ``channel`` on the owner of its slot, and leave any other primary."""
        owner = self._map.owner_of(channel)
        for other in list(self._pool.primaries.values()):
            if other.address != owner:
                self._leave(other, channel)
        primary = self._pool.get(owner)
        if primary is None or channel in primary.subscribed:
            return
        pubsub = primary.subscriber.pubsub
        if pubsub is None:
            return  # _subscriber_up subscribes it
        primary.subscribed.add(channel)
        pubsub.ssubscribe(channel).addErrback(self._subscribe_failed, primary, channel)

    def _leave(self, primary: Primary, channel: bytes) -> None:
        if channel in primary.subscribed:
            primary.subscribed.discard(channel)
            self._lost(channel)
            pubsub = primary.subscriber.pubsub
            if pubsub is not None:
                pubsub.sunsubscribe(channel).addErrback(lambda _: None)  # moot if it fails

    def _subscribe_failed(self, failure: Failure, primary: Primary, channel: bytes) -> None:
        primary.subscribed.discard(channel)
        error = failure.value
        if not isinstance(error, RedisError) or not self._map.running:
            return  # the connection went: _subscriber_up subscribes again
        if isinstance(error, Moved):
            self._map.moved(error.slot, error.address)
            self._place(channel)
        else:  # e.g. CLUSTERDOWN: try again with the next periodic re-read
            self._map.complain(f"SSUBSCRIBE failed on {primary.address}: {error.message}")
            self._map.refresh_later()

    def _subscriber_up(self, primary: Primary) -> None:
        self._map.stop_rereading()
        primary.subscribed.clear()  # a new connection subscribes to nothing
        for channel in list(self._subscriptions):
            if self._map.owner_of(channel) == primary.address:
                self._place(channel)

    def _subscriber_lost(self, primary: Primary) -> None:
        gone, primary.subscribed = primary.subscribed, set()
        for channel in gone:
            self._lost(channel)
        self._map.lost()

    def _lost(self, channel: bytes) -> None:
        subscription = self._subscriptions.get(channel)
        if subscription is not None:
            subscription.on_lost()

    def _pushed(self, primary: Primary, kind: bytes, channel: bytes, data: Any) -> None:
        subscription = self._subscriptions.get(channel)
        if subscription is None:
            return
        if kind == b"smessage":
            subscription.on_message(data)
        elif kind == b"ssubscribe":
            if channel in primary.subscribed:
                subscription.on_synced()
        elif channel in primary.subscribed:  # a sunsubscribe we did not ask for:
            primary.subscribed.discard(channel)  # its slot moved to another primary
            subscription.on_lost()
            self._map.refresh().addCallback(lambda _: self._place(channel))
