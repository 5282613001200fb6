"""The Redis a node talks to, one redis-server or every primary of a Redis Cluster,
behind one interface: ``Shards``.

``Shards`` finds out which at start (``INFO cluster``), keeps one command connection
and one sharded pub/sub connection per primary, sends each command to the primary
owning its key's slot (``key_slot``), follows ``MOVED`` and ``ASK``, and keeps every
subscribed channel SSUBSCRIBEd on its owner. It re-reads the slot map (``CLUSTER
SLOTS``) from any reachable node when a reply says the map is stale and, while a
primary is unreachable, every second (a failover moves its slots to a replica at
another address). It never interprets what a command does: errors keep client.py's
meaning (``RedisNotSent``, ``RedisGone``, ``RedisTimeout``, ``RedisError``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from twisted.internet import defer, task
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane import trouble
from pushup.backplane.redis.client import (
    MAX_DELAY,
    Arg,
    RedisConnection,
    RedisError,
    RedisNotSent,
)
from pushup.backplane.redis.slots import SLOTS, Topology, address_of, key_slot, read_topology
from pushup.config import RedisURL

__all__ = ["Shards", "ShardsRefused", "key_slot"]

log = Logger()

MAX_REDIRECTS = 5  # MOVED/ASK followed per command before the caller sees it
ASK_TIMEOUT = 2.0  # seconds for CLUSTER SLOTS/INFO, and for a new primary's connection
TRYAGAIN_DELAY = 0.05  # seconds before retrying a multi-key command caught mid-migration
# ... for up to 0.5 s: a slot in migration answers every multi-key command on
# it (a publish script names several keys of its partition) TRYAGAIN until
# its keys are all on one side; moving a slot's few keys takes milliseconds
# and passes unnoticed, a longer migration is the caller's prompt 503
# (retried by the publisher)
TRYAGAIN_TRIES = 10
PROBE_TIMEOUT = 2.0


class ShardsRefused(Exception):
    """This Redis cannot be used as configured (a database other than 0 on a cluster)."""


@dataclass(frozen=True, slots=True)
class _Subscription:
    on_message: Callable[[bytes], None]
    on_synced: Callable[[], None]


class _Primary:
    """One primary: a command connection, a subscriber connection, and the channels
    SSUBSCRIBE was sent for on the current subscriber connection."""

    def __init__(self, address: str, url: RedisURL, shards: Shards) -> None:
        self.address = address
        self.commands = RedisConnection(url, shards._reactor, connect_timeout=ASK_TIMEOUT)
        self.subscriber = RedisConnection(
            url, shards._reactor, connect_timeout=ASK_TIMEOUT, quiet=True,
            on_push=lambda kind, channel, data: shards._pushed(self, kind, channel, data))
        self.subscribed: set[bytes] = set()
        self.up_waiters: list[Deferred[None]] = []

    def stop(self) -> Deferred[Any]:
        for waiter in self.up_waiters:
            waiter.errback(RedisNotSent(f"{self.address} is no longer a primary"))
        self.up_waiters = []
        return defer.gatherResults([self.commands.stop(), self.subscriber.stop()])


class Shards:
    """The Redis this node talks to: one redis-server, or every primary of a Redis
    Cluster. ``start``, then ``execute``/``evalsha`` (routed by key) and ``subscribe``
    (sharded pub/sub); ``stop``."""

    def __init__(self, seeds: Sequence[RedisURL], reactor: Any, *, name: str = "") -> None:
        if not seeds:
            raise ValueError("Shards needs at least one seed")
        self._seeds = list(seeds)
        self._reactor = reactor
        self._name = name or str(seeds[0])
        self.clustered = False
        self._owners: list[str | None] = [None] * SLOTS  # primary address by slot
        self._primaries: dict[str, _Primary] = {}  # also ASK targets owning no slot yet
        self._nodes: dict[str, RedisURL] = {}  # every node the last map named, replicas too
        self._subscriptions: dict[bytes, _Subscription] = {}
        self._running = False
        self._known = False  # the topology was read at least once
        self._refreshing = False
        self._refresh_again = False
        self._refreshed: list[Deferred[None]] = []  # fire when the read under way is done
        self._first_read: list[Deferred[None]] = []  # topology_read()'s
        self._retry: Any = None  # the next periodic re-read's IDelayedCall
        self._reading: Deferred[Any] | None = None  # a read_topology under way
        self._last_complaint = ""

    # -- life -------------------------------------------------------------------------

    def start(self) -> None:
        """Read the topology from a seed and connect to every primary; keep at it."""
        if not self._running:
            self._running = True
            self._refresh()

    def topology_read(self) -> Deferred[None]:
        """Fires once the topology has been read (now, if it was); fails with
        ``ShardsRefused`` if this Redis cannot be used as configured."""
        if self._known:
            return defer.succeed(None)
        read: Deferred[None] = Deferred()
        self._first_read.append(read)
        return read

    def stop(self) -> Deferred[None]:
        """Close every connection; fires once all are closed."""
        self._running = False
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._reading is not None:
            self._reading.cancel()
        primaries, self._primaries = list(self._primaries.values()), {}
        self._owners = [None] * SLOTS
        closed = defer.gatherResults([primary.stop() for primary in primaries])
        return closed.addCallback(lambda _: None)

    @property
    def connected(self) -> bool:
        """Every primary's command and subscriber connections are up."""
        owners = self._owning()
        return self._known and bool(owners) and all(
            self._primaries[address].commands.connected
            and self._primaries[address].subscriber.connected for address in owners)

    def primaries(self) -> list[str]:
        """The primaries owning slots, as host:port (a Unix socket's path)."""
        return sorted(self._owning())

    def _owning(self) -> set[str]:
        return {owner for owner in set(self._owners) if owner is not None
                and owner in self._primaries}

    # -- commands ---------------------------------------------------------------------

    def execute(self, key: str | bytes | None, *args: Arg,
                timeout: float | None = None) -> Deferred[Any]:
        """Run a command on the primary owning ``key``'s slot (None: any primary)."""
        def send(connection: RedisConnection, asking: bool) -> Deferred[Any]:
            return connection.execute(*args, timeout=timeout)
        return self._route(key, send, MAX_REDIRECTS)

    def evalsha(self, sha: str, script: str | bytes, keys: Sequence[Arg], args: Sequence[Arg],
                timeout: float | None = None) -> Deferred[Any]:
        """``RedisConnection.evalsha`` (EVAL on NOSCRIPT) on the owner of ``keys[0]``."""
        def send(connection: RedisConnection, asking: bool) -> Deferred[Any]:
            if asking:  # an importing node may lack the script; EVAL also runs once
                return connection.execute("EVAL", script, len(keys), *keys, *args,
                                          timeout=timeout)
            return connection.evalsha(sha, script, keys, args, timeout=timeout)
        key = keys[0] if keys else None
        return self._route(key if not isinstance(key, (int, float)) else str(key), send,
                           MAX_REDIRECTS)

    def probe(self, timeout: float = PROBE_TIMEOUT) -> Deferred[None]:
        """PING every primary; fails unless all answer within ``timeout`` seconds."""
        owners = self._owning()
        if not self._known or None in self._owners or not owners:
            return defer.fail(RedisNotSent(f"redis {self._name}: topology not known"))
        pings = [self._primaries[address].commands.execute("PING", timeout=timeout)
                 for address in sorted(owners)]

        def first_error(failure: Failure) -> Failure:
            if isinstance(failure.value, defer.FirstError):
                return failure.value.subFailure
            return failure

        answered = defer.gatherResults(pings, consumeErrors=True)
        return answered.addCallbacks(lambda _: None, first_error)

    def _route(self, key: str | bytes | None,
               send: Callable[[RedisConnection, bool], Deferred[Any]], left: int,
               asking: _Primary | None = None, tries: int = 0) -> Deferred[Any]:
        if asking is not None:
            primary: _Primary | None = asking
            asking.commands.execute("ASKING").addErrback(lambda _: None)  # shows on send
        elif key is None:
            owning = self._owning()
            primary = next((p for address, p in sorted(self._primaries.items())
                            if address in owning and p.commands.connected), None)
        else:
            owner = self._owners[key_slot(key)]
            primary = self._primaries.get(owner) if owner is not None else None
        if primary is None:
            return defer.fail(RedisNotSent(f"redis {self._name}: no primary known for this key"))
        sent = send(primary.commands, asking is not None)
        return sent.addErrback(self._redirected, key, send, left, tries)

    def _redirected(self, failure: Failure, key: str | bytes | None,
                    send: Callable[[RedisConnection, bool], Deferred[Any]],
                    left: int, tries: int) -> Any:
        """A MOVED, ASK or TRYAGAIN reply: the command did not run; send it again
        where Redis says (at most ``left`` more redirects, ``TRYAGAIN_TRIES``
        more tries)."""
        error = failure.value
        if not isinstance(error, RedisError):
            return failure
        word, _, rest = error.message.partition(" ")
        if word == "TRYAGAIN":  # a multi-key command whose keys are split mid-migration
            if tries >= TRYAGAIN_TRIES:
                return failure
            return task.deferLater(self._reactor, TRYAGAIN_DELAY,
                                    lambda: self._route(key, send, left, tries=tries + 1))
        if left <= 0:
            return failure
        if word not in ("MOVED", "ASK"):
            return failure
        slot, _, address = rest.partition(" ")
        if word == "MOVED":
            target = self._moved(int(slot), address)
            return self._when_up(target).addCallback(
                lambda _: self._route(key, send, left - 1))
        target = self._primary(address)
        return self._when_up(target).addCallback(
            lambda _: self._route(key, send, left - 1, asking=target))

    def _moved(self, slot: int, address: str) -> _Primary:
        """``slot`` is on ``address`` now: note it, and re-read the rest of the map."""
        self._owners[slot] = address
        primary = self._primary(address)
        self._refresh()
        return primary

    def _primary(self, address: str, url: RedisURL | None = None) -> _Primary:
        """The primary at ``address`` (host:port; ``url`` if not the seeds' credentials
        at that address, db 0), connecting to it if new."""
        primary = self._primaries.get(address)
        if primary is None:
            if url is None:
                host, _, port = address.rpartition(":")
                url = replace(self._seeds[0], host=host.strip("[]"), port=int(port),
                              path=None, db=0)
            primary = self._primaries[address] = _Primary(address, url, self)
            primary.commands.on_connect.append(lambda: self._commands_up(primary))
            primary.commands.on_lost.append(self._lost)
            primary.subscriber.on_connect.append(lambda: self._subscriber_up(primary))
            primary.subscriber.on_lost.append(lambda: self._subscriber_lost(primary))
            if self._running:
                primary.commands.start()
                primary.subscriber.start()
        return primary

    def _when_up(self, primary: _Primary) -> Deferred[None]:
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

    def _commands_up(self, primary: _Primary) -> None:
        self._stop_rereading()
        waiters, primary.up_waiters = primary.up_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _lost(self) -> None:
        if self.clustered:
            self._refresh()  # a failover may be under way: its new primary is elsewhere

    # -- sharded pub/sub ------------------------------------------------------------------

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
        for primary in self._primaries.values():
            self._leave(primary, name)

    def _place(self, channel: bytes) -> None:
        """SSUBSCRIBE ``channel`` on the owner of its slot, and leave any other primary."""
        owner = self._owners[key_slot(channel)]
        for other in list(self._primaries.values()):
            if other.address != owner:
                self._leave(other, channel)
        primary = self._primaries.get(owner) if owner is not None else None
        if primary is None or channel in primary.subscribed:
            return
        pubsub = primary.subscriber.pubsub
        if pubsub is None:
            return  # _subscriber_up subscribes it
        primary.subscribed.add(channel)
        pubsub.ssubscribe(channel).addErrback(self._subscribe_failed, primary, channel)

    def _leave(self, primary: _Primary, channel: bytes) -> None:
        if channel in primary.subscribed:
            primary.subscribed.discard(channel)
            pubsub = primary.subscriber.pubsub
            if pubsub is not None:
                pubsub.sunsubscribe(channel).addErrback(lambda _: None)  # moot if it fails

    def _subscribe_failed(self, failure: Failure, primary: _Primary, channel: bytes) -> None:
        primary.subscribed.discard(channel)
        error = failure.value
        if not isinstance(error, RedisError) or not self._running:
            return  # the connection went: _subscriber_up subscribes again
        word, _, rest = error.message.partition(" ")
        if word == "MOVED":
            slot, _, address = rest.partition(" ")
            self._moved(int(slot), address)
            self._place(channel)
        else:  # e.g. CLUSTERDOWN: try again with the next periodic re-read
            self._complain(f"SSUBSCRIBE failed on {primary.address}: {error.message}")
            self._refresh_later()

    def _subscriber_up(self, primary: _Primary) -> None:
        self._stop_rereading()
        primary.subscribed.clear()  # a new connection subscribes to nothing
        for channel in list(self._subscriptions):
            if self._owners[key_slot(channel)] == primary.address:
                self._place(channel)

    def _subscriber_lost(self, primary: _Primary) -> None:
        primary.subscribed.clear()
        self._lost()

    def _pushed(self, primary: _Primary, kind: bytes, channel: bytes, data: Any) -> None:
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
            self._refresh().addCallback(lambda _: self._place(channel))

    # -- the topology -----------------------------------------------------------------

    def _refresh(self) -> Deferred[None]:
        """Re-read the topology; fires when done. One read at a time: asked during one,
        one more read follows it (the first may predate what prompted the ask)."""
        done: Deferred[None] = Deferred()
        self._refreshed.append(done)
        if self._refreshing:
            self._refresh_again = True
            return done
        self._refreshing = True
        self._read().addBoth(self._read_done)
        return done

    def _read_done(self, result: Any) -> None:
        self._refreshing = False
        if not self._running:
            waiters, self._refreshed = self._refreshed, []
            for waiter in waiters:
                waiter.callback(None)
            return
        if isinstance(result, Failure):
            if isinstance(result.value, ShardsRefused):
                self._refuse(result)
                return
            self._complain(f"cannot read the topology ({trouble(result)})")
        if self._refresh_again:
            self._refresh_again = False
            self._refreshing = True
            self._read().addBoth(self._read_done)
            return
        if self._known:  # else they wait for the first topology
            waiters, self._refreshed = self._refreshed, []
            waiters += self._first_read
            self._first_read = []
            for waiter in waiters:
                waiter.callback(None)
        if not self.connected:
            self._refresh_later()

    def _refuse(self, failure: Failure) -> None:
        log.error("redis {name}: {why}", name=self._name, why=failure.getErrorMessage())
        self._running = False
        self._refreshed = []  # nothing more will be read
        waiters, self._first_read = self._first_read, []
        for waiter in waiters:
            waiter.errback(failure)

    def _refresh_later(self) -> None:
        if self._running and (self._retry is None or not self._retry.active()):
            self._retry = self._reactor.callLater(MAX_DELAY, self._refresh_unless_connected)

    def _refresh_unless_connected(self) -> None:
        if not self.connected:
            self._refresh()

    def _stop_rereading(self) -> None:
        """Every connection is up: no periodic re-read (a loss starts it again)."""
        if self.connected and self._retry is not None and self._retry.active():
            self._retry.cancel()
            self._retry = None

    def _complain(self, why: str) -> None:
        if why != self._last_complaint:
            self._last_complaint = why
            log.warn("redis {name}: {why}", name=self._name, why=why)

    @defer.inlineCallbacks
    def _read(self) -> Generator[Deferred[Any], Any, None]:
        """Ask the primaries we are connected to, then every node and seed in turn, for
        the slot map; apply the first answer."""
        if self._known and not self.clustered:
            return  # one redis-server: its connections reconnect by themselves
        for primary in list(self._primaries.values()):
            if primary.commands.connected and self._running:
                try:
                    reply = yield primary.commands.execute("CLUSTER", "SLOTS",
                                                           timeout=ASK_TIMEOUT)
                except Exception:
                    continue
                self._apply(Topology.from_cluster_slots(reply, primary.commands.url))
                return
        last: Exception | None = None
        urls = {**self._nodes, **{address_of(seed): seed for seed in self._seeds}}
        for url in urls.values():
            if not self._running:
                return
            self._reading = read_topology(self._reactor, url, ASK_TIMEOUT)
            try:
                topology = yield self._reading
            except Exception as error:
                last = error
                continue
            finally:
                self._reading = None
            if topology.clustered and any(seed.db for seed in self._seeds):
                raise ShardsRefused(f"{url} is a Redis Cluster, which has only database 0: "
                                    "drop the /DB from --engine")
            self._apply(topology)
            return
        raise last or RedisNotSent("no Redis to ask")

    def _apply(self, topology: Topology) -> None:
        """Take a slot map: connect to new primaries, close those that own nothing now,
        move each subscription to its slot's owner."""
        before = self.primaries() if self._known else None
        self.clustered = topology.clustered
        self._owners = list(topology.owners)
        self._nodes = topology.urls
        self._known = True
        for address in set(self._owners):
            if address is not None and address not in self._primaries:
                self._primary(address, topology.urls[address])
        owning = set(self._owners)
        for address, primary in list(self._primaries.items()):
            if address not in owning:
                del self._primaries[address]
                primary.stop()
        if before != self.primaries() and self.clustered:  # (one server: the start line says it)
            log.info("redis {name}: a cluster of {primaries}", name=self._name,
                     primaries=", ".join(self.primaries()))
        self._last_complaint = ""
        for channel in list(self._subscriptions):
            self._place(channel)
