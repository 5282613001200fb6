"""The connections to a Redis's primaries: for each, one command connection and one
sharded pub/sub (subscriber) connection.

The rule: the pool opens a primary's two connections when it is first named (by the
slot map, or by an ``ASK``), lets each reconnect by itself (client.py), closes them
when the primary is dropped, and tells its listeners when one comes up or goes. It
never decides where a command goes (``slotmap.py``, ``cluster.py``) nor what a
subscriber connection is subscribed to (``subscriptions.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred

from pushup.backplane.redis.client import RedisConnection
from pushup.backplane.redis.exceptions import RedisNotSent
from pushup.backplane.redis.pubsub import PubSubConnection
from pushup.config import RedisURL

ASK_TIMEOUT = 2.0  # seconds for CLUSTER SLOTS/INFO, and for a new primary's connection

Pushed = Callable[["Primary", bytes, bytes, Any], None]  # (primary, kind, channel, data)


class Primary:
    """One primary: a command connection, a subscriber connection, and the channels
    SSUBSCRIBE was sent for on the current subscriber connection."""

    def __init__(self, address: str, url: RedisURL, reactor: Any, on_push: Pushed) -> None:
        self.address = address
        self.commands = RedisConnection(url, reactor, connect_timeout=ASK_TIMEOUT)
        self.subscriber = PubSubConnection(
            url, reactor, lambda kind, channel, data: on_push(self, kind, channel, data),
            connect_timeout=ASK_TIMEOUT, quiet=True)
        self.subscribed: set[bytes] = set()
        self.up_waiters: list[Deferred[None]] = []

    def stop(self) -> Deferred[Any]:
        for waiter in self.up_waiters:
            waiter.errback(RedisNotSent(f"{self.address} is no longer a primary"))
        self.up_waiters = []
        return defer.gatherResults([self.commands.stop(), self.subscriber.stop()])


class Pool:
    """The primaries this node is connected to, by address (host:port, a Unix socket's
    path). Listeners, called in the order added: ``on_commands_up()`` and
    ``on_commands_lost()`` for any primary's command connection,
    ``on_subscriber_up(primary)`` and ``on_subscriber_lost(primary)`` for its
    subscriber connection, ``on_push(primary, kind, channel, data)`` for what Redis
    sends that connection unasked."""

    def __init__(self, template: RedisURL, reactor: Any) -> None:
        self._template = template  # whose credentials reach a primary named by address
        self._reactor = reactor
        self.running = False  # a new primary's connections are started
        self.primaries: dict[str, Primary] = {}
        self.on_commands_up: list[Callable[[], object]] = []
        self.on_commands_lost: list[Callable[[], object]] = []
        self.on_subscriber_up: list[Callable[[Primary], object]] = []
        self.on_subscriber_lost: list[Callable[[Primary], object]] = []
        self.on_push: list[Pushed] = []

    def get(self, address: str | None) -> Primary | None:
        return self.primaries.get(address) if address is not None else None

    def primary(self, address: str, url: RedisURL | None = None) -> Primary:
        """The primary at ``address`` (host:port; ``url`` if not the seeds' credentials
        at that address, db 0), connecting to it if new."""
        primary = self.primaries.get(address)
        if primary is None:
            if url is None:
                host, _, port = address.rpartition(":")
                url = replace(self._template, host=host.strip("[]"), port=int(port),
                              path=None, db=0)
            primary = self.primaries[address] = Primary(address, url, self._reactor,
                                                        self._pushed)
            primary.commands.on_connect.append(lambda: self._commands_up(primary))
            primary.commands.on_lost.append(self._commands_lost)
            primary.subscriber.on_connect.append(lambda: _tell(self.on_subscriber_up, primary))
            primary.subscriber.on_lost.append(lambda: _tell(self.on_subscriber_lost, primary))
            if self.running:
                primary.commands.start()
                primary.subscriber.start()
        return primary

    def drop(self, address: str) -> None:
        """Close the connections to a primary that owns nothing now."""
        self.primaries.pop(address).stop()

    def stop(self) -> Deferred[None]:
        """Close every connection; fires once all are closed."""
        self.running = False
        primaries, self.primaries = list(self.primaries.values()), {}
        closed = defer.gatherResults([primary.stop() for primary in primaries])
        return closed.addCallback(lambda _: None)

    def when_up(self, primary: Primary) -> Deferred[None]:
        """Fires once ``primary``'s command connection is up; RedisNotSent if it is not
        within ASK_TIMEOUT."""
        if primary.commands.connected:
            return defer.succeed(None)
        up: Deferred[None] = Deferred()
        primary.up_waiters.append(up)

        def give_up() -> None:
            if up in primary.up_waiters:
                primary.up_waiters.remove(up)
                up.errback(RedisNotSent(f"redis {primary.address} unreachable"))

        call = self._reactor.callLater(ASK_TIMEOUT, give_up)
        return up.addBoth(lambda result: (call.active() and call.cancel(), result)[1])

    def _commands_up(self, primary: Primary) -> None:
        for listener in list(self.on_commands_up):
            listener()
        waiters, primary.up_waiters = primary.up_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _commands_lost(self) -> None:
        for listener in list(self.on_commands_lost):
            listener()

    def _pushed(self, primary: Primary, kind: bytes, channel: bytes, data: Any) -> None:
        for listener in self.on_push:
            listener(primary, kind, channel, data)


def _tell(listeners: list[Callable[[Primary], object]], primary: Primary) -> None:
    for listener in list(listeners):
        listener(primary)
