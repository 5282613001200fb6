"""Sharded pub/sub: each subscribed channel ``SSUBSCRIBE``d on the primary owning
its slot, whatever happens to the connections and the slot map.

The rule: a channel is subscribed on its owner's subscriber connection, and only
there, from ``subscribe`` until ``unsubscribe``: again after every reconnection,
after every map read that moves its slot, after a ``MOVED`` reply to the
``SSUBSCRIBE``, and after an ``sunsubscribe`` Redis sent unasked (its slot moved).
Each time Redis confirms a subscription the subscriber is told (``on_synced``: what
was published meanwhile was missed); messages reach it in order. It never routes a
command nor reads the map itself (``slotmap.py`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.python.failure import Failure

from pushup.backplane.redis.exceptions import Moved, RedisError
from pushup.backplane.redis.pool import Pool, Primary
from pushup.backplane.redis.slotmap import SlotMap


@dataclass(frozen=True, slots=True)
class _Subscription:
    on_message: Callable[[bytes], None]
    on_synced: Callable[[], None]


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

    def subscribe(self, channel: str | bytes, on_message: Callable[[bytes], None],
                  on_synced: Callable[[], None]) -> None:
        """SSUBSCRIBE ``channel`` on its owner, again after every reconnection and move,
        until ``unsubscribe``. ``on_synced()`` each time Redis confirms it (what was
        published meanwhile was missed); ``on_message(payload)`` per message, in order."""
        name = channel.encode() if isinstance(channel, str) else channel
        self._subscriptions[name] = _Subscription(on_message, on_synced)
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
        primary.subscribed.clear()
        self._map.lost()

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
            self._map.refresh().addCallback(lambda _: self._place(channel))
